"""Stratum counts: the numba and Triton kernels count what the numpy reference counts, bit for bit."""

import numpy as np
import pytest
import torch

from kfca_llm.kernels.stratum_counts import cpu, reference
from kfca_llm.kernels.stratum_counts.triton import stratum_counts as triton_counts
from kfca_llm.partition import partition_params


def _random_words(rng, n_clients, n_planes, low=2100, high=2600):
    """Random task, signs and planes over an odd number of words (a partial uint64 lane; by default three of the
    CPU kernel's chunks of 1024 words; fewer for the interpreted Triton kernel)."""
    n_words = int(rng.integers(low, high)) | 1
    task = rng.integers(-2**31, 2**31, size=n_words, dtype=np.int64).astype(np.int32)
    task[rng.random(n_words) < 0.1] = -1  # all-task words, lane 31 included
    task[rng.random(n_words) < 0.05] = 0  # words with no task
    signs = rng.integers(-2**31, 2**31, size=(n_clients, n_words), dtype=np.int64).astype(np.int32) & task
    planes = rng.integers(-2**31, 2**31, size=(n_planes, n_words), dtype=np.int64).astype(np.int32)
    return signs, task, planes


def _padded_u64(words):
    """Rows padded to an even number of int32 words, seen as uint64 (what the CPU backend hands the kernel)."""
    words = np.atleast_2d(words)
    out = np.zeros((words.shape[0], words.shape[1] + words.shape[1] % 2), dtype=np.int32)
    out[:, :words.shape[1]] = words
    return out.view(np.uint64)


@pytest.mark.parametrize("n_clients,n_planes", [(2, 0), (3, 1), (5, 3), (9, 6)])
def test_cpu_counts_what_the_reference_counts(n_clients, n_planes, rng):
    signs, task, planes = _random_words(rng, n_clients, n_planes)
    seed, fraction = int(rng.integers(2**32)), float(rng.uniform(0.1, 0.9))
    ref_neg, ref_sizes = reference.stratum_counts(signs, task, planes, seed, fraction)
    assert ref_neg.shape == (3, 1 << n_planes, n_clients) and ref_neg.any() and (ref_sizes > 0).sum() >= 3
    assert ref_sizes.sum() == np.bitwise_count(task.view(np.uint32)).sum()  # the strata partition the tasks
    key, t_bonus, t_m1 = (np.uint32(v) for v in partition_params(seed, fraction))
    neg, sizes = cpu.stratum_counts(_padded_u64(signs), _padded_u64(task)[0],
                                    _padded_u64(planes).reshape(n_planes, -1) if n_planes else
                                    np.zeros((0, (task.size + 1) // 2), dtype=np.uint64), key, t_bonus, t_m1)
    np.testing.assert_array_equal(neg, ref_neg)
    np.testing.assert_array_equal(sizes, ref_sizes)


@pytest.mark.parametrize("n_clients,n_planes", [(2, 0), (3, 1), (9, 3)])
def test_triton_counts_what_the_reference_counts(n_clients, n_planes, rng, device):
    signs, task, planes = _random_words(rng, n_clients, n_planes, 300, 600)
    seed, fraction = int(rng.integers(2**32)), float(rng.uniform(0.1, 0.9))
    ref_neg, ref_sizes = reference.stratum_counts(signs, task, planes, seed, fraction)
    on = lambda a: torch.from_numpy(a).to(device)  # noqa: E731
    neg, sizes = triton_counts(on(signs), on(task), on(planes), *partition_params(seed, fraction))
    np.testing.assert_array_equal(neg.cpu().numpy(), ref_neg)
    np.testing.assert_array_equal(sizes.cpu().numpy(), ref_sizes)


@pytest.mark.parametrize("tile,num_warps,target", [(2, 1, 1), (8, 4, 50), (16, 2, 7)])
def test_every_tiling_counts_what_the_reference_counts(tile, num_warps, target, rng, device):
    """Client tiles that pad the clients, word ranges that split blocks unevenly, more programs than blocks."""
    signs, task, planes = _random_words(rng, 7, 2, 300, 600)
    seed, fraction = int(rng.integers(2**32)), float(rng.uniform(0.1, 0.9))
    ref_neg, ref_sizes = reference.stratum_counts(signs, task, planes, seed, fraction)
    on = lambda a: torch.from_numpy(a).to(device)  # noqa: E731
    neg, sizes = triton_counts(on(signs), on(task), on(planes), *partition_params(seed, fraction), tile=tile,
                               num_warps=num_warps, target_programs=target)
    np.testing.assert_array_equal(neg.cpu().numpy(), ref_neg)
    np.testing.assert_array_equal(sizes.cpu().numpy(), ref_sizes)


def test_the_reference_counts_a_small_case_by_hand():
    """One word, 8 task bits: the reference against counts written out by hand."""
    task = np.array([0xFF], dtype=np.int32)
    plane = np.array([[0b00001111]], dtype=np.int32)  # coordinates 0-3 in stratum 1, 4-7 in stratum 0
    signs = np.array([[0b00110011], [0b11111111]], dtype=np.int32)
    neg, sizes = reference.stratum_counts(signs, task, plane, 0, 0.999999)  # (almost) every task a bonus task
    assert sizes[0].tolist() == [4, 4] and sizes[1:].sum() == 0
    assert neg[0, :, 0].tolist() == [2, 2] and neg[0, :, 1].tolist() == [4, 4]
