"""Regression of the paper's attack-analysis ordering on the tiny federation (recipes/tiny.toml, seed 0).

The ordering is a property of the data, not of the seed: it held with the same margins' signs for seeds
0-5 when this test was written (smallest margin over those seeds: lagged:3 - lagged:4 = +0.0045; see the
report of the federated pipeline). A sign error anywhere in packing or counting makes honest lose to flip,
so this test fails on it.
"""

from pathlib import Path

import pytest

from kfca_llm.federated import FederationOptions, run_federation
from kfca_llm.recipe import load_recipe

TINY = Path(__file__).resolve().parent.parent / "recipes" / "tiny.toml"
FREE_RIDER_BOUND = 0.02  # |mean reward| of zero/random: chance agreement only (per-round noise is ~0.005)


@pytest.fixture(scope="module")
def run():
    recipe = load_recipe(TINY, ["kfca.seed=0"])
    assert recipe.num_server_rounds == 10
    return run_federation(recipe, FederationOptions(progress=False))


@pytest.fixture(scope="module")
def mean(run):
    return run.mean_rewards()


def test_honest_is_highest(mean):
    assert mean["honest"] > 0
    assert all(mean["honest"] > v for s, v in mean.items() if s != "honest"), mean


def test_temporal_attacks_lose_reward_with_lag(mean):
    chain = ["lagged:2", "lagged:3", "lagged:4", "lagged:5", "stale"]
    assert all(mean[a] > mean[b] for a, b in zip(chain, chain[1:])), {s: mean[s] for s in chain}


def test_sparse_attacks_interpolate(mean):
    assert mean["sparse:0.75"] > mean["sparse:0.5"] > mean["sparse:0.25"] > 0


def test_free_riders_earn_nothing(mean):
    assert abs(mean["zero"]) < FREE_RIDER_BOUND
    assert abs(mean["random"]) < FREE_RIDER_BOUND


def test_flip_is_punished(mean):
    assert mean["flip"] < -0.5 * mean["honest"]


def test_categorical_world_holds_every_round(run):
    assert [r.categorical_world for r in run.rounds] == [True] * 10
    for r in run.rounds:
        for p in r.pairs:
            if p.strategy in (None, "honest"):
                assert p.delta[0][0] > 0 and p.delta[1][1] > 0 and p.delta[0][1] < 0 and p.delta[1][0] < 0
