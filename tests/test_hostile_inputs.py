"""Hostile files and arguments: every one is an InputError naming what is wrong, never a hang or a crash."""

import json
import os
import signal
import stat
import struct
import threading

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st
from safetensors.torch import save_file

import kfca_llm
from kfca_llm import InputError, SignPacker
from kfca_llm import checkpoints
from kfca_llm.checkpoints import check_same_tensors, open_adapter
from kfca_llm.cli import main


def _raw_file(path, header: bytes, data: bytes = b""):
    path.write_bytes(struct.pack("<Q", len(header)) + header + data)
    return path


def _three(tmp_path, n=64):
    g = torch.Generator().manual_seed(0)
    paths = []
    for c in "abc":
        path = tmp_path / f"{c}.safetensors"
        save_file({"w": torch.randn(n, generator=g)}, str(path))
        paths.append(path)
    return paths


def test_fifo_is_refused_without_opening_it(tmp_path):
    fifo = tmp_path / "fifo.safetensors"
    os.mkfifo(fifo)
    paths = _three(tmp_path)
    result = {}

    def score():
        try:
            kfca_llm.score_checkpoints(paths[:2] + [fifo])
        except InputError as exc:
            result["error"] = str(exc)

    worker = threading.Thread(target=score, daemon=True)
    worker.start()
    worker.join(timeout=20)
    if worker.is_alive():  # unblock the reader so the test process can exit, then fail
        with open(fifo, "wb"):
            pass
        pytest.fail("score_checkpoints blocked on a FIFO")
    assert "is not a regular file" in result["error"] and "'fifo'" in result["error"]


def test_many_tensors_validate_linearly(tmp_path, monkeypatch):
    n = 30_000
    header, offset = {}, 0
    for k in range(n):
        header[f"t{k:05d}"] = {"dtype": "F32", "shape": [1], "data_offsets": [offset, offset + 4]}
        offset += 4
    files = [open_adapter(_raw_file(tmp_path / f"{c}.safetensors", json.dumps(header).encode(), bytes(offset)), c)
             for c in "ab"]
    assert len(check_same_tensors(files, None)) == n
    monkeypatch.setattr(checkpoints, "MAX_TENSORS", 10)
    too_many = {f"t{k}": {"dtype": "F32", "shape": [0], "data_offsets": [0, 0]} for k in range(11)}
    with pytest.raises(InputError, match="11 tensors, more than 10"):
        open_adapter(_raw_file(tmp_path / "big.safetensors", json.dumps(too_many).encode()), "big")


@pytest.mark.parametrize("header", [b"[" * 100_000 + b"]" * 100_000, b'{"w": ' + b"9" * 5000 + b"}"],
                         ids=["deep-nesting", "huge-integer"])
def test_pathological_json_is_an_input_error(tmp_path, header):
    with pytest.raises(InputError, match="client 'x'.*header"):
        open_adapter(_raw_file(tmp_path / "x.safetensors", header), "x")


def test_nan_in_reference_names_the_reference(tmp_path):
    paths = _three(tmp_path)
    ref = tmp_path / "ref.safetensors"
    save_file({"w": torch.full((64,), float("nan"))}, str(ref))
    with pytest.raises(InputError, match="client '<reference>', tensor 'w'"):
        kfca_llm.score_checkpoints(paths, reference=ref)


def test_colliding_client_ids_are_refused():
    a, b, c = torch.randn(64), torch.randn(64), torch.randn(64)
    with pytest.raises(InputError, match="collide"):
        kfca_llm.score_updates({1: a, "1": b, 2: c})
    with pytest.raises(InputError, match="collide"):
        kfca_llm.score_labels({1: np.zeros(9, int), "1": np.ones(9, int), 2: np.ones(9, int)}, num_labels=2)
    with pytest.raises(InputError, match="collide"):
        kfca_llm.score_checkpoints({1: "a", "1": "b"})


GOOD = {"a": {"w": torch.randn(64)}, "b": {"w": torch.randn(64)}}


@pytest.mark.parametrize("update, message", [
    ({"w": [1.0, 2.0]}, "client 'c', tensor 'w': expected a tensor"),
    ({"w": None}, "client 'c', tensor 'w': expected a tensor"),
    ({"w": torch.randn(64).to_sparse()}, "client 'c', tensor 'w': expected a dense tensor"),
    ({"w": torch.empty(64, device="meta")}, "client 'c', tensor 'w': expected a dense tensor"),
    ({"w": np.random.rand(64).astype(">f4")}, "client 'c', tensor 'w': dtype >f4 is not supported"),
    ({"w": np.random.rand(64).astype(np.longdouble)}, "client 'c', tensor 'w': dtype float128 is not supported"),
    ({"w": torch.randn(64).to(torch.float8_e4m3fn)}, "client 'c', tensor 'w': dtype torch.float8_e4m3fn"),
])
def test_bad_tensors_name_client_and_tensor(update, message):
    with pytest.raises(InputError, match=message.replace("(", r"\(").replace(")", r"\)")):
        kfca_llm.score_updates(GOOD | {"c": update})


def test_mixed_tensor_names():
    with pytest.raises(InputError, match="tensor names must be strings"):
        kfca_llm.score_updates({c: {"w": torch.randn(4), 1: torch.randn(4)} for c in "abc"})


@pytest.mark.parametrize("kwargs, message", [
    ({"pairs": [("a", "b", "c")]}, "each pair must be"),
    ({"pairs": ["ab"]}, "each pair must be"),
    ({"bonus_fraction": "abc"}, "bonus_fraction must be a number"),
    ({"bonus_fraction": "0.5"}, "bonus_fraction must be a number"),
    ({"bonus_fraction": None}, "bonus_fraction must be a number"),
])
def test_bad_scoring_arguments(kwargs, message):
    with pytest.raises(InputError, match=message):
        kfca_llm.score_updates(GOOD | {"c": {"w": torch.randn(64)}}, **kwargs)


