"""KFCA-D through the engine (engine/labels.py, stats.label_pair_payments) against the per-pair mechanism, bit for bit."""

from __future__ import annotations

import numpy as np
import pytest

from kfca_llm import score_labels
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


def test_score_labels_flags_a_copier_through_the_kernel_disagreements():
    labels = _labels(6, 2_000, 4, seed=3)
    labels["copier"] = labels["c0"].copy()
    report = score_labels(labels, num_labels=4, seed=1)
    assert [g.clients for g in report.duplicates] == [("c0", "copier")]
    assert report.rewards["c0"] == report.rewards["copier"] == 0.0
