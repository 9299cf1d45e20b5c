"""KFCA-D's label kernels (engine/labels.py) against the per-pair mechanism functions, bit for bit."""

from __future__ import annotations

import numpy as np
import pytest

from kfca_llm import score_labels
from kfca_llm.engine.labels import compact_labels, label_disagreements
from kfca_llm.mechanism import joint_counts, kfca_score_matrix, mtpp_terms
from kfca_llm.partition import sample_peers


def _labels(n: int, m: int, num_labels: int, seed: int) -> dict[str, np.ndarray]:
    """Noisy copies of one truth (so pairs agree more than chance), plus a flipper and a constant client."""
    rng = np.random.default_rng(seed)
    truth = rng.integers(0, num_labels, m)
    out = {f"c{i}": np.where(rng.random(m) < 0.4, rng.integers(0, num_labels, m), truth) for i in range(n - 2)}
    out["flip"] = (num_labels - 1) - truth
    out["zero"] = np.zeros(m, dtype=np.int64)
    return out


@pytest.mark.parametrize("penalty", ["expected", "sampled"])
@pytest.mark.parametrize("peers", [None, 2])
@pytest.mark.parametrize("num_labels", [2, 7, 300])
def test_score_labels_equals_the_per_pair_mechanism(penalty, peers, num_labels):
    labels = _labels(7, 1_531, num_labels, seed=num_labels)
    report = score_labels(labels, num_labels=num_labels, peers=peers, seed=11, penalty=penalty, duplicates="flag")
    clients = sorted(labels)
    score = kfca_score_matrix(num_labels)
    expected_pairs = [(clients[i], clients[j]) for i, js in enumerate(sample_peers(len(clients), peers, 11))
                      for j in js]
    assert list(report.pairwise) == expected_pairs
    for i, j in ((clients.index(a), clients.index(b)) for a, b in expected_pairs):
        key = (clients[i], clients[j])
        terms = mtpp_terms(labels[key[0]], labels[key[1]], score, seed=11, penalty=penalty, pair=(i, j))
        assert report.pairwise[key] == terms.payment
        assert report.bonus_agreement[key] == terms.bonus_agreement
        assert report.penalty_agreement[key] == terms.penalty_agreement
    rewards = {c: float(np.mean([report.pairwise[k] for k in expected_pairs if k[0] == c])) for c in clients}
    assert report.rewards == rewards
    pooled = sum(joint_counts(labels[a], labels[b], num_labels) for a, b in expected_pairs)
    total = pooled.sum()
    np.testing.assert_allclose(report.delta, pooled / total - np.outer(pooled.sum(1), pooled.sum(0)) / total ** 2,
                               atol=1e-15)


@pytest.mark.parametrize("n", [2, 3, 8, 9])
def test_label_disagreements_match_numpy_for_odd_and_even_clients(n):
    rng = np.random.default_rng(n)
    labels = rng.integers(0, 3, (n, 1_001))  # 15 full vectors of 64 tasks and a tail
    labels[-1] = labels[0]  # an identical pair: zero disagreements
    expected = (labels[:, None, :] != labels[None, :, :]).sum(axis=2)
    got = label_disagreements(compact_labels(labels, 3))
    np.testing.assert_array_equal(label_disagreements(compact_labels(labels, 1000)), expected)  # uint16 lanes
    np.testing.assert_array_equal(got, expected)
    assert got[0, -1] == 0


def test_compact_labels_keeps_labels_above_255():
    labels = np.array([[0, 255, 256, 1023]])
    assert compact_labels(labels, 1024).dtype == np.uint16
    np.testing.assert_array_equal(compact_labels(labels, 1024), labels)
    assert compact_labels(labels[:, :2], 256).dtype == np.uint8


def test_score_labels_flags_a_copier_through_the_kernel_disagreements():
    labels = _labels(6, 2_000, 4, seed=3)
    labels["copier"] = labels["c0"].copy()
    report = score_labels(labels, num_labels=4, seed=1)
    assert [g.clients for g in report.duplicates] == [("c0", "copier")]
    assert report.rewards["c0"] == report.rewards["copier"] == 0.0


def test_parallel_builds_count_what_the_single_threaded_ones_count():
    """Small rounds run the single-threaded builds (checked against the mechanism above); large ones these."""
    from kfca_llm.engine import labels as kernels
    from kfca_llm.mechanism import task_partition
    from kfca_llm.partition import DRAW2_SALT, pair_keys, partition_classes, peer_pairs

    rng = np.random.default_rng(5)
    n, m, num_labels = 9, 2_003, 300
    stacked = compact_labels(rng.integers(0, num_labels, (n, m)), num_labels)
    part = task_partition(m, seed=3)
    classes = partition_classes(np.arange(m), 3, 0.5)
    pairs = peer_pairs(n, None, 3)
    calls = [(kernels._DISAGREEMENTS, (stacked,)),
             (kernels._PAIR_COUNTS, (stacked, classes, pairs, num_labels)),
             (kernels._PENALTY_HISTOGRAMS, (stacked, classes, num_labels)),
             (kernels._SAMPLED_MATCHES, (stacked, part.bonus, part.penalty_1, part.penalty_2, pairs,
                                         pair_keys(3, pairs), np.uint32(DRAW2_SALT)))]
    for builds, args in calls:
        serial, parallel = builds[0](*args), builds[1](*args)
        for a, b in zip(serial if isinstance(serial, tuple) else (serial,),
                        parallel if isinstance(parallel, tuple) else (parallel,)):
            np.testing.assert_array_equal(a, b)
            assert a.any()  # never compare zeros alone
