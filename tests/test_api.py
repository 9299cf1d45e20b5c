"""Public API: score_updates, score_checkpoints, score_labels, the score CLI, reports."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

import kfca_llm
from kfca_llm import InputError, score_checkpoints, score_labels, score_updates
from kfca_llm.cli import main
from kfca_llm.mechanism import kfca_score_matrix, mtpp_payment
from kfca_llm.report import write_atomic

SHAPES = {"layers.0.q_proj.lora_A.weight": (16, 256), "layers.0.q_proj.lora_B.weight": (256, 16),
          "layers.1.v_proj.lora_A.weight": (16, 256), "layers.1.v_proj.lora_B.weight": (256, 16)}


def _federation(seed: int, n_honest: int = 4, noise: float = 0.5, dtype=torch.float32, zero_fraction: float = 0.0):
    """Honest clients = shared signal + private noise; plus a flipper and a zero client."""
    g = torch.Generator().manual_seed(seed)
    signal = {k: torch.randn(s, generator=g) for k, s in SHAPES.items()}
    updates = {f"honest{i}": {k: (v + noise * torch.randn(v.shape, generator=g)).to(dtype) for k, v in signal.items()}
               for i in range(n_honest)}
    if zero_fraction:
        structural = {k: torch.rand(v.shape, generator=g) < zero_fraction for k, v in signal.items()}
        for sd in updates.values():
            for k in sd:
                sd[k][structural[k]] = 0.0
    updates["flip"] = {k: -v for k, v in updates["honest0"].items()}
    updates["zero"] = {k: torch.zeros_like(v) for k, v in updates["honest0"].items()}
    return updates


def _noise_bound(report) -> float:
    """5 standard errors of a payment: bonus mean over |M_b| tasks plus the penalty estimate."""
    t = report.tasks
    return 5 * (0.5 / math.sqrt(t["bonus"]) + 0.5 / math.sqrt(min(t["penalty_1"], t["penalty_2"])))


def test_honest_beats_free_riders_and_flipper_is_negative():
    report = score_updates(_federation(0))
    honest = [report.rewards[f"honest{i}"] for i in range(1, 4)]
    bound = _noise_bound(report)
    assert min(honest) > bound
    assert abs(report.rewards["zero"]) < bound
    assert report.rewards["flip"] < -0.1
    assert report.ranking()[-1][0] == "flip"


def test_zero_policy_structural_zeros_are_not_tasks():
    report = score_updates(_federation(1, zero_fraction=0.5))
    n_coords = sum(math.prod(s) for s in SHAPES.values())
    assert report.tasks["coordinates"] == n_coords
    # about half the coordinates are zero in every update and so are not tasks
    assert 0.4 * n_coords < report.tasks["tasks"] < 0.6 * n_coords
    bound = _noise_bound(report)
    assert report.rewards["flip"] < -0.1 and abs(report.rewards["zero"]) < bound
    # what the policy prevents: counting the zeros as tasks hands everyone free agreement
    ups = _federation(1, zero_fraction=0.5)
    flat = {c: torch.cat([t.reshape(-1) for _, t in sorted(sd.items())]) for c, sd in ups.items()}
    neg = {c: (v < 0).numpy().astype(np.int64) for c, v in flat.items()}
    all_coords_as_tasks = mtpp_payment(neg["flip"], neg["honest0"], kfca_score_matrix(2))
    assert all_coords_as_tasks > report.pairwise[("flip", "honest0")] + 0.1


def test_deterministic_and_independent_of_client_order():
    ups = _federation(2)
    a = score_updates(ups, seed=9, peers=2, penalty="sampled")
    b = score_updates(dict(reversed(list(ups.items()))), seed=9, peers=2, penalty="sampled")
    assert json.dumps(a.to_dict()) == json.dumps(b.to_dict())
    c = score_updates(ups, seed=10, peers=2, penalty="sampled")
    assert c.pairwise != a.pairwise


@pytest.mark.parametrize("penalty", ["expected", "sampled"])
def test_pairwise_payment_equals_the_mechanism_library(penalty):
    """One flat tensor per client: coordinate k is task k of the categorical mechanism."""
    rng = np.random.default_rng(4)
    truth = rng.standard_normal(4000)
    ups = {f"c{i}": truth + rng.standard_normal(4000) for i in range(3)}
    report = score_updates(ups, seed=5, penalty=penalty)
    clients = sorted(ups)
    for i, a in enumerate(clients):
        for j, b in enumerate(clients):
            if i != j:
                r1, r2 = (ups[a] < 0).astype(np.int64), (ups[b] < 0).astype(np.int64)
                expected = mtpp_payment(r1, r2, kfca_score_matrix(2), seed=5, penalty=penalty, pair=(i, j))
                assert report.pairwise[(a, b)] == expected


def test_peers_sampling_and_explicit_pairs():
    ups = _federation(3, n_honest=6)
    report = score_updates(ups, peers=3, seed=1)
    assert all(len(p) == 3 and c not in p for c, p in report.peers.items())
    assert len(report.rewards) == len(ups)
    assert score_updates(ups, peers=3, seed=2).peers != report.peers
    pairs = [("flip", "honest1"), ("zero", "honest1")]
    only = score_updates(ups, pairs=pairs)
    assert list(only.pairwise) == pairs and set(only.rewards) == {"flip", "zero"}


def test_flat_tensors_numpy_arrays_and_low_precision_dtypes():
    rng = np.random.default_rng(5)
    base = rng.standard_normal(999)
    ups = {"a": torch.from_numpy(base + rng.standard_normal(999)).bfloat16(),
           "b": (base + rng.standard_normal(999)).astype(np.float16),
           "c": torch.from_numpy(base + rng.standard_normal(999)).reshape(27, 37)}
    report = score_updates(ups)
    assert report.tasks["coordinates"] == 999 and all(v > 0 for v in report.rewards.values())


def _expect_error(match, **kwargs):
    def run(updates):
        with pytest.raises(InputError, match=match):
            score_updates(updates, **kwargs)
    return run


def test_bad_inputs_name_client_and_tensor():
    ups = _federation(6)
    name = "layers.1.v_proj.lora_B.weight"
    _expect_error("at least two")({"a": ups["honest0"]})
    missing = dict(ups, honest2={k: v for k, v in ups["honest2"].items() if k != name})
    _expect_error(f"client 'honest2', tensor '{name}': tensor missing")(missing)
    extra = dict(ups, honest3={**ups["honest3"], "extra": torch.ones(3)})
    _expect_error("client 'honest3', tensor 'extra': unexpected tensor")(extra)
    shape = dict(ups, honest1={**ups["honest1"], name: torch.ones(16, 256)})
    _expect_error(f"client 'honest1', tensor '{name}': shape")(shape)
    ints = dict(ups, honest1={**ups["honest1"], name: torch.ones(256, 16, dtype=torch.int32)})
    _expect_error(f"client 'honest1', tensor '{name}': dtype")(ints)
    for bad in (float("nan"), float("inf")):
        poisoned = {k: v.clone() for k, v in ups["honest2"].items()}
        poisoned[name][3, 1] = bad
        _expect_error(f"client 'honest2', tensor '{name}': update holds NaN or Inf")(dict(ups, honest2=poisoned))
    with pytest.raises(InputError, match="peers must be"):
        score_updates(ups, peers=len(ups))
    with pytest.raises(InputError, match="empty update"):
        score_updates(dict(ups, honest0={}))
    with pytest.raises(InputError, match="penalty must be"):
        score_updates(ups, penalty="median")
    with pytest.raises(InputError, match="seed"):
        score_updates(ups, seed=-1)
    with pytest.raises(InputError, match="bonus_fraction"):
        score_updates(ups, bonus_fraction=1.0)
    with pytest.raises(InputError, match="unknown backend"):
        score_updates(ups, backend="tpu")
    with pytest.raises(InputError, match="too few informative"):
        score_updates({"a": torch.zeros(64), "b": torch.zeros(64)})
    with pytest.raises(ValueError):  # callers that catch ValueError catch bad input too
        score_updates(ups, seed=-1)


def _save_clients(tmp_path, updates, reference=None, as_peft_dir=True):
    paths = {}
    for client, sd in updates.items():
        tensors = {k: (v + reference[k]).contiguous() if reference else v.contiguous() for k, v in sd.items()}
        if as_peft_dir:
            (tmp_path / client).mkdir()
            save_file(tensors, str(tmp_path / client / "adapter_model.safetensors"))
            paths[client] = tmp_path / client
        else:
            save_file(tensors, str(tmp_path / f"{client}.safetensors"))
            paths[client] = tmp_path / f"{client}.safetensors"
    return paths


def test_checkpoints_with_reference_equal_scoring_the_updates(tmp_path):
    ups = _federation(7)
    g = torch.Generator().manual_seed(70)
    reference = {k: torch.randn(s, generator=g) for k, s in SHAPES.items()}
    save_file(reference, str(tmp_path / "global.safetensors"))
    (tmp_path / "clients").mkdir()
    # exact updates: the difference of the saved floats is what the client really changed
    paths = _save_clients(tmp_path / "clients", ups, reference)
    recovered = {c: {k: v + reference[k] - reference[k] for k, v in sd.items()} for c, sd in ups.items()}
    from_files = score_checkpoints(list(paths.values()), reference=tmp_path / "global.safetensors", seed=3)
    from_memory = score_updates(recovered, seed=3)
    assert from_files.pairwise == from_memory.pairwise
    assert from_files.rewards["flip"] < 0 < from_files.rewards["honest1"]


def test_checkpoint_files_without_reference_and_ids_from_file_names(tmp_path):
    ups = _federation(8)
    paths = _save_clients(tmp_path, ups, as_peft_dir=False)
    report = score_checkpoints(sorted(paths.values()))
    assert set(report.rewards) == set(ups)
    assert report.pairwise == score_updates(ups).pairwise


def test_untrusted_files_are_refused_with_clear_errors(tmp_path):
    ups = _federation(9, n_honest=2)
    paths = _save_clients(tmp_path, ups)
    pickled = tmp_path / "pickled"
    pickled.mkdir()
    (pickled / "adapter_model.bin").write_bytes(b"\x80\x04 not for unpickling")
    with pytest.raises(InputError, match="client 'pickled'.*pickled files are refused"):
        score_checkpoints({**paths, "pickled": pickled})
    garbage = tmp_path / "garbage.safetensors"
    garbage.write_bytes(b"\xff" * 64)
    with pytest.raises(InputError, match="client 'garbage'.*not a valid safetensors"):
        score_checkpoints({**paths, "garbage": garbage})
    with pytest.raises(InputError, match="client 'ghost'.*does not exist"):
        score_checkpoints({**paths, "ghost": tmp_path / "nope"})
    bad = {k: v.clone() for k, v in ups["honest1"].items()}
    name = "layers.0.q_proj.lora_A.weight"
    bad[name][0, 0] = float("nan")
    save_file(bad, str(tmp_path / "nan.safetensors"))
    with pytest.raises(InputError, match=f"client 'nan', tensor '{name}': update holds NaN or Inf"):
        score_checkpoints({**paths, "nan": tmp_path / "nan.safetensors"})
    save_file({name: torch.ones(3, 3)}, str(tmp_path / "small.safetensors"))
    with pytest.raises(InputError, match="client 'small'"):
        score_checkpoints({**paths, "small": tmp_path / "small.safetensors"})


def test_cli_score_prints_table_and_writes_json(tmp_path, capsys):
    ups = _federation(10)
    paths = _save_clients(tmp_path, ups)
    out = tmp_path / "out" / "report.json"
    assert main(["score", *map(str, paths.values()), "--seed", "4", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "KFCA rewards" in printed and "flip" in printed
    data = json.loads(out.read_text())
    assert data["seed"] == 4 and set(data["rewards"]) == set(ups)
    assert data["rewards"] == score_updates(ups, seed=4).rewards
    assert main(["score", str(paths["honest0"])]) == 2
    assert "at least two" in capsys.readouterr().err


def test_full_adapters_scored_without_a_reference_are_flagged_as_adapters_not_updates(tmp_path, capsys):
    """Adapters fine-tuned from one global adapter keep its signs almost everywhere: without the reference
    every client is a copy of every other (paid 0); the report says why and what to pass."""
    ups = {c: sd for c, sd in _federation(11).items() if c.startswith("honest")}
    g = torch.Generator().manual_seed(110)
    reference = {k: 20 * torch.randn(s, generator=g) for k, s in SHAPES.items()}
    save_file(reference, str(tmp_path / "global.safetensors"))
    (tmp_path / "clients").mkdir()
    paths = _save_clients(tmp_path / "clients", ups, reference)

    adapters = score_checkpoints(list(paths.values()))
    assert [set(g.clients) for g in adapters.duplicates] == [set(ups)]
    (warning,) = adapters.warnings
    assert "look like full adapters, not updates" in warning and "--reference GLOBAL" in warning
    assert "WARNING: all 4 inputs are copies of each other" in adapters.table()
    updates = score_checkpoints(list(paths.values()), reference=tmp_path / "global.safetensors")
    assert updates.warnings == () and updates.duplicates == () and min(updates.rewards.values()) > 0
    assert score_checkpoints(_save_clients(tmp_path, ups, as_peft_dir=False)).warnings == ()  # updates: no warning

    out = tmp_path / "report.json"
    assert main(["score", *map(str, paths.values()), "--json", str(out)]) == 0
    assert "kfca-llm: warning: all 4 inputs are copies of each other" in capsys.readouterr().err
    assert json.loads(out.read_text())["warnings"] == [warning]


def test_a_reference_from_another_round_is_named_as_the_likely_mistake(tmp_path, capsys):
    """Round 10's clients against round 1's global adapter: what the global moved in between is common to every
    client's difference, so all are copies of each other and paid 0; the warning points at the reference."""
    ups = {c: sd for c, sd in _federation(12).items() if c.startswith("honest")}
    g = torch.Generator().manual_seed(120)
    this_round = {k: 20 * torch.randn(s, generator=g) for k, s in SHAPES.items()}
    earlier_round = {k: v - 20 * torch.randn(v.shape, generator=g) for k, v in this_round.items()}
    save_file(earlier_round, str(tmp_path / "global-round-1.safetensors"))
    save_file(this_round, str(tmp_path / "global-round-10.safetensors"))
    paths = _save_clients(tmp_path, ups, this_round)

    assert score_checkpoints(list(paths.values()), reference=tmp_path / "global-round-10.safetensors").warnings == ()
    assert main(["score", *map(str, paths.values()), "--reference", str(tmp_path / "global-round-1.safetensors")]) == 0
    out, err = capsys.readouterr()
    assert "copies" in out and "kfca-llm: warning: all 4 inputs are copies of each other" in err
    assert "after subtracting the reference" in err and "another round's" in err


