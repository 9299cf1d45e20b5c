"""The paper's robustness closed forms, and Monte-Carlo runs of the mechanism against them.

Every simulation runs R independent worlds; in each, a focal client is paid against a pool of K
peers of which a fraction lam is malicious (so lam is exact), with fresh tasks and a fresh
partition seed. The per-world rewards are i.i.d., and since the MTPP payment is an unbiased
estimate of the expected reward given the partition (bonus matches on shared tasks; penalty
frequencies on the disjoint sets M_1, M_2, hence independent), the mean over worlds must lie
within 5 standard errors (sample std / sqrt(R)) of the closed form.
"""

from __future__ import annotations

import numpy as np
import pytest

from kfca_llm.errors import InputError
from kfca_llm.mechanism import categorical_world, delta_matrix, kfca_score_matrix, mtpp_payment
from kfca_llm.theory import (
    binary_robustness,
    cross_agreement,
    honest_agreement,
    mixed_report_marginal,
    multiclass_expected_reward,
    multiclass_robustness_bound,
    penalty_agreement,
    permutation_deviation,
    signal_delta,
)

WORLDS = 30      # R independent worlds per setting
PEERS = 10       # K peers in the pool: lam takes values k / 10
TASKS = 3000     # tasks per world


def noisy_identity(num_labels: int, error: float) -> np.ndarray:
    c = np.full((num_labels, num_labels), error / (num_labels - 1))
    np.fill_diagonal(c, 1.0 - error)
    return c


def sample_signals(rng, y: np.ndarray, confusion: np.ndarray) -> np.ndarray:
    """One client's signals: label l with probability confusion[y, l], independently per task."""
    u = rng.random(y.size)
    return (u[:, None] >= np.cumsum(confusion[y], axis=1)[:, :-1]).sum(axis=1).astype(np.int64)


def mean_reward(focal: np.ndarray, pool: list[np.ndarray], seed: int) -> float:
    s = kfca_score_matrix(int(max(focal.max(), max(p.max() for p in pool))) + 1)
    return float(np.mean([mtpp_payment(focal, peer, s, seed=seed) for peer in pool]))


def within_5_se(samples: np.ndarray, target: float, extra: float = 0.0) -> bool:
    se = samples.std(ddof=1) / np.sqrt(samples.size)
    return abs(samples.mean() - target) <= 5 * se + extra


# ---------------------------------------------------------------- closed forms

def test_binary_closed_form_values():
    assert binary_robustness(0.0, 0.0) == 0.5
    assert binary_robustness(0.1, 0.5) == 0.0
    assert binary_robustness(0.1, 0.2) == pytest.approx(0.6 * (0.5 - 0.18), abs=1e-15)
    assert binary_robustness(0.2, 0.49) > 0 > binary_robustness(0.2, 0.51)


@pytest.mark.parametrize("alpha,lam", [(0.0, 0.0), (0.1, 0.3), (0.3, 0.7), (0.45, 1.0)])
def test_multiclass_reduces_to_binary(alpha, lam):
    honest = noisy_identity(2, alpha)
    flipper = honest[:, ::-1]
    prior = np.array([0.5, 0.5])
    a, b = honest_agreement(prior, honest), cross_agreement(prior, honest, flipper)
    assert a == pytest.approx((1 - alpha) ** 2 + alpha**2, abs=1e-15)
    assert b == pytest.approx(2 * alpha * (1 - alpha), abs=1e-15)
    assert penalty_agreement(prior, honest, flipper, lam) == pytest.approx(0.5, abs=1e-15)
    reward = multiclass_expected_reward(prior, honest, flipper, lam)
    assert reward == pytest.approx(binary_robustness(alpha, lam), abs=1e-15)
    if alpha > 0:
        # binary bound is exactly one half
        assert multiclass_robustness_bound(a, b, 0.5) == pytest.approx(0.5, abs=1e-12)


def test_mixed_marginal_and_penalty():
    prior = np.array([0.6, 0.4])
    honest = np.array([[0.9, 0.1], [0.2, 0.8]])
    always_one = np.array([[0.0, 1.0], [0.0, 1.0]])
    q = mixed_report_marginal(prior, honest, always_one, 0.25)
    # honest marginal (0.62, 0.38), malicious (0, 1)
    np.testing.assert_allclose(q, [0.75 * 0.62, 0.75 * 0.38 + 0.25], atol=1e-15)
    assert penalty_agreement(prior, honest, always_one, 0.25) == pytest.approx(q @ q, abs=1e-15)