@pytest.mark.parametrize("shape", [(-4,), (4.7,), ("4",), (True,), "4"])
def test_packer_refuses_bad_shapes(shape):
    with pytest.raises(InputError, match="shape must be a sequence of positive integers"):
        SignPacker({"w": shape}, ["a", "b"])


def test_packer_refuses_a_string_of_clients_and_a_bad_device():
    with pytest.raises(InputError, match="clients must be a list"):
        SignPacker({"w": (4,)}, "abc")
    with pytest.raises(InputError, match="device 'foo'"):
        SignPacker({"w": (4,)}, ["a", "b"], device="foo")


def test_score_checkpoints_refuses_a_single_string(tmp_path):
    with pytest.raises(InputError, match="paths must be a list"):
        kfca_llm.score_checkpoints(str(tmp_path))


def test_label_counts_that_cannot_fit_are_refused():
    labels = {c: np.zeros(10, dtype=int) for c in "abc"}
    with pytest.raises(InputError, match="num_labels 30000 is above"):
        kfca_llm.score_labels(labels, num_labels=30_000)


def test_json_output_must_be_a_regular_file(tmp_path, capsys):
    paths = [str(p) for p in _three(tmp_path)]
    target = tmp_path / "dir"
    target.mkdir()
    assert main(["score", *paths, "--json", str(target)]) == 2
    captured = capsys.readouterr()
    assert "not a regular file" in captured.err and captured.out == ""  # refused before scoring
    if os.path.exists("/dev/null"):
        assert main(["score", *paths, "--json", "/dev/null"]) == 2
        assert stat.S_ISCHR(os.stat("/dev/null").st_mode)


def test_json_output_follows_the_umask(tmp_path):
    paths = [str(p) for p in _three(tmp_path)]
    old = os.umask(0o022)
    try:
        assert main(["score", *paths, "--json", str(tmp_path / "r.json")]) == 0
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(tmp_path / "r.json").st_mode) == 0o644


def test_client_names_are_printed_literally():
    names = ["[bold]alice", "[/bold]", "eve\n│ 1 │ fake row", "\x1b[31mred"]
    report = kfca_llm.score_updates({n: torch.randn(256) for n in names})
    table = report.table()
    assert "[bold]alice" in table and "[/bold]" in table
    assert "eve\\n│ 1 │ fake row" in table and "\x1b" not in table and "\\x1b[31mred" in table


def test_cli_expected_conditions_exit_2_with_one_line(tmp_path, capsys):
    paths = [str(p) for p in _three(tmp_path)]
    from kfca_llm.engine import register_backend
    from kfca_llm.errors import BackendUnavailable

    def unavailable():
        raise BackendUnavailable("triton needs a CUDA GPU\n(none found)")

    previous = register_backend("triton", unavailable)
    try:
        assert main(["score", *paths, "--backend", "triton"]) == 2
    finally:
        register_backend("triton", previous)
    err = capsys.readouterr().err
    assert err == "kfca-llm: error: triton needs a CUDA GPU (none found)\n"


# --- property-based: random and mutated safetensors files ------------------------------------------

def _valid_file_bytes(n_tensors: int, seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    header, data = {}, b""
    for k in range(n_tensors):
        values = rng.standard_normal(17 + 5 * k).astype(np.float32)  # shapes shared, values per seed
        header[f"t{k}"] = {"dtype": "F32", "shape": [values.size], "data_offsets": [len(data), len(data) + values.nbytes]}
        data += values.tobytes()
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw + data


@st.composite
def mutated_files(draw):
    base = bytearray(_valid_file_bytes(draw(st.sampled_from([2, 2, 1, 3])), draw(st.integers(2, 5))))
    for _ in range(draw(st.integers(0, 4))):
        kind = draw(st.sampled_from(["flip", "truncate", "insert", "header-json"]))
        if kind == "flip" and base:
            i = draw(st.integers(0, len(base) - 1))
            base[i] = draw(st.integers(0, 255))
        elif kind == "truncate":
            del base[draw(st.integers(0, len(base))):]
        elif kind == "insert":
            i = draw(st.integers(0, len(base)))
            base[i:i] = draw(st.binary(max_size=16))
        else:
            header = draw(st.recursive(
                st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.text(max_size=8) | st.floats(),
                lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
                max_leaves=8))
            raw = json.dumps(header).encode()
            base = bytearray(struct.pack("<Q", len(raw)) + raw + bytes(draw(st.integers(0, 64))))
    return bytes(base)


@settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(mutated_files())
def test_mutated_files_give_an_input_error_or_a_result(tmp_path_factory, payload):
    folder = tmp_path_factory.mktemp("fuzz")
    paths = []
    for k in range(2):
        path = folder / f"ok{k}.safetensors"
        path.write_bytes(_valid_file_bytes(2, k))
        paths.append(path)
    (folder / "fuzz.safetensors").write_bytes(payload)

    def hang(signum, frame):  # a hang guard (a generous minute per file), not a speed claim
        raise TimeoutError("score_checkpoints hung on a mutated file")

    previous = signal.signal(signal.SIGALRM, hang)
    signal.alarm(60)
    try:
        report = kfca_llm.score_checkpoints(paths + [folder / "fuzz.safetensors"])
    except InputError:
        pass
    else:
        assert set(report.rewards) == {"ok0", "ok1", "fuzz"}
        assert all(np.isfinite(v) for v in report.rewards.values())
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