def test_cli_help_explains_the_mechanism(capsys):
    with pytest.raises(SystemExit):
        main(["score", "--help"])
    text = capsys.readouterr().out
    assert "sign of its update" in text and "penalty coordinates" in text


def test_score_labels_kfca_d_penalises_a_flipper():
    rng = np.random.default_rng(11)
    truth = rng.integers(0, 3, size=3000)

    def noisy():
        r = truth.copy()
        wrong = rng.random(truth.size) < 0.2
        r[wrong] = rng.integers(0, 3, size=wrong.sum())
        return r

    labels = {"a": noisy(), "b": noisy(), "c": noisy(), "perm": (noisy() + 1) % 3}
    report = score_labels(labels, num_labels=3, seed=2)
    assert report.delta.shape == (3, 3)
    assert report.rewards["perm"] < 0 < min(report.rewards[c] for c in "abc")
    assert report.pair_categorical_world[("a", "b")] and not report.pair_categorical_world[("a", "perm")]
    for c, peers in report.peers.items():
        assert len(peers) == 3
    with pytest.raises(InputError, match="client 'b'.*same tasks|same tasks"):
        score_labels({"a": truth, "b": truth[:-1]}, num_labels=3)
    with pytest.raises(InputError, match="client 'b'"):
        score_labels({"a": truth, "b": truth + 5}, num_labels=3)