def test_signal_delta_is_categorical_and_centered():
    d = signal_delta(np.array([0.5, 0.3, 0.2]), noisy_identity(3, 0.3), noisy_identity(3, 0.3))
    np.testing.assert_allclose(d.sum(axis=0), 0, atol=1e-15)
    np.testing.assert_allclose(d.sum(axis=1), 0, atol=1e-15)
    np.testing.assert_allclose(d, d.T, atol=1e-15)
    assert categorical_world(d)
    # signals no better than chance carry no correlation at all
    chance = signal_delta(np.array([0.5, 0.5]), noisy_identity(2, 0.5), noisy_identity(2, 0.1))
    np.testing.assert_allclose(chance, 0, atol=1e-15)


def test_signal_delta_matches_empirical_delta():
    rng = np.random.default_rng(5)
    prior, c1, c2 = np.array([0.2, 0.5, 0.3]), noisy_identity(3, 0.2), noisy_identity(3, 0.35)
    m = 20000
    y = rng.choice(3, m, p=prior)
    d_hat = delta_matrix(sample_signals(rng, y, c1), sample_signals(rng, y, c2), 3)
    # |d_hat - d| <= |P^(a,b) - P(a,b)| + |P^1(a) - P1(a)| + |P^2(b) - P2(b)| (+ O(1/m) bias),
    # each frequency having standard deviation at most 1 / (2 sqrt(m))
    tol = 5 * 3 / (2 * np.sqrt(m)) + 1 / m
    np.testing.assert_allclose(d_hat, signal_delta(prior, c1, c2), atol=tol)


def test_permutation_deviation_formula():
    d = np.array([[0.2, -0.15, -0.05], [-0.15, 0.25, -0.1], [-0.05, -0.1, 0.15]])
    swap01 = np.array([1, 0, 2])
    # D = 0.6, |O| = -(d[0,1] + d[1,0] + d[2,2]) = 0.15
    assert permutation_deviation(d, swap01, 0.25) == pytest.approx(0.5 * (0.6 + 0.15), abs=1e-15)
    assert permutation_deviation(d, swap01, 0.5) == 0.0
    assert permutation_deviation(d, np.arange(3), 0.2) == 0.0  # the identity is no deviation


@pytest.mark.parametrize("call", [
    lambda: binary_robustness(0.5, 0.1),
    lambda: binary_robustness(-0.1, 0.1),
    lambda: binary_robustness(0.1, 1.5),
    lambda: binary_robustness(0.1, -0.01),
    lambda: honest_agreement([0.5, 0.6], np.eye(2)),
    lambda: honest_agreement([0.5, 0.5], [[0.5, 0.4], [0.5, 0.5]]),
    lambda: honest_agreement([0.5, 0.5], [[1.5, -0.5], [0.5, 0.5]]),
    lambda: honest_agreement([0.5, 0.5], np.eye(3)),
    lambda: cross_agreement([0.5, 0.5], np.eye(2), [[0.5, 0.6], [0.5, 0.5]]),
    lambda: penalty_agreement([0.5, 0.5], np.eye(2), np.eye(2), 2.0),
    lambda: multiclass_robustness_bound(0.3, 0.3, 0.2),
    lambda: multiclass_robustness_bound(0.2, 0.3, 0.2),
    lambda: multiclass_robustness_bound(np.nan, 0.3, 0.2),
    lambda: permutation_deviation(np.zeros((2, 2)), [0, 0], 0.1),
    lambda: permutation_deviation(np.zeros((2, 2)), [0, 1, 2], 0.1),
    lambda: permutation_deviation(np.zeros((2, 3)), [0, 1], 0.1),
    lambda: signal_delta([1.0], [[1.0]], [[1.0]]),
])
def test_bad_input_raises(call):
    with pytest.raises(InputError):
        call()


# ---------------------------------------------------------------- Monte-Carlo: mechanism vs closed forms

