"""Pair counts (binary Gram matrices): the CPU and Triton kernels count what the reference counts."""

import numpy as np
import pytest
import torch

from kfca_llm.kernels.pair_counts import cpu, reference
from kfca_llm.kernels.pair_counts.triton import GramConfig, binary_gram
from kfca_llm.partition import partition_params


def _random_words(rng, n_clients):
    """Dense random words over a few thousand words (all clients, every tile pair when n > 16)."""
    n_words = int(rng.integers(900, 2600))
    task = rng.integers(-2**31, 2**31, size=n_words, dtype=np.int64).astype(np.int32)
    task[rng.random(n_words) < 0.1] = -1  # some all-task words, incl. lane 31
    signs = rng.integers(-2**31, 2**31, size=(n_clients, n_words), dtype=np.int64).astype(np.int32) & task
    return signs, task


def _assert_triton_gram_is_the_reference(rng, device, n_clients, config=None):
    signs, task = _random_words(rng, n_clients)
    seed, fraction = int(rng.integers(2**32)), float(rng.uniform(0.05, 0.95))
    gram, sizes = binary_gram(torch.from_numpy(signs).to(device), torch.from_numpy(task).to(device),
                              *partition_params(seed, fraction), config=config)
    ref_gram, ref_sizes = reference.binary_gram(signs, task, seed, fraction)
    np.testing.assert_array_equal(gram.cpu().numpy(), ref_gram)
    np.testing.assert_array_equal(sizes.cpu().numpy(), ref_sizes)


@pytest.mark.parametrize("n_clients", [2, 3, 16, 33])
def test_triton_gram_matches_reference(n_clients, rng, device):
    _assert_triton_gram_is_the_reference(rng, device, n_clients)


@pytest.mark.parametrize("config", [GramConfig(tile=2, num_warps=8, target_programs=5, planes_block=128),
                                    GramConfig(tile=4, num_warps=4, target_programs=3, planes_block=256),
                                    GramConfig(tile=4, num_warps=16, target_programs=200, planes_block=512)])
@pytest.mark.parametrize("n_clients", [1, 5, 9])
def test_every_tiling_counts_what_the_reference_counts(n_clients, config, rng, device):
    """Tiles that pad the clients (5, 9 in tiles of 2 or 4), word ranges that split blocks unevenly, programs
    more than blocks (200): the integers stay the reference's."""
    _assert_triton_gram_is_the_reference(rng, device, n_clients, config)


def test_a_round_without_words_counts_nothing(device):
    gram, sizes = binary_gram(torch.zeros((3, 0), dtype=torch.int32, device=device),
                              torch.zeros(0, dtype=torch.int32, device=device), *partition_params(1, 0.5))
    assert gram.shape == (3, 3, 3) and not gram.any() and sizes.tolist() == [0, 0, 0]


@pytest.mark.parametrize("n_clients", [2, 3, 16, 33])
def test_cpu_counts_of_the_listed_pairs_match_reference(n_clients, rng):
    signs, task = _random_words(rng, n_clients)
    seed, fraction = int(rng.integers(2**32)), float(rng.uniform(0.05, 0.95))
    padded = signs.shape[1] + signs.shape[1] % 2  # the kernel reads uint64: two words per lane
    signs64 = np.zeros((n_clients, padded), dtype=np.int32)
    signs64[:, :signs.shape[1]] = signs
    task64 = np.zeros(padded, dtype=np.int32)
    task64[:task.size] = task
    rows, cols = np.triu_indices(n_clients, 1)
    keep = rng.random(rows.size) < 0.5  # a sorted subset of the pairs, as the backend lists them
    rows, cols = rows[keep], cols[keep]
    key, t_bonus, t_m1 = (np.uint32(v) for v in partition_params(seed, fraction))
    diagonal, counts, sizes = cpu.count_pairs(signs64.view(np.uint64), task64.view(np.uint64), key, t_bonus, t_m1,
                                              rows, cols)
    ref_gram, ref_sizes = reference.binary_gram(signs, task, seed, fraction)
    clients = np.arange(n_clients)
    np.testing.assert_array_equal(diagonal, ref_gram[:, clients, clients])
    np.testing.assert_array_equal(counts, ref_gram[:, rows, cols])
    np.testing.assert_array_equal(sizes, ref_sizes)
