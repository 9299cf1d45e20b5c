"""Whole updates in padded flat buffers (``FlatUpdate``, ``pack_flat``): the same words and flags as the reference and
as separate tensors, on both backends, whatever the padding holds; and the Triton backend's launch discipline."""

import pickle

import numpy as np
import pytest
import torch
from conftest import random_values

import kfca_llm
from kfca_llm import SignPacker
from kfca_llm.engine import Layout, get_backend
from kfca_llm.engine.layout import FlatUpdate
from kfca_llm.errors import BackendUnavailable, InputError
from kfca_llm.kernels.sign_pack.reference import pack_signs

SHAPES = {"a.lora_A": (3, 11), "b.lora_B": (33,), "c.bias": (1,), "d.lora_A": (31,), "e.lora_B": (32, 40),
          "f.zero": (7, 9), "g.lora_A": (129, 17), "h.big": (41, 1000)}
DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _flat_updates(rng, layout, n, dtype, padding=float("nan")):
    """n FlatUpdates with random values (+-0 mixed in), the padding between tensors filled with ``padding``."""
    updates = []
    for _ in range(n):
        update = FlatUpdate(layout, torch.full((layout.padded_numel,), padding, dtype=dtype))
        for name, view in update.items():
            view.copy_(random_values(rng, view.numel(), dtype).reshape(view.shape))
        if "f.zero" in update:
            update["f.zero"].copy_(torch.where(torch.from_numpy(rng.random((7, 9)) < 0.5), 0.0, -0.0))
        updates.append(update)
    return updates


def _words(backend_name, layout, pack, n_clients=4):
    backend = get_backend(backend_name)
    buffers = backend.allocate(n_clients, layout)
    pack(backend, buffers)
    signs, task = backend.host_words(buffers)
    return np.array(signs), np.array(task), backend.nonfinite(buffers)


