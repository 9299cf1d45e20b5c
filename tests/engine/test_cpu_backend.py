"""The CPU backend ("cpu": the numba kernels) against the numpy references, word for word."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import counter_words

from kfca_llm.engine import get_backend
from kfca_llm.engine.layout import Layout
from kfca_llm.kernels.pair_counts.reference import binary_gram
from kfca_llm.kernels.sampled_penalty.reference import sampled_matches
from kfca_llm.kernels.sign_pack.reference import pack_signs

DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float64]


def _random_state_dicts(rng: np.random.Generator, shapes: dict, n: int, dtype, zero_tensors=()):
    out = []
    shared = {k: rng.standard_normal(s) for k, s in shapes.items()}
    for _ in range(n):
        sd = {}
        for k, s in shapes.items():
            values = shared[k] + rng.standard_normal(s)
            values[rng.random(s) < 0.05] = 0.0  # scattered exact zeros
            t = torch.from_numpy(values).to(dtype)
            flat = t.view(-1)
            if flat.numel() >= 2:
                flat[0], flat[1] = 0.0, -0.0
            if k in zero_tensors:
                t = torch.zeros_like(t) * -1.0  # -0.0 everywhere: still structurally zero
            sd[k] = t
        out.append(sd)
    return out


def _reference_words(layout: Layout, state_dicts):
    signs = np.zeros((len(state_dicts), layout.n_words), dtype=np.int32)
    task = np.zeros(layout.n_words, dtype=np.int32)
    for i, sd in enumerate(state_dicts):
        for slot in layout.slots:
            s, nz = pack_signs(sd[slot.name].double().numpy())
            span = slice(slot.word_offset, slot.word_offset + slot.n_words)
            signs[i, span] = s
            task[span] |= nz
    return signs, task


def _pack(layout, state_dicts):
    backend = get_backend("cpu")
    buffers = backend.allocate(len(state_dicts), layout)
    for i, sd in enumerate(state_dicts):
        for k, slot in enumerate(layout.slots):
            backend.pack(buffers, i, k, sd[slot.name])
    return backend, buffers


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n_clients", [2, 5, 17])
def test_pack_and_counts_match_reference(dtype, n_clients):
    rng = np.random.default_rng([n_clients, DTYPES.index(dtype)])
    shapes = {"a.lora_A": (1,), "b.lora_B": (31,), "c": (33,), "d": (7, 9), "e": (32,), "zero": (40,), "f": (1000, 3)}
    sds = _random_state_dicts(rng, shapes, n_clients, dtype, zero_tensors=("zero",))
    layout = Layout.from_shapes(shapes)
    backend, buffers = _pack(layout, sds)
    ref_signs, ref_task = _reference_words(layout, sds)
    signs, task = backend.host_words(buffers)
    np.testing.assert_array_equal(signs, ref_signs)
    np.testing.assert_array_equal(task, ref_task)
    zero = layout.slot("zero")
    assert not task[zero.word_offset: zero.word_offset + zero.n_words].any()
    for seed, fraction in [(0, 0.5), (12345, 0.3), (2**32 - 1, 0.7)]:
        counts = backend.round_counts(buffers, seed, fraction)
        gram, sizes = binary_gram(ref_signs, ref_task, seed, fraction)
        np.testing.assert_array_equal(counts.gram, gram)
        np.testing.assert_array_equal(counts.sizes, sizes)
        pairs = np.array([(i, j) for i in range(n_clients) for j in range(n_clients) if i != j][:12])
        np.testing.assert_array_equal(backend.sampled_matches(buffers, seed, fraction, pairs),
                                      sampled_matches(ref_signs, ref_task, seed, fraction, pairs))


def test_large_odd_tensor_matches_reference():
    rng = np.random.default_rng(7)
    values = torch.from_numpy(rng.standard_normal((3, 1_000_003)).astype(np.float32))
    layout = Layout.from_shapes({"w": (1_000_003,)})
    backend, buffers = _pack(layout, [{"w": v} for v in values])
    ref_signs, ref_task = _reference_words(layout, [{"w": v} for v in values])
    signs, task = backend.host_words(buffers)
    np.testing.assert_array_equal(signs, ref_signs)
    np.testing.assert_array_equal(task, ref_task)
    counts = backend.round_counts(buffers, 3, 0.5)
    np.testing.assert_array_equal(counts.gram, binary_gram(ref_signs, ref_task, 3, 0.5)[0])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_nonfinite_flagged_for_the_right_tensor(dtype, bad):
    rng = np.random.default_rng(1)
    shapes = {"a": (70,), "b": (5, 13)}
    sds = _random_state_dicts(rng, shapes, 3, dtype)
    sds[2]["b"][4, 12] = bad  # last element: the scalar tail path
    sds[1]["a"][3] = bad  # inside a full word: the vector path
    backend, buffers = _pack(Layout.from_shapes(shapes), sds)
    flags = backend.nonfinite(buffers)
    assert flags.tolist() == [[False, False], [True, False], [False, True]]


def test_packing_overwrites_poisoned_words_and_only_its_own_range():
    rng = np.random.default_rng(2)
    shapes = {"a": (45,), "b": (64,), "c": (3,)}
    layout = Layout.from_shapes(shapes)
    backend = get_backend("cpu")
    buffers = backend.allocate(2, layout)
    poison = np.int32(0x5A5A5A5A)
    signs, _ = backend.host_words(buffers)  # a view of the buffer
    signs[:] = poison
    sd = {k: torch.from_numpy(rng.standard_normal(s).astype(np.float32)) for k, s in shapes.items()}
    backend.pack(buffers, 0, 1, sd["b"])
    b = layout.slot("b")
    ref, _ = pack_signs(sd["b"].numpy())
    np.testing.assert_array_equal(signs[0, b.word_offset: b.word_offset + b.n_words], ref)
    untouched = np.ones(layout.n_words, dtype=bool)
    untouched[b.word_offset: b.word_offset + b.n_words] = False
    assert (signs[0, untouched] == poison).all() and (signs[1] == poison).all()


def test_noncontiguous_tensor_packs_like_its_contiguous_copy():
    rng = np.random.default_rng(3)
    base = torch.from_numpy(rng.standard_normal((40, 24)).astype(np.float32))
    transposed = base.t()
    layout = Layout.from_shapes({"w": (24, 40)})
    backend, b1 = _pack(layout, [{"w": transposed}, {"w": transposed.contiguous()}])
    signs, _ = backend.host_words(b1)
    np.testing.assert_array_equal(signs[0], signs[1])
    ref, _ = pack_signs(transposed.contiguous().numpy())
    np.testing.assert_array_equal(signs[0], ref)


def test_negative_nan_packs_exactly_like_x_less_than_zero():
    values = torch.tensor([-float("nan"), float("nan"), -0.0, -1.0, float("-inf")] * 8, dtype=torch.float32)
    backend, buffers = _pack(Layout.from_shapes({"w": (40,)}), [{"w": values}, {"w": values}])
    ref_signs, ref_task = _reference_words(Layout.from_shapes({"w": (40,)}), [{"w": values}] * 2)
    signs, task = backend.host_words(buffers)
    np.testing.assert_array_equal(signs, ref_signs)
    np.testing.assert_array_equal(task, ref_task)


def test_fused_pack_many_equals_reference_with_mixed_dtypes_and_flags():
    """pack_many groups tensors by float format into one pass; words and flags must not change."""
    rng = np.random.default_rng(9)
    shapes = {"a": (1,), "b": (31,), "c": (4097 * 32 + 5,), "d": (7, 9), "e": (64,), "f": (3, 1000)}
    dtypes = {"a": torch.float32, "b": torch.bfloat16, "c": torch.float32, "d": torch.float16,
              "e": torch.bfloat16, "f": torch.float32}
    layout = Layout.from_shapes(shapes)
    sds = [{k: torch.from_numpy(rng.standard_normal(s)).to(dtypes[k]) for k, s in shapes.items()} for _ in range(3)]
    sds[1]["c"][-1] = float("nan")  # last, partial word of a multi-block tensor
    sds[2]["e"][0] = float("inf")
    backend = get_backend("cpu")
    buffers = backend.allocate(3, layout)
    for i, sd in enumerate(sds):
        backend.pack_many(buffers, i, [(k, sd[slot.name]) for k, slot in enumerate(layout.slots)])
    ref_signs, ref_task = _reference_words(layout, sds)
    signs, task = backend.host_words(buffers)
    np.testing.assert_array_equal(signs, ref_signs)
    np.testing.assert_array_equal(task, ref_task)
    flagged = {(i, layout.slots[k].name) for i, k in np.argwhere(backend.nonfinite(buffers))}
    assert flagged == {(1, "c"), (2, "e")}


def _buffers_holding(signs, task):
    n_clients, n_words = signs.shape
    backend = get_backend("cpu")
    buffers = backend.allocate(n_clients, Layout.from_shapes({"w": (n_words * 32,)}))
    buffers.signs[:, :n_words] = signs
    buffers.task[:n_words] = task
    return backend, buffers


def test_counting_only_the_scored_pairs_leaves_their_counts_unchanged():
    backend, buffers = _buffers_holding(*counter_words(7, 1500))
    full = backend.round_counts(buffers, 1, 0.5)
    pairs = np.array([(0, 3), (5, 2), (6, 0)])
    part = backend.round_counts(buffers, 1, 0.5, pairs)
    for i, j in [(0, 3), (3, 0), (5, 2), (2, 5), (6, 0)] + [(k, k) for k in range(7)]:
        np.testing.assert_array_equal(part.gram[:, i, j], full.gram[:, i, j])
    np.testing.assert_array_equal(part.sizes, full.sizes)
    assert not part.gram[:, 1, 4].any() and full.gram[:, 1, 4].any()  # unscored: skipped


def test_multi_threaded_fused_pack_matches_reference():
    """Several tensors past the single-threaded size: the parallel build of the packing kernel."""
    rng = np.random.default_rng(11)
    shapes = {"a": (400_001,), "b": (1000, 700), "c": (5,)}
    sds = _random_state_dicts(rng, shapes, 2, torch.float32)
    layout = Layout.from_shapes(shapes)
    assert layout.n_words >= 1 << 15
    backend = get_backend("cpu")
    buffers = backend.allocate(2, layout)
    for i, sd in enumerate(sds):
        backend.pack_many(buffers, i, [(k, sd[slot.name]) for k, slot in enumerate(layout.slots)])
    signs, task = backend.host_words(buffers)
    ref_signs, ref_task = _reference_words(layout, sds)
    np.testing.assert_array_equal(signs, ref_signs)
    np.testing.assert_array_equal(task, ref_task)


def test_pack_clients_in_one_pass_equals_reference_with_mixed_dtypes_and_flags():
    """All clients in one launch (blocks span every client of a tensor): same words and flags as the
    reference, with clients sending one tensor in different dtypes and NaN/Inf in a middle block and a tail."""
    rng = np.random.default_rng(12)
    shapes = {"a": (3 * 4096 * 32 + 17,), "b": (31,), "c": (700, 1000), "d": (64,)}
    layout = Layout.from_shapes(shapes)
    assert layout.n_words >= 1 << 15  # the parallel build
    sds = _random_state_dicts(rng, shapes, 4, torch.float32)
    sds[1]["c"] = sds[1]["c"].to(torch.bfloat16)
    sds[2]["d"] = sds[2]["d"].to(torch.float16)
    sds[3]["a"] = sds[3]["a"].double()
    sds[0]["a"][5 * 4096 * 32 // 4] = float("inf")  # inside the second block of "a"
    sds[2]["a"][-1] = float("nan")  # the partial last word
    backend = get_backend("cpu")
    buffers = backend.allocate(4, layout)
    backend.pack_clients(buffers, [(i, k, sd[slot.name]) for i, sd in enumerate(sds)
                                   for k, slot in enumerate(layout.slots)])
    signs, task = backend.host_words(buffers)
    ref_signs, ref_task = _reference_words(layout, sds)
    np.testing.assert_array_equal(signs, ref_signs)
    np.testing.assert_array_equal(task, ref_task)
    flagged = {(i, layout.slots[k].name) for i, k in np.argwhere(backend.nonfinite(buffers))}
    assert flagged == {(0, "a"), (2, "a")}