def test_streaming_packer_equals_score_updates():
    ups = _federation(12)
    packer = kfca_llm.SignPacker({k: v.shape for k, v in ups["honest0"].items()}, list(ups))
    for name in SHAPES:  # tensor-major arrival, as from a network service
        for client in ups:
            packer.add(client, name, ups[client][name])
    with pytest.raises(InputError, match="already added"):
        packer.add("flip", name, ups["flip"][name])
    assert packer.score(seed=1).pairwise == score_updates(ups, seed=1).pairwise


def test_report_json_and_atomic_write(tmp_path):
    report = score_updates(_federation(13))
    data = report.to_dict()
    assert json.loads(json.dumps(data)) == data
    target = write_atomic(tmp_path / "r.json", json.dumps(data))
    assert json.loads(target.read_text())["rewards"] == report.rewards
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]


def _raw_safetensors(path, header: dict, data: bytes):
    blob = json.dumps(header).encode()
    path.write_bytes(len(blob).to_bytes(8, "little") + blob + data)
    return path


@pytest.mark.parametrize("header, data, message", [
    ({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 32]}}, bytes(16), "fall outside"),
    ({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 12]}}, bytes(16), "do not hold"),
    ({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
      "v": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}, bytes(16), "overlap"),
    ({"w": {"dtype": "F32", "shape": [-4], "data_offsets": [0, 16]}}, bytes(16), "non-negative"),
    ({"w": {"dtype": "Q4", "shape": [4], "data_offsets": [0, 16]}}, bytes(16), "unknown dtype"),
    ({"w": {"dtype": "I32", "shape": [4], "data_offsets": [0, 16]}}, bytes(16), "not a floating-point"),
    ({"w": [1, 2]}, bytes(16), "lacks dtype"),
    ({"__metadata__": {"format": "pt"}}, b"", "no tensors"),
])
def test_hostile_safetensors_headers_are_rejected(tmp_path, header, data, message):
    good = _save_clients(tmp_path, _federation(14, n_honest=2), as_peft_dir=False)
    hostile = _raw_safetensors(tmp_path / "hostile.safetensors", header, data)
    with pytest.raises(InputError, match=f"client 'hostile'.*{message}"):
        score_checkpoints({**good, "hostile": hostile})


def test_header_length_beyond_the_file_is_rejected(tmp_path):
    good = _save_clients(tmp_path, _federation(15, n_honest=2), as_peft_dir=False)
    liar = tmp_path / "liar.safetensors"
    liar.write_bytes((10**9).to_bytes(8, "little") + b"{}")
    with pytest.raises(InputError, match="client 'liar'.*header length"):
        score_checkpoints({**good, "liar": liar})
