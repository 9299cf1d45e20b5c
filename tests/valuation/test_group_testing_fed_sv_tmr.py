"""Group Testing, Fed-SV and TMR on games whose Shapley values are known.

Group testing is a sampling estimator: its stated tolerance is the paper's own guarantee, an l2
error of at most epsilon after ``required_tests(n, epsilon, delta)`` tests (with probability 1 - delta;
the seeds are fixed, so the assertions are deterministic).
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from kfca_llm import InputError
from kfca_llm.valuation import shapley_exact
from kfca_llm.valuation.group_testing import (differences_solution, shapley_group_testing, size_distribution,
                                              required_tests)
from kfca_llm.valuation.per_round import fed_sv, tmr, tmr_weights
from kfca_llm.valuation.utility import CachedUtility


def _coalitions(n: int):
    return [frozenset(s) for k in range(n + 1) for s in itertools.combinations(range(n), k)]


def _game_with_symmetric_and_null(n: int, seed: int) -> dict[frozenset, float]:
    """A random monotone-ish game where players 1 and 2 are symmetric and player n-1 is null."""
    rng = np.random.default_rng(seed)
    weights = rng.uniform(0.1, 1.0, n)
    weights[2], weights[n - 1] = weights[1], 0.0
    game = {s: float(np.sqrt(weights[list(s)].sum())) + 0.2 * float({0, 1} <= s or {0, 2} <= s) for s in _coalitions(n)}
    return game


def _bounded(game: dict) -> float:
    return max(abs(v) for v in game.values())


def _concave(n: int, seed: int):
    w = np.random.default_rng(seed).uniform(0.2, 2.0, n)
    return {s: float(np.sqrt(w[list(s)].sum())) + (0.3 if {0, 1} <= s else 0.0) for s in _coalitions(n)}


def test_size_distribution_is_the_papers():
    sizes, q, z = size_distribution(4)
    assert sizes.tolist() == [1, 2, 3]
    assert z == pytest.approx(2 * (1 + 1 / 2 + 1 / 3))
    np.testing.assert_allclose(q, [(1 + 1 / 3) / z, (1 / 2 + 1 / 2) / z, (1 / 3 + 1) / z])
    assert q.sum() == pytest.approx(1.0)
    # the corrected bound grows as 1 / epsilon^2
    assert required_tests(10, 0.05) / required_tests(10, 0.1) == pytest.approx(4.0, rel=0.01)


def test_feasibility_solution_satisfies_every_difference():
    a = np.array([0.3, -0.1, 0.7, 0.0])
    s = differences_solution(a, total=2.0)
    assert s.sum() == pytest.approx(2.0)
    for i, j in itertools.combinations(range(4), 2):
        assert s[i] - s[j] == pytest.approx(a[i] - a[j], abs=1e-12)


@pytest.mark.parametrize("n, epsilon", [(5, 0.1), (10, 0.3)])
def test_group_testing_within_its_guarantee(n, epsilon):
    game = _concave(n, seed=n) if n == 10 else _game_with_symmetric_and_null(n, seed=1)
    exact = shapley_exact(game, n)
    r = _bounded(game)
    tests = required_tests(n, epsilon, 0.05, utility_range=r)
    est = shapley_group_testing(game, n, seed=0, tests=tests)
    assert est.tests == tests and not est.converged
    assert np.linalg.norm(est.values - exact) <= epsilon  # the (epsilon, delta) guarantee
    assert est.values.sum() == pytest.approx(game[frozenset(range(n))] - game[frozenset()], abs=1e-12)
    if n == 5:  # the axioms, within the same tolerance: symmetric players 1 and 2, null player 4
        assert exact[4] == pytest.approx(0.0, abs=1e-12) and abs(est.values[4]) <= epsilon
        assert abs(est.values[1] - est.values[2]) <= epsilon


def test_group_testing_on_an_additive_game():
    w = np.array([0.5, -0.2, 1.5, 0.0, 0.25])
    game = {s: 3.0 + float(w[list(s)].sum()) for s in _coalitions(5)}
    est = shapley_group_testing(game, 5, seed=3, tests=required_tests(5, 0.2, 0.05, utility_range=_bounded(game)))
    assert np.linalg.norm(est.values - w) <= 0.2
    # more tests, smaller error: the estimator is consistent
    fewer = shapley_group_testing(game, 5, seed=3, tests=2_000)
    assert np.linalg.norm(est.values - w) < np.linalg.norm(fewer.values - w)


def test_group_testing_stops_by_the_rule_and_is_deterministic():
    n = 10
    game = _concave(n, seed=0)
    calls = []
    utility = CachedUtility(lambda s: calls.append(s) or game[s], n)
    est = shapley_group_testing(utility, n, seed=7)
    assert est.converged and est.tests < required_tests(n)
    assert est.coalitions_evaluated == len(calls) == len(set(calls)) < 2 ** n  # each coalition once, not all
    again = shapley_group_testing(game, n, seed=7)
    np.testing.assert_array_equal(est.values, again.values)
    assert not np.array_equal(est.values, shapley_group_testing(game, n, seed=8).values)


def test_fed_sv_sums_the_rounds_group_testing():
    n, epsilon = 5, 0.15
    rounds = [_game_with_symmetric_and_null(n, seed=s) for s in range(3)]
    r = max(_bounded(g) for g in rounds)
    tests = required_tests(n, epsilon, 0.05, utility_range=r)
    out = fed_sv(rounds, n, seed=4, tests=tests)
    expected = sum(shapley_group_testing(g, n, seed=4 + t, tests=tests).values for t, g in enumerate(rounds))
    np.testing.assert_array_equal(out.values, expected)
    exact = sum(shapley_exact(g, n) for g in rounds)  # the federated Shapley value of Wang et al.
    assert np.linalg.norm(out.values - exact) <= 3 * epsilon  # each round within epsilon
    assert abs(out.values[n - 1]) <= 3 * epsilon and abs(out.values[1] - out.values[2]) <= 3 * epsilon
    assert out.rounds_computed == 3 and out.extra["tests"] == 3 * tests


def test_tmr_weights_rounds_and_skips_light_ones():
    assert tmr_weights(10, 0.9, 0.5) == {t: 0.9 ** t for t in range(7)}  # 0.9^7 = 0.478 < 0.5
    assert tmr_weights(3, 1.0, 0.0) == {0: 1.0, 1: 1.0, 2: 1.0}
    n, rounds = 10, 5
    games = [_concave(n, seed=10 + t) for t in range(rounds)]
    phis = [shapley_exact(g, n) for g in games]
    asked = []

    def round_shapley(t):
        asked.append(t)
        return phis[t], 2 ** n

    out = tmr(round_shapley, rounds, n, decay=0.8, truncation=0.5)
    assert asked == [0, 1, 2, 3]  # 0.8^4 = 0.41 < 0.5: round 4 is never reconstructed
    np.testing.assert_allclose(out.values, sum(0.8 ** t * phis[t] for t in range(4)), atol=1e-12)
    assert out.coalitions == 4 * 2 ** n and out.extra["rounds_skipped"] == 1
    # no decay, no truncation: TMR is MR (the sum of exact per-round values), exact against the definition
    mr = tmr(lambda t: (phis[t], 0), rounds, n, decay=1.0, truncation=0.0)
    np.testing.assert_allclose(mr.values, sum(phis), atol=1e-12)
    # additive, symmetric and null players per round carry over exactly
    w = np.array([0.4, 0.1, 0.1, 0.0])
    additive = tmr(lambda t: (shapley_exact(lambda s: 1.0 + float(w[list(s)].sum()), 4), 16), 3, 4)
    np.testing.assert_allclose(additive.values, (1 + 0.9 + 0.81) * w, atol=1e-12)


def test_bad_arguments():
    with pytest.raises(InputError, match="tests"):
        shapley_group_testing(lambda s: 0.0, 3, tests=0)
    with pytest.raises(InputError, match="epsilon"):
        shapley_group_testing(lambda s: 0.0, 3, epsilon=0.0)
    with pytest.raises(InputError, match="decay"):
        tmr_weights(3, decay=1.5)
