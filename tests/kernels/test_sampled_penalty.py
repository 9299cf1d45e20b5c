"""The sampled penalty: the CPU and Triton kernels count the reference's draws, pair by pair."""

import numpy as np
import pytest
import torch
from conftest import KERNELS_INTERPRETED
from helpers import counter_words

from kfca_llm.kernels.sampled_penalty import cpu, reference
from kfca_llm.kernels.sampled_penalty import triton as triton_penalty
from kfca_llm.kernels.sampled_penalty.triton import sampled_matches
from kfca_llm.partition import DRAW2_SALT, pair_keys, partition_params


DEVICE = "cpu" if KERNELS_INTERPRETED else "cuda"  # compiled kernels get CUDA tensors (conftest's device)


def _cpu_matches(signs, task, seed, fraction, pairs):
    key, t_bonus, t_m1 = (np.uint32(v) for v in partition_params(seed, fraction))
    bonus_coords, plane1, plane2, m1, m2 = cpu.penalty_planes(signs.view(np.uint32), task.view(np.uint32), key,
                                                              t_bonus, t_m1)
    return cpu.draw_matches(bonus_coords, plane1, plane2, pairs, pair_keys(seed, pairs), DRAW2_SALT, m1, m2)


def _triton_matches(signs, task, seed, fraction, pairs, shared=None, keys=None):
    keys = pair_keys(seed, pairs) if keys is None else keys
    return sampled_matches(torch.from_numpy(signs).to(DEVICE), torch.from_numpy(task).to(DEVICE),
                           *partition_params(seed, fraction), pairs, keys, DRAW2_SALT, shared=shared).cpu().numpy()


def _triton_shared(signs, task, seed, fraction, pairs):
    return _triton_matches(signs, task, seed, fraction, pairs, shared=True)


def _triton_per_pair(signs, task, seed, fraction, pairs):
    return _triton_matches(signs, task, seed, fraction, pairs, shared=False)


KERNELS = {"cpu": _cpu_matches, "triton": _triton_per_pair, "triton-shared": _triton_shared}


# Larger rounds than the client-count test below: 1,025 to 1,300 words cross many plane blocks (64 words under
# the interpreter) and draw blocks, and give the shared kernel 4 tiles of which the last has no coordinates (the
# skipped tile). The smallest round and one with two-word columns; the counts in between run on small words below.
@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("n_clients", [2, 33])
def test_draws_on_random_words_match_reference(kernel, n_clients, rng):
    n_words = int(rng.integers(1025, 1300))
    task = rng.integers(-2**31, 2**31, size=n_words, dtype=np.int64).astype(np.int32)
    task[rng.random(n_words) < 0.1] = -1  # some all-task words, incl. lane 31
    signs = rng.integers(-2**31, 2**31, size=(n_clients, n_words), dtype=np.int64).astype(np.int32) & task
    seed, fraction = int(rng.integers(2**32)), float(rng.uniform(0.05, 0.95))
    pairs = rng.integers(0, n_clients, size=(40, 2))
    pairs = pairs[pairs[:, 0] != pairs[:, 1]]
    np.testing.assert_array_equal(KERNELS[kernel](signs, task, seed, fraction, pairs),
                                  reference.sampled_matches(signs, task, seed, fraction, pairs))


def test_cpu_draws_are_the_draws_of_the_per_draw_kernel():
    """Pinned: what the per-draw kernel (before the compacted planes) returned on these words.

    40,000 words span several compaction blocks and draw chunks, so every block edge is crossed.
    """
    signs, task = counter_words(5, 40_000)
    pairs = np.array([(i, j) for i in range(5) for j in range(5) if i != j])
    pinned = {
        (0, 0.5): [215060, 216076, 216244, 214774, 215369, 215780, 215479, 216120, 215791, 215411, 215233, 215468,
                   215637, 215294, 214958, 214971, 215792, 215549, 215655, 215156],
        (987654321, 0.3): [128494, 128600, 128773, 128916, 128987, 128754, 128826, 128729, 128604, 128576, 128793,
                           128965, 129298, 128768, 129077, 128967, 128718, 128654, 128774, 128867],
    }
    for (seed, fraction), matches in pinned.items():
        assert _cpu_matches(signs, task, seed, fraction, pairs).tolist() == matches


