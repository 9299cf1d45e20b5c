"""The CPU backend ("numpy", numba kernels) against the plain-numpy reference, word for word."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from kfca_llm.engine import get_backend
from kfca_llm.engine import naive
from kfca_llm.engine.layout import Layout

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
            s, nz = naive.pack_signs(sd[slot.name].double().numpy())
            span = slice(slot.word_offset, slot.word_offset + slot.n_words)
            signs[i, span] = s
            task[span] |= nz
    return signs, task


def _pack(layout, state_dicts):
    backend = get_backend("numpy")
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
        expected = naive.round_counts(ref_signs, ref_task, seed, fraction)
        np.testing.assert_array_equal(counts.gram, expected.gram)
        np.testing.assert_array_equal(counts.sizes, expected.sizes)
        pairs = np.array([(i, j) for i in range(n_clients) for j in range(n_clients) if i != j][:12])
        np.testing.assert_array_equal(backend.sampled_matches(buffers, seed, fraction, pairs),
                                      naive.sampled_matches(ref_signs, ref_task, seed, fraction, pairs))


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
    expected = naive.round_counts(ref_signs, ref_task, 3, 0.5)
    np.testing.assert_array_equal(counts.gram, expected.gram)


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
    backend = get_backend("numpy")
    buffers = backend.allocate(2, layout)
    poison = np.int32(0x5A5A5A5A)
    signs, _ = backend.host_words(buffers)  # a view of the buffer
    signs[:] = poison
    sd = {k: torch.from_numpy(rng.standard_normal(s).astype(np.float32)) for k, s in shapes.items()}
    backend.pack(buffers, 0, 1, sd["b"])
    b = layout.slot("b")
    ref, _ = naive.pack_signs(sd["b"].numpy())
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
    ref, _ = naive.pack_signs(transposed.contiguous().numpy())
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
    backend = get_backend("numpy")
    buffers = backend.allocate(3, layout)
    for i, sd in enumerate(sds):
        backend.pack_many(buffers, i, [(k, sd[slot.name]) for k, slot in enumerate(layout.slots)])
    ref_signs, ref_task = _reference_words(layout, sds)
    signs, task = backend.host_words(buffers)
    np.testing.assert_array_equal(signs, ref_signs)
    np.testing.assert_array_equal(task, ref_task)
    flagged = {(i, layout.slots[k].name) for i, k in np.argwhere(backend.nonfinite(buffers))}
    assert flagged == {(1, "c"), (2, "e")}


def _counter_words(n_clients: int, n_words: int, sparse_task: bool = False):
    """Sign and task words from the partition hash itself (no library generator whose stream could change)."""
    from kfca_llm.partition import mix32

    index = np.arange(n_words, dtype=np.uint32)
    task = mix32(index ^ np.uint32(0x5678)) | mix32(index ^ np.uint32(0x9ABC))
    task[mix32(index ^ np.uint32(0x1111)) < np.uint32(2**32 // 10)] = 0
    if sparse_task:  # blocks of the compaction with fewer members than one 32-bit word
        task &= np.uint32(1) << (mix32(index) & np.uint32(31))
        task[mix32(index ^ np.uint32(0x2222)) > np.uint32(2**32 // 300)] = 0
    signs = mix32(np.arange(n_clients * n_words, dtype=np.uint32) ^ np.uint32(0x1234)).reshape(n_clients, n_words)
    return (signs & task).view(np.int32), task.view(np.int32)


def _buffers_holding(signs, task):
    n_clients, n_words = signs.shape
    backend = get_backend("numpy")
    buffers = backend.allocate(n_clients, Layout.from_shapes({"w": (n_words * 32,)}))
    buffers.signs[:, :n_words] = signs
    buffers.task[:n_words] = task
    return backend, buffers


def test_sampled_matches_are_the_draws_of_the_per_draw_kernel():
    """Pinned: what the per-draw kernel (before the compacted planes) returned on these words.

    40,000 words span several compaction blocks and draw chunks, so every block edge is crossed.
    """
    backend, buffers = _buffers_holding(*_counter_words(5, 40_000))
    pairs = np.array([(i, j) for i in range(5) for j in range(5) if i != j])
    pinned = {
        (0, 0.5): [215060, 216076, 216244, 214774, 215369, 215780, 215479, 216120, 215791, 215411, 215233, 215468,
                   215637, 215294, 214958, 214971, 215792, 215549, 215655, 215156],
        (987654321, 0.3): [128494, 128600, 128773, 128916, 128987, 128754, 128826, 128729, 128604, 128576, 128793,
                           128965, 129298, 128768, 129077, 128967, 128718, 128654, 128774, 128867],
    }
    for (seed, fraction), matches in pinned.items():
        assert backend.sampled_matches(buffers, seed, fraction, pairs).tolist() == matches


def test_sampled_matches_with_sparse_blocks_match_reference():
    signs, task = _counter_words(4, 3 * 4096 + 77, sparse_task=True)
    backend, buffers = _buffers_holding(signs, task)
    pairs = np.array([(0, 1), (1, 0), (2, 3), (3, 1), (0, 3)])
    for seed, fraction in [(5, 0.5), (2**32 - 1, 0.2)]:
        np.testing.assert_array_equal(backend.sampled_matches(buffers, seed, fraction, pairs),
                                      naive.sampled_matches(signs, task, seed, fraction, pairs))


def test_plane_compaction_by_byte_table_equals_pext(monkeypatch):
    """CPUs without BMI2 compact the penalty planes by a byte table; it must give the planes pext gives."""
    from types import FunctionType

    from numba import njit

    from kfca_llm.engine import cpu
    from kfca_llm.partition import partition_params

    kernel = cpu._penalty_planes_kernel
    table_globals = dict(kernel.__globals__, _compress_bits=cpu._table_compress)
    by_table = njit(FunctionType(kernel.__code__, table_globals, "planes_by_table"))
    signs, task = _counter_words(5, 3 * 4096 + 77)
    key, t_bonus, t_m1 = (np.uint32(v) for v in partition_params(9, 0.4))
    args = (signs.view(np.uint32), task.view(np.uint32), key, t_bonus, t_m1)
    expected = cpu.penalty_planes(*args)  # pext where this machine has BMI2
    monkeypatch.setattr(cpu, "_PLANES", (by_table, by_table))
    got = cpu.penalty_planes(*args)
    for a, b in zip(expected, got):
        np.testing.assert_array_equal(a, b)
    assert expected[1].any() and expected[2].any()


def test_vectorised_payments_and_deltas_equal_the_per_pair_ones():
    from kfca_llm.engine.stats import delta_from_joint, deltas_from_joints, joint_tables, pair_payment, pair_payments

    backend, buffers = _buffers_holding(*_counter_words(6, 900))
    pairs = np.array([(i, j) for i in range(6) for j in range(6) if i != j])
    counts = backend.round_counts(buffers, 9, 0.4)
    matches = backend.sampled_matches(buffers, 9, 0.4, pairs)
    for sampled in (None, matches):
        payment, bonus, penalty = pair_payments(counts, pairs, sampled)
        for k, (i, j) in enumerate(pairs):
            one = pair_payment(counts, i, j, None if sampled is None else int(sampled[k]))
            assert (payment[k], bonus[k], penalty[k]) == (one.payment, one.bonus_agreement, one.penalty_agreement)
    joints = joint_tables(counts, pairs)
    rng = np.random.default_rng(0)
    tables = np.concatenate([joints, rng.integers(0, 1000, size=(5, 2, 2))])
    for k, (i, j) in enumerate(pairs):
        np.testing.assert_array_equal(joints[k], counts.joint_counts(i, j))
    labelled = rng.integers(0, 50, size=(7, 10, 10))  # KFCA-D's L x L tables too
    for stack in (tables, labelled):
        batch = deltas_from_joints(stack)
        for table, delta in zip(stack, batch):
            assert delta.tobytes() == delta_from_joint(table).tobytes()
            p = table / table.sum()  # the definition: P(a, b) - P(a) P(b), rows a, columns b
            np.testing.assert_allclose(delta, p - np.outer(p.sum(axis=1), p.sum(axis=0)), rtol=0, atol=1e-15)


def test_counting_only_the_scored_pairs_leaves_their_counts_unchanged():
    backend, buffers = _buffers_holding(*_counter_words(7, 1500))
    full = backend.round_counts(buffers, 1, 0.5)
    pairs = np.array([(0, 3), (5, 2), (6, 0)])
    part = backend.round_counts(buffers, 1, 0.5, pairs)
    for i, j in [(0, 3), (3, 0), (5, 2), (2, 5), (6, 0)] + [(k, k) for k in range(7)]:
        np.testing.assert_array_equal(part.gram[:, i, j], full.gram[:, i, j])
    np.testing.assert_array_equal(part.sizes, full.sizes)
    assert not part.gram[:, 1, 4].any() and full.gram[:, 1, 4].any()  # unscored: skipped


def test_peer_draw_follows_its_contract():
    """sample_peers (vectorised) against its docstring's rule, written out pair by pair."""
    from kfca_llm.partition import PEER_SALT, mix32, sample_peers

    for n, peers, seed in [(2, 1, 0), (7, 3, 12345), (40, 5, 2**32 - 1), (40, 39, 8), (9, None, 1)]:
        key = mix32(seed ^ PEER_SALT)
        expected = []
        for i in range(n):
            others = sorted((j for j in range(n) if j != i), key=lambda j: (mix32(key ^ ((i << 16) | j)), j))
            expected.append(sorted(others[: peers if peers is not None else n]))
        assert sample_peers(n, peers, seed) == expected