def simulated_rewards(rng, num_labels, honest, n_bad, corrupt) -> np.ndarray:
    """Mean payment of one honest client against PEERS peers, the first n_bad corrupted, in WORLDS worlds."""
    rewards = []
    for world in range(WORLDS):
        y = rng.integers(0, num_labels, TASKS)
        focal = sample_signals(rng, y, honest)
        pool = [sample_signals(rng, y, honest) for _ in range(PEERS)]
        pool = [corrupt(r) for r in pool[:n_bad]] + pool[n_bad:]
        rewards.append(mean_reward(focal, pool, seed=world))
    return np.array(rewards)


@pytest.mark.parametrize("alpha,lam", [(0.1, 0.0), (0.25, 0.3), (0.1, 0.7)])
def test_binary_robustness_by_simulation(alpha, lam):
    rng = np.random.default_rng(1000 + int(100 * alpha) + int(10 * lam))
    honest = noisy_identity(2, alpha)
    rewards = simulated_rewards(rng, 2, honest, round(lam * PEERS), lambda r: 1 - r)
    expected = binary_robustness(alpha, lam)
    assert within_5_se(rewards, expected)
    assert np.sign(rewards.mean()) == np.sign(expected)


@pytest.mark.parametrize("lam", [0.3, 0.6, 0.8])
def test_multiclass_bound_by_simulation(lam):
    # three labels, uniform prior, honest noisy identity, malicious clients relabel cyclically
    # (a -> a + 1): both report marginals are uniform, so the paper's E_penalty = sum q^2 is exact
    rng = np.random.default_rng(2000 + int(10 * lam))
    prior, honest = np.full(3, 1 / 3), noisy_identity(3, 0.3)
    shift = np.array([1, 2, 0])
    malicious = honest[:, np.argsort(shift)]  # P(report l | y) = P(signal shift^-1(l) | y)
    a, b = honest_agreement(prior, honest), cross_agreement(prior, honest, malicious)
    e_pen = penalty_agreement(prior, honest, malicious, lam)
    bound = multiclass_robustness_bound(a, b, e_pen)
    assert 0.5 < bound < 0.8  # the multi-class threshold is not 1/2: lam = 0.6 is still tolerated

    rewards = simulated_rewards(rng, 3, honest, round(lam * PEERS), lambda r: shift[r])
    expected = multiclass_expected_reward(prior, honest, malicious, lam)
    assert expected == pytest.approx((1 - lam) * a + lam * b - e_pen, abs=1e-15)
    assert within_5_se(rewards, expected)
    # the reward is positive exactly on the side of the bound the proposition says
    assert (rewards.mean() > 0) == (lam < bound)
    assert abs(rewards.mean()) > 5 * rewards.std(ddof=1) / np.sqrt(WORLDS)  # sign is resolved


@pytest.mark.parametrize("perm,lam", [([1, 0, 2], 0.2), ([1, 2, 0], 0.3), ([2, 0, 1], 0.7)])
def test_permutation_deviation_by_simulation(perm, lam):
    rng = np.random.default_rng(3000 + 10 * perm[0] + int(10 * lam))
    perm = np.array(perm)
    prior, honest = np.array([0.5, 0.3, 0.2]), noisy_identity(3, 0.2)
    n_flip = round(lam * PEERS)
    diffs, gaps = [], []
    for world in range(WORLDS):
        y = rng.choice(3, TASKS, p=prior)
        z_honest, z_flipper = sample_signals(rng, y, honest), sample_signals(rng, y, honest)
        pool = [sample_signals(rng, y, honest) for _ in range(PEERS)]
        pool = [perm[r] for r in pool[:n_flip]] + pool[n_flip:]
        diff = mean_reward(z_honest, pool, world) - mean_reward(perm[z_flipper], pool, world)
        diffs.append(diff)
        # the formula on this world's empirical (signal) delta matrix
        gaps.append(diff - permutation_deviation(delta_matrix(z_honest, z_flipper, 3), perm, lam))
    diffs, gaps = np.array(diffs), np.array(gaps)
    population = permutation_deviation(signal_delta(prior, honest, honest), perm, lam)
    # E[empirical delta] = (1 - 1/m) delta, hence the |formula| / m allowance
    assert within_5_se(gaps, 0.0, extra=abs(population) / TASKS)
    assert within_5_se(diffs, population)
    assert (diffs.mean() > 0) == (lam < 0.5)