def test_cpu_draws_with_sparse_blocks_match_reference():
    signs, task = counter_words(4, 3 * 4096 + 77, sparse_task=True)
    pairs = np.array([(0, 1), (1, 0), (2, 3), (3, 1), (0, 3)])
    for seed, fraction in [(5, 0.5), (2**32 - 1, 0.2)]:
        np.testing.assert_array_equal(_cpu_matches(signs, task, seed, fraction, pairs),
                                      reference.sampled_matches(signs, task, seed, fraction, pairs))


def test_plane_compaction_by_byte_table_equals_pext(monkeypatch):
    """CPUs without BMI2 compact the penalty planes by a byte table; it must give the planes pext gives."""
    from types import FunctionType

    from numba import njit

    kernel = cpu._penalty_planes_kernel
    table_globals = dict(kernel.__globals__, _compress_bits=cpu._table_compress)
    by_table = njit(FunctionType(kernel.__code__, table_globals, "planes_by_table"))
    signs, task = counter_words(5, 3 * 4096 + 77)
    key, t_bonus, t_m1 = (np.uint32(v) for v in partition_params(9, 0.4))
    args = (signs.view(np.uint32), task.view(np.uint32), key, t_bonus, t_m1)
    expected = cpu.penalty_planes(*args)  # pext where the CPU has BMI2
    monkeypatch.setattr(cpu, "_PLANES", (by_table, by_table))
    got = cpu.penalty_planes(*args)
    for a, b in zip(expected, got):
        np.testing.assert_array_equal(a, b)
    assert expected[1].any() and expected[2].any()


def _random_words(rng, n_clients, n_words):
    task = rng.integers(-2**31, 2**31, size=n_words, dtype=np.int64).astype(np.int32)
    task[rng.random(n_words) < 0.1] = -1
    task[rng.random(n_words) < 0.1] = 0  # blocks of the compaction with few or no members
    signs = rng.integers(-2**31, 2**31, size=(n_clients, n_words), dtype=np.int64).astype(np.int32) & task
    return signs, task


@pytest.mark.parametrize("n_words", [1, 31, 64, 65, 200, 3 * 64 + 17])
def test_triton_planes_and_bonus_list_equal_the_cpu_ones(n_words, rng):
    """Bit for bit: the compacted planes (every block edge, whole and partial words) and the bonus list."""
    for n_clients, sparse in [(2, False), (5, True), (33, False)]:
        if sparse:
            signs, task = counter_words(n_clients, n_words, sparse_task=True)
        else:
            signs, task = _random_words(rng, n_clients, n_words)
        key, t_bonus, t_m1 = partition_params(int(rng.integers(2**32)), float(rng.uniform(0.05, 0.95)))
        bonus, n_bonus, plane1, plane2, m1, m2 = triton_penalty.penalty_planes(
            torch.from_numpy(signs).to(DEVICE), torch.from_numpy(task).to(DEVICE), key, t_bonus, t_m1)
        expected = cpu.penalty_planes(signs.view(np.uint32), task.view(np.uint32), *(np.uint32(v) for v in
                                                                                    (key, t_bonus, t_m1)))
        np.testing.assert_array_equal(bonus.cpu().numpy()[:n_bonus].view(np.uint32), expected[0])
        np.testing.assert_array_equal(plane1.cpu().numpy().view(np.uint32), expected[1])
        np.testing.assert_array_equal(plane2.cpu().numpy().view(np.uint32), expected[2])
        assert (m1, m2) == expected[3:]


# Client counts whose pair lists leave every remainder of the per-pair kernel's draw tile (4 pairs) and fill
# columns of one word (up to 32 clients) and two (33, 34): what every count from 2 to 34 covered, at 13 counts
# instead of 33 (the interpreted kernel made this the suite's slowest kernel test). The shared kernel has no tile
# of pairs (it loops over a group's pairs one by one): its client counts only set the column width, so it runs the
# smallest rounds and both widths, on fewer pairs (each pair is a pass of the interpreted loop).
DRAW_CLIENT_COUNTS = {False: (2, 3, 4, 5, 7, 8, 9, 10, 11, 12, 32, 33, 34), True: (2, 3, 32, 33, 34)}


def _pair_count(n_clients: int, shared: bool) -> int:
    every = n_clients * (n_clients - 1)
    return every if every <= 45 else 12 + n_clients % 4 if shared else 45 + n_clients % 5