@pytest.mark.parametrize("backend", ["cpu", "triton"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_flat_buffers_pack_like_separate_tensors_and_the_reference(backend, dtype, rng):
    layout = Layout.from_shapes(SHAPES)
    updates = _flat_updates(rng, layout, 4, dtype)
    updates[1]["h.big"][40, 999] = float("nan")  # in a partial last word
    updates[3]["e.lora_B"][2, 7] = float("-inf")  # in a whole word
    flat = _words(backend, layout, lambda b, buf: b.pack_flat(buf, [2, 0, 3, 1], [u.buffer for u in updates]))
    separate = _words(backend, layout, lambda b, buf: b.pack_clients(
        buf, [(row, k, u[s.name].clone()) for row, u in zip([2, 0, 3, 1], updates) for k, s in enumerate(layout.slots)]))
    for a, b in zip(flat, separate):
        np.testing.assert_array_equal(a, b)
    signs, task, nonfinite = flat
    expected_task = np.zeros_like(task)
    for row, update in zip([2, 0, 3, 1], updates):
        for slot in layout.slots:
            ref_signs, ref_nonzero = pack_signs(update[slot.name].double().numpy())
            np.testing.assert_array_equal(signs[row, slot.word_offset:slot.word_offset + slot.n_words], ref_signs)
            expected_task[slot.word_offset:slot.word_offset + slot.n_words] |= ref_nonzero
    np.testing.assert_array_equal(task, expected_task)
    expected = np.zeros_like(nonfinite)
    expected[0, layout.names.index("h.big")] = expected[1, layout.names.index("e.lora_B")] = True
    np.testing.assert_array_equal(nonfinite, expected)


def test_cpu_flat_pass_on_all_cores_matches_the_reference(rng):
    """Past 32,768 words the CPU kernel runs in parallel: flat buffers take it too."""
    layout = Layout.from_shapes({"w": (600_001,), "v": (3,)})
    updates = _flat_updates(rng, layout, 2, torch.float32)
    signs, task, _ = _words("cpu", layout, lambda b, buf: b.pack_flat(buf, [0, 1], [u.buffer for u in updates]))
    for row, update in enumerate(updates):
        for slot in layout.slots:
            np.testing.assert_array_equal(signs[row, slot.word_offset:slot.word_offset + slot.n_words],
                                          pack_signs(update[slot.name].double().numpy())[0])


@pytest.mark.parametrize("backend", ["cpu", "triton"])
def test_score_updates_of_flat_updates_equals_state_dicts_and_names_a_nonfinite_tensor(backend, rng):
    layout = Layout.from_shapes(SHAPES)
    updates = dict(zip("pqrs", _flat_updates(rng, layout, 4, torch.bfloat16, padding=-1.0)))
    as_dicts = {c: {k: v.clone() for k, v in u.items()} for c, u in updates.items()}
    for penalty in ("expected", "sampled"):
        a = kfca_llm.score_updates(updates, backend=backend, penalty=penalty, seed=5, peers=2)
        assert a.rewards == kfca_llm.score_updates(as_dicts, backend="cpu", penalty=penalty, seed=5, peers=2).rewards
    updates["r"]["d.lora_A"][30] = float("inf")
    with pytest.raises(InputError, match="client 'r', tensor 'd.lora_A'.*NaN or Inf"):
        kfca_llm.score_updates(updates, backend=backend)


def test_add_flat_validates_its_buffer_and_mixes_with_tensor_batches(rng):
    layout = Layout.from_shapes(SHAPES)
    updates = _flat_updates(rng, layout, 3, torch.float32)
    packer = SignPacker(layout, ["x", "y", "z"], backend="cpu")
    with pytest.raises(InputError, match=r"client 'x'.*shape \(%d,\)" % layout.padded_numel):
        packer.add_flat("x", updates[0].buffer[:-1])
    with pytest.raises(InputError, match="client 'x'.*dtype torch.int32"):
        packer.add_flat("x", updates[0].buffer.int())
    with pytest.raises(InputError, match="client 'x'.*layout differs"):
        packer.add_flat("x", FlatUpdate(Layout.from_shapes({"a.lora_A": (3, 11)}), torch.zeros(64)))
    with pytest.raises(InputError, match="unknown client"):
        packer.add_flat("w", updates[0].buffer)
    packer.add("x", "c.bias", updates[0]["c.bias"])
    with pytest.raises(InputError, match="client 'x'.*already added"):
        packer.add_flat("x", updates[0].buffer)
    packer.add_many("x", {k: v for k, v in updates[0].items() if k != "c.bias"})
    packer.add_flat("y", updates[1].buffer.numpy())  # a numpy buffer
    packer.add_many("z", updates[2])  # a FlatUpdate through add_many
    reference = SignPacker(layout, ["x", "y", "z"], backend="cpu")
    reference.add_clients({c: {k: v.clone() for k, v in u.items()} for c, u in zip("xyz", updates)})
    assert packer.score(seed=1).rewards == reference.score(seed=1).rewards


def test_flat_update_views_its_buffer_read_only_and_pickles():
    layout = Layout.from_shapes({"b": (2, 3), "a": (33,)})
    update = FlatUpdate(layout, layout.flat_buffer(torch.float64))
    torch.sub(torch.ones(2, 3), torch.full((2, 3), 3.0), out=update["b"])
    assert list(update) == ["a", "b"] and update.buffer[64:70].tolist() == [-2.0] * 6
    with pytest.raises(TypeError):
        update["a"] = torch.zeros(33)  # a read-only mapping: the views cannot be replaced
    copy = pickle.loads(pickle.dumps(update))
    assert torch.equal(copy["b"], update["b"]) and copy.layout.same_as(layout)
    flat = layout.flatten({"a": np.arange(33.0), "b": torch.ones(2, 3)}, torch.float32)
    assert flat["a"].tolist() == list(range(33)) and flat.buffer[33:64].abs().sum() == 0
    with pytest.raises(InputError, match="1-D tensor of 96"):
        FlatUpdate(layout, torch.zeros(95))


# ---- the Triton backend: launches per round, chunked streaming, alignment, mixed set-ups --------------------------


def _count_packs(monkeypatch):
    from kfca_llm.kernels.sign_pack import triton as triton_pack

    calls = []
    original = triton_pack.pack

    def counting(*args, **kwargs):
        calls.append(args[0])
        return original(*args, **kwargs)

    monkeypatch.setattr(triton_pack, "pack", counting)
    return calls


def test_a_round_is_one_pack_per_float_format_whatever_the_number_of_tensors(monkeypatch, rng):
    """One pack (a whole-word launch and a tail launch) per float format: flat updates and separate tensors."""
    layout = Layout.from_shapes(SHAPES)
    calls = _count_packs(monkeypatch)
    flats = _flat_updates(rng, layout, 3, torch.bfloat16) + _flat_updates(rng, layout, 2, torch.float32)
    kfca_llm.score_updates(dict(zip("abcde", flats)), backend="triton")
    assert sorted(map(str, calls)) == ["torch.bfloat16", "torch.float32"]
    calls.clear()
    mixed = {c: {k: v.clone().to(torch.float16 if k < "d" else torch.float32) for k, v in u.items()}
             for c, u in zip("abcde", flats)}
    kfca_llm.score_updates(mixed, backend="triton")
    assert sorted(map(str, calls)) == ["torch.float16", "torch.float32"]


@pytest.mark.parametrize("clients_per_chunk", [1, 2, 5])
def test_streamed_chunks_pack_like_one_launch(clients_per_chunk, monkeypatch, rng):
    from kfca_llm.engine import triton_backend

    layout = Layout.from_shapes(SHAPES)
    updates = _flat_updates(rng, layout, 5, torch.bfloat16)
    rows = [4, 1, 0, 3, 2]
    whole = _words("triton", layout, lambda b, buf: b.pack_flat(buf, rows, [u.buffer for u in updates]), 5)
    monkeypatch.setattr(triton_backend, "STAGING_BYTES", clients_per_chunk * layout.padded_numel * 2)
    calls = _count_packs(monkeypatch)
    streamed = _words("triton", layout, lambda b, buf: b.stream_flat(buf, rows, [u.buffer for u in updates]), 5)
    assert len(calls) == -(-5 // clients_per_chunk)
    for a, b in zip(whole, streamed):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("backend", ["cpu", "triton"])
def test_client_rows_outside_the_buffers_are_refused(backend, rng):
    layout = Layout.from_shapes({"w": (70,)})
    update = layout.flatten({"w": torch.ones(70)}, torch.float32)
    with pytest.raises(InputError, match=r"client indices must lie in \[0, 4\)"):
        _words(backend, layout, lambda b, buf: b.pack_flat(buf, [4], [update.buffer]))
    with pytest.raises(InputError, match=r"client indices must lie in \[0, 4\)"):
        _words(backend, layout, lambda b, buf: b.pack_clients(buf, [(-1, 0, update["w"])]))


def test_tensors_at_odd_addresses_are_copied_before_the_vector_loads(monkeypatch, rng):
    """The kernels load 16-byte vectors from every address (the interpreter does not care; a GPU does)."""
    from kfca_llm.kernels.sign_pack import triton as triton_pack

    tables = []
    original = triton_pack.pack

    def spying(dtype, plan, table, n_sources, *args, **kwargs):
        tables.append(table[n_sources:].cpu().numpy().copy())
        return original(dtype, plan, table, n_sources, *args, **kwargs)

    monkeypatch.setattr(triton_pack, "pack", spying)
    layout = Layout.from_shapes({"w": (70,), "v": (40,)})
    storage = random_values(rng, 1000, torch.float32)
    odd = {"w": storage[1:71], "v": storage[3:43]}  # 4 and 12 bytes past an aligned address
    assert odd["w"].data_ptr() % 16 and odd["v"].data_ptr() % 16
    even = {k: v.clone() for k, v in odd.items()}
    words = [_words("triton", layout, lambda b, buf, u=u: b.pack_clients(
        buf, [(0, k, u[s.name]) for k, s in enumerate(layout.slots)] + [(1, 0, even["v"]), (1, 1, even["w"])]))
        for u in (odd, even)]
    for a, b in zip(*words):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(words[0][0][0, :3], pack_signs(odd["v"].double().numpy())[0][:2].tolist()
                                  + pack_signs(odd["w"].double().numpy())[0][:1].tolist())
    assert len(tables) == 2 and all((t % 16 == 0).all() and (t != 0).all() for t in tables)


def test_kernels_refuse_tensors_on_the_other_kind_of_device():
    """Interpreted kernels take CPU tensors only (the interpreter would dereference a device address), compiled
    ones CUDA tensors only: one clear BackendUnavailable before anything runs."""
    from kfca_llm.kernels.intrinsics.triton import check_device, kernels_interpreted
    from kfca_llm.kernels.sign_pack.triton import sign_pack

    other = torch.device("meta") if kernels_interpreted() else torch.device("cpu")
    buffers = [torch.zeros(shape, dtype=torch.int32, device=other) for shape in ((2, 4), (4,), (2, 1))]
    with pytest.raises(BackendUnavailable, match="TRITON_INTERPRET"):
        sign_pack(torch.zeros(40, device=other), *buffers, client=0, tensor=0, word_offset=0)
    with pytest.raises(BackendUnavailable, match="TRITON_INTERPRET"):
        check_device(torch.device("cuda") if kernels_interpreted() else torch.device("cpu"))


def test_compiled_kernels_refuse_cpu_tensors_and_the_backend_refuses_a_device_it_cannot_use(tmp_path):
    """Without TRITON_INTERPRET the kernels are compiled ones: handed CPU tensors they refuse (no GPU needed to
    see it); the backend refuses CPU buffers for them, and (with CUDA) the interpreter refuses CUDA buffers."""
    import os
    import subprocess
    import sys

    code = (
        "import torch\n"
        "from kfca_llm.errors import BackendUnavailable\n"
        "from kfca_llm.kernels.sign_pack.triton import sign_pack\n"
        "from kfca_llm.kernels.pair_counts.triton import binary_gram\n"
        "for call in (lambda: sign_pack(torch.ones(40), torch.zeros(2, 4, dtype=torch.int32),\n"
        "                               torch.zeros(4, dtype=torch.int32), torch.zeros(2, 1, dtype=torch.int32),\n"
        "                               client=0, tensor=0, word_offset=0),\n"
        "             lambda: binary_gram(torch.zeros(2, 4, dtype=torch.int32), torch.zeros(4, dtype=torch.int32), 1, 2, 3)):\n"
        "    try:\n"
        "        call()\n"
        "    except BackendUnavailable as e:\n"
        "        print('REFUSED', e)\n"
        "from kfca_llm.engine.triton_backend import TritonBackend\n"
        "from kfca_llm.engine import Layout\n"
        "try:\n"
        "    TritonBackend().allocate(2, Layout.from_shapes({'w': (40,)}), device='cpu')\n"
        "except BackendUnavailable as e:\n"
        "    print('REFUSED', e)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    lines = out.splitlines()
    assert len(lines) == 3 and all(line.startswith("REFUSED") for line in lines), out
    assert all("need CUDA tensors" in line or "needs a CUDA device" in line for line in lines), out
    if torch.cuda.is_available():
        code = ("import torch\nfrom kfca_llm.engine.triton_backend import TritonBackend\n"
                "from kfca_llm.engine import Layout\nfrom kfca_llm.errors import BackendUnavailable\n"
                "try:\n    TritonBackend().allocate(2, Layout.from_shapes({'w': (40,)}), device='cuda')\n"
                "except BackendUnavailable as e:\n    print('REFUSED', e)\n")
        out = subprocess.run([sys.executable, "-c", code], env=dict(env, TRITON_INTERPRET="1"), capture_output=True,
                             text=True, check=True).stdout
        assert out.startswith("REFUSED") and "TRITON_INTERPRET=1" in out
