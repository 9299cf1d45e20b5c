"""Regression of the paper's attack-analysis ordering on the tiny federation (recipes/tiny.toml, seed 0).

The tiny run is shared by the session (``tiny_federation`` in conftest.py). Each assertion has a margin
that a change of torch numerics cannot cross but a real regression does:

* honest beats every attack by at least HONEST_MARGIN (0.03; measured: 0.055 over sparse:0.75);
* sparse:0.75 > sparse:0.5 > sparse:0.25 > 0 by at least SPARSE_MARGIN (0.02; measured >= 0.05);
* the lag chain lagged:2 >= lagged:3 >= lagged:4 >= lagged:5 >= stale may tie within LAG_TOLERANCE
  (0.002; measured steps 0.009-0.017, smallest over seeds 0-5 about 0.004), but must fall by at least
  LAG_DROP (0.02; measured 0.047) from lagged:2 to stale: a lag that stops mattering (every lag the same
  update) or runs backwards (oldest for the shortest lag) fails here;
* |zero|, |random| < FREE_RIDER_BOUND (0.02; chance agreement, per-round noise about 0.005);
* flip < -0.5 x honest (KFCA pays a flipper the negative of the honest reward);
* the categorical-world condition in every round.
"""

import pytest

HONEST_MARGIN = 0.03
SPARSE_MARGIN = 0.02
LAG_TOLERANCE = 0.002
LAG_DROP = 0.02
FREE_RIDER_BOUND = 0.02


@pytest.fixture(scope="module")
def mean(tiny_federation):
    assert tiny_federation.recipe.num_server_rounds == 10
    return tiny_federation.mean_strategy_rewards()


def test_honest_is_highest(mean):
    assert mean["honest"] > 0
    assert all(mean["honest"] > v + HONEST_MARGIN for s, v in mean.items() if s != "honest"), mean


def test_temporal_attacks_lose_reward_with_lag(mean):
    chain = ["lagged:2", "lagged:3", "lagged:4", "lagged:5", "stale"]
    assert all(mean[a] > mean[b] - LAG_TOLERANCE for a, b in zip(chain, chain[1:])), {s: mean[s] for s in chain}
    assert mean["lagged:2"] > mean["stale"] + LAG_DROP


def test_sparse_attacks_interpolate(mean):
    chain = [mean["sparse:0.75"], mean["sparse:0.5"], mean["sparse:0.25"], 0.0]
    assert all(a > b + SPARSE_MARGIN for a, b in zip(chain, chain[1:])), chain


def test_free_riders_earn_nothing(mean):
    assert abs(mean["zero"]) < FREE_RIDER_BOUND
    assert abs(mean["random"]) < FREE_RIDER_BOUND


def test_flip_is_punished(mean):
    assert mean["flip"] < -0.5 * mean["honest"]


def test_categorical_world_holds_every_round(tiny_federation):
    assert [r.categorical_world for r in tiny_federation.rounds] == [True] * 10
    for r in tiny_federation.rounds:
        for p in r.pairs:
            if p.strategy == "honest":
                assert p.delta[0][0] > 0 and p.delta[1][1] > 0 and p.delta[0][1] < 0 and p.delta[1][0] < 0