def test_the_draw_client_counts_leave_every_tile_remainder_and_both_column_widths():
    assert {_pair_count(n, False) % 4 for n in DRAW_CLIENT_COUNTS[False] if n > 7} == {0, 1, 2, 3}
    for shared in (False, True):
        assert {(n + 31) // 32 for n in DRAW_CLIENT_COUNTS[shared]} == {1, 2}


@pytest.mark.parametrize("shared", [False, True])
def test_triton_draws_for_every_client_count_match_reference(shared, rng):
    """Client counts from 2 to 34 (draw tiles of 4 pairs: every remainder; columns of one and two words), odd
    sizes, seeds, bonus fractions."""
    for n_clients in DRAW_CLIENT_COUNTS[shared]:
        signs, task = _random_words(rng, n_clients, int(rng.integers(20, 160)))  # up to 3 plane blocks
        seed, fraction = int(rng.integers(2**32)), float(rng.uniform(0.05, 0.95))
        pairs = np.array([(i, j) for i in range(n_clients) for j in range(n_clients) if i != j])
        if len(pairs) > 45:  # a random subset, duplicates included (of every length modulo 4 for the tiles)
            pairs = pairs[rng.integers(0, len(pairs), size=_pair_count(n_clients, shared))]
        np.testing.assert_array_equal(_triton_matches(signs, task, seed, fraction, pairs, shared=shared),
                                      reference.sampled_matches(signs, task, seed, fraction, pairs),
                                      err_msg=f"{n_clients} clients")


@pytest.mark.parametrize("n_clients", [5, 40, 70])  # columns of 1, 2 and 4 words
def test_shared_draws_with_many_pairs_per_group_equal_the_per_pair_draws(n_clients, rng):
    """Keys that agree above the coordinates' span put many pairs in one group (what a round of many
    clients or a large adapter gives): every pair of a group counts its own draws from the shared values,
    whatever its key's low bits (word and bit permutations), coordinates beyond the round included."""
    signs, task = _random_words(rng, n_clients, 203)  # 6,496 coordinates: keys agree above bit 13
    seed, fraction = 77, 0.45
    pairs = rng.integers(0, n_clients, size=(60, 2))  # about 20 a group
    pairs = pairs[pairs[:, 0] != pairs[:, 1]]
    keys = rng.integers(0, 2**13, size=len(pairs), dtype=np.int64)
    keys |= rng.choice([0x12345, 0x7FFFF, 0x0], size=len(pairs)) << 13  # three groups
    keys = keys.astype(np.uint32)
    key, t_bonus, t_m1 = (np.uint32(v) for v in partition_params(seed, fraction))
    bonus, plane1, plane2, m1, m2 = cpu.penalty_planes(signs.view(np.uint32), task.view(np.uint32), key, t_bonus,
                                                       t_m1)
    expected = cpu.draw_matches(bonus, plane1, plane2, pairs, keys, DRAW2_SALT, m1, m2)
    for shared in (True, False):
        np.testing.assert_array_equal(_triton_matches(signs, task, seed, fraction, pairs, shared, keys), expected)


def test_shared_draws_are_chosen_where_they_save_lookups():
    """Per-pair draws for a few pairs; values shared by the pairs of a group once the groups fill up."""
    rng = np.random.default_rng(0)
    n_words = 2_500_000  # 80M coordinates (a rank-32 7B LoRA): keys agree above bit 27 in groups of 32
    for n_clients, shared in [(8, False), (20, True), (100, True)]:
        n_pairs = n_clients * (n_clients - 1)
        keys = rng.integers(0, 2**32, size=n_pairs, dtype=np.int64)
        assert triton_penalty.shared_draws_pay_off(n_pairs, 40_000_000, keys, n_words) is shared
    assert not triton_penalty.shared_draws_pay_off(2, 100, np.array([5, 2**31]), 10)


def test_shared_draws_refuse_more_clients_than_their_columns_hold():
    signs, task = _random_words(np.random.default_rng(1), triton_penalty.MAX_SHARED_CLIENTS + 1, 20)
    with pytest.raises(ValueError, match="at most 128 clients"):
        _triton_matches(signs, task, 0, 0.5, np.array([[0, 1]]), shared=True)
