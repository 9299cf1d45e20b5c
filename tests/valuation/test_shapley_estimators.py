"""Shapley values on cooperative games: axioms, the paper's three-client table, estimators."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from kfca_llm import InputError
from kfca_llm.valuation import CachedUtility, mean_relative_change, shapley_exact, shapley_gtg, shapley_tmc


def _random_game(n: int, seed: int) -> dict[frozenset, float]:
    rng = np.random.default_rng(seed)
    return {frozenset(s): float(rng.normal()) for k in range(n + 1) for s in itertools.combinations(range(n), k)}


def _concave_game(weights: np.ndarray):
    """v(S) = sqrt(sum of weights in S) + 0.3 * [players 0 and 1 both in S]: not additive, monotone."""
    return lambda s: float(np.sqrt(weights[list(s)].sum())) + (0.3 if {0, 1} <= s else 0.0)


def test_efficiency_on_random_games():
    for n in (1, 2, 5, 7):
        game = _random_game(n, seed=n)
        phi = shapley_exact(game, n)
        assert phi.sum() == pytest.approx(game[frozenset(range(n))] - game[frozenset()], abs=1e-12)


def test_symmetry_and_null_player():
    n = 6
    game = _random_game(n, seed=3)
    # player 4 is null: v(S + 4) = v(S); players 1 and 2 are symmetric: v(S + 1) = v(S + 2)
    for s in list(game):
        if 4 in s:
            game[s] = game[s - {4}]
    for s in list(game):
        if 2 in s and 1 not in s:
            game[s] = game[(s - {2}) | {1}]
    phi = shapley_exact(game, n)
    assert phi[4] == 0.0
    assert phi[1] == pytest.approx(phi[2], abs=1e-13)
    assert abs(phi[0] - phi[1]) > 1e-3  # the game is not symmetric everywhere


def test_paper_three_client_table_with_correct_values():
    # The appendix's accuracies v(S); its printed expressions do not sum to v(N) - v(empty) = 0.88.
    table = {(): 0.1, (0,): 0.7, (1,): 0.75, (2,): 0.8, (0, 1): 0.85, (0, 2): 0.9, (1, 2): 0.95, (0, 1, 2): 0.98}
    phi = shapley_exact({frozenset(k): v for k, v in table.items()}, 3)
    # by hand: phi_1 = 1/3 (0.6) + 1/6 (0.1) + 1/6 (0.1) + 1/3 (0.03) = 0.73 / 3, etc.
    np.testing.assert_allclose(phi, [0.73 / 3, 0.88 / 3, 1.03 / 3], atol=1e-12)
    assert phi.sum() == pytest.approx(0.88, abs=1e-12)


def test_additive_game_gives_the_weights():
    w = np.array([0.5, -0.2, 1.5, 0.0, 0.25])
    game = lambda s: 3.0 + float(w[list(s)].sum())  # noqa: E731
    np.testing.assert_allclose(shapley_exact(game, 5), w, atol=1e-12)
    # every marginal contribution equals the weight, so any single permutation is exact
    for estimator in (shapley_tmc, shapley_gtg):
        est = estimator(game, 5, seed=0, permutations=2, truncation=0.0)
        np.testing.assert_allclose(est.values, w, atol=1e-12)


def test_every_coalition_is_evaluated_once():
    calls: list[frozenset] = []
    weights = np.linspace(0.1, 1.0, 6)
    game = _concave_game(weights)
    utility = CachedUtility(lambda s: calls.append(s) or game(s), 6)
    shapley_exact(utility, 6)
    assert len(calls) == len(set(calls)) == 64 == utility.num_evaluated
    est = shapley_tmc(utility, 6, seed=1, permutations=20)
    assert len(calls) == 64 and est.coalitions_evaluated == 64  # all from the shared cache


@pytest.mark.parametrize("estimator", [shapley_tmc, shapley_gtg])
def test_estimators_converge_with_fewer_coalitions_than_exact(estimator):
    n = 10
    weights = np.random.default_rng(0).uniform(0.2, 2.0, n)
    game = _concave_game(weights)
    exact = shapley_exact(game, n)
    est = estimator(game, n, seed=0, truncation=0.0)
    assert est.converged and est.permutations < 500
    assert est.coalitions_evaluated < 2**n // 2
    # stated tolerance (the paper's stopping rule is loose): every estimate within 25% of the mean value
    scale = (game(frozenset(range(n))) - game(frozenset())) / n
    assert np.max(np.abs(est.values - exact)) < 0.25 * scale
    assert np.corrcoef(np.argsort(np.argsort(est.values)), np.argsort(np.argsort(exact)))[0, 1] > 0.8
    # more permutations, closer: 200 of them (still fewer coalitions than exact) within 10%
    longer = estimator(game, n, seed=0, truncation=0.0, permutations=200)
    assert longer.coalitions_evaluated < 2**n
    assert np.max(np.abs(longer.values - exact)) < 0.10 * scale


def test_truncation_saves_evaluations():
    n = 10
    game = _concave_game(np.ones(n))
    full = shapley_tmc(game, n, seed=0, permutations=30, truncation=0.0)
    truncated = shapley_tmc(game, n, seed=0, permutations=30, truncation=0.2)
    assert truncated.coalitions_evaluated < full.coalitions_evaluated


def test_guided_sampling_lets_every_player_lead():
    first: list[int] = []
    n = 4

    def game(s):
        if len(s) == 1:
            first.append(next(iter(s)))
        return float(len(s))

    shapley_gtg(game, n, seed=0, permutations=n, truncation=0.0)
    assert sorted(first) == list(range(n))


def test_mean_relative_change():
    history = [np.array([1.0, 2.0])] * 10
    assert mean_relative_change(history) == float("inf")  # fewer than window + 1 estimates
    history = history + [np.array([1.1, 2.0])]
    assert mean_relative_change(history) == pytest.approx(0.1 / 1.1 / 2)


def test_bad_input():
    with pytest.raises(InputError, match="no value for coalition"):
        shapley_exact({frozenset(): 0.0}, 2)
    with pytest.raises(InputError, match="not finite"):
        shapley_exact(lambda s: float("nan"), 2)
    with pytest.raises(InputError, match="permutations"):
        shapley_tmc(lambda s: 0.0, 3, permutations=0)
