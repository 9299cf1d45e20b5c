"""KFCA-D's label kernels: the CPU kernels count what the numpy reference counts, in both builds."""

from __future__ import annotations

import numpy as np
import pytest

from kfca_llm.kernels.labels import cpu, reference
from kfca_llm.partition import DRAW2_SALT, pair_keys, partition_classes, peer_pairs, task_partition


@pytest.mark.parametrize("num_labels", [2, 7, 300])
@pytest.mark.parametrize("peers", [None, 2])
def test_pair_counts_histograms_and_draws_match_reference(num_labels, peers):
    rng = np.random.default_rng(num_labels)
    n, m, seed = 7, 1_531, 11
    truth = rng.integers(0, num_labels, m)
    labels = np.where(rng.random((n, m)) < 0.4, rng.integers(0, num_labels, (n, m)), truth)
    stacked = cpu.compact_labels(labels, num_labels)
    classes = partition_classes(np.arange(m), seed, 0.5)
    part = task_partition(m, seed=seed)
    pairs = peer_pairs(n, peers, seed)
    for got, expected in [
        (cpu.label_pair_counts(stacked, classes, pairs, num_labels),
         reference.label_pair_counts(labels, classes, pairs, num_labels)),
        ((cpu.label_penalty_histograms(stacked, classes, num_labels),),
         (reference.label_penalty_histograms(labels, classes, num_labels),)),
        ((cpu.label_sampled_matches(stacked, part.bonus, part.penalty_1, part.penalty_2, pairs, seed),),
         (reference.label_sampled_matches(labels, part.bonus, part.penalty_1, part.penalty_2, pairs, seed),)),
    ]:
        for a, b in zip(got, expected, strict=True):
            np.testing.assert_array_equal(a, b)
            assert b.any()  # never compare zeros alone


@pytest.mark.parametrize("n", [2, 3, 8, 9])
def test_label_disagreements_match_reference_for_odd_and_even_clients(n):
    rng = np.random.default_rng(n)
    labels = rng.integers(0, 3, (n, 1_001))  # 15 full vectors of 64 tasks and a tail
    labels[-1] = labels[0]  # an identical pair: zero disagreements
    expected = reference.label_disagreements(labels)
    got = cpu.label_disagreements(cpu.compact_labels(labels, 3))
    uint16_lanes = cpu.label_disagreements(cpu.compact_labels(labels, 1000))
    np.testing.assert_array_equal(uint16_lanes, expected)
    np.testing.assert_array_equal(got, expected)
    assert got[0, -1] == 0


def test_compact_labels_keeps_labels_above_255():
    labels = np.array([[0, 255, 256, 1023]])
    assert cpu.compact_labels(labels, 1024).dtype == np.uint16
    np.testing.assert_array_equal(cpu.compact_labels(labels, 1024), labels)
    assert cpu.compact_labels(labels[:, :2], 256).dtype == np.uint8


def test_parallel_builds_count_what_the_single_threaded_ones_count():
    """Small rounds run the single-threaded builds (checked against the reference above); large ones these."""
    rng = np.random.default_rng(5)
    n, m, num_labels = 9, 2_003, 300
    stacked = cpu.compact_labels(rng.integers(0, num_labels, (n, m)), num_labels)
    part = task_partition(m, seed=3)
    classes = partition_classes(np.arange(m), 3, 0.5)
    pairs = peer_pairs(n, None, 3)
    calls = [(cpu._DISAGREEMENTS, (stacked,)),
             (cpu._PAIR_COUNTS, (stacked, classes, pairs, num_labels)),
             (cpu._PENALTY_HISTOGRAMS, (stacked, classes, num_labels)),
             (cpu._SAMPLED_MATCHES, (stacked, part.bonus, part.penalty_1, part.penalty_2, pairs,
                                     pair_keys(3, pairs), np.uint32(DRAW2_SALT)))]
    for builds, args in calls:
        serial, parallel = builds[0](*args), builds[1](*args)
        for a, b in zip(serial if isinstance(serial, tuple) else (serial,),
                        parallel if isinstance(parallel, tuple) else (parallel,)):
            np.testing.assert_array_equal(a, b)
            assert a.any()  # never compare zeros alone