def test_multi_threaded_fused_pack_matches_reference():
    """Several tensors past the single-threaded size: the parallel build of the packing kernel."""
    rng = np.random.default_rng(11)
    shapes = {"a": (400_001,), "b": (1000, 700), "c": (5,)}
    sds = _random_state_dicts(rng, shapes, 2, torch.float32)
    layout = Layout.from_shapes(shapes)
    assert layout.n_words >= 1 << 15
    backend = get_backend("numpy")
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
    backend = get_backend("numpy")
    buffers = backend.allocate(4, layout)
    backend.pack_clients(buffers, [(i, k, sd[slot.name]) for i, sd in enumerate(sds)
                                   for k, slot in enumerate(layout.slots)])
    signs, task = backend.host_words(buffers)
    ref_signs, ref_task = _reference_words(layout, sds)
    np.testing.assert_array_equal(signs, ref_signs)
    np.testing.assert_array_equal(task, ref_task)
    flagged = {(i, layout.slots[k].name) for i, k in np.argwhere(backend.nonfinite(buffers))}
    assert flagged == {(0, "a"), (2, "a")}


def test_parallel_kernels_run_on_the_workqueue_layer():
    """OpenMP workers keep spinning after a parallel kernel and starve torch's training threads
    (engine/numba_setup.py): the engine picks numba's workqueue layer unless the user chose one."""
    code = ("import numba, torch, kfca_llm\n"
            "kfca_llm.score_updates({'a': torch.randn(4_000_000), 'b': torch.randn(4_000_000)}, backend='numpy')\n"
            "print(numba.threading_layer())")
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_THREADING_LAYER"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[-1] == "workqueue"
