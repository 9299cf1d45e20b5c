"""The pool's settings are declared once (``kfca_llm.fl.pool_settings.POOL_KEYS``): ``PoolSettings``, the recipe's keys,
the recipe's pool and ``KFCAStrategy``'s arguments take their defaults and bounds from it."""

import inspect

import pytest

from kfca_llm import InputError
from kfca_llm.fl.peer_pool import PoolSettings
from kfca_llm.fl.pool_settings import POOL_KEYS
from kfca_llm.fl.scoring import pool_arguments, pool_settings
from kfca_llm.recipe import KfcaConfig, RecipeError, load_recipe


def test_the_recipe_keys_are_the_pools_defaults_and_bounds():
    for name, key in POOL_KEYS.items():
        field = KfcaConfig.model_fields[key.argument]
        assert field.default == key.default == getattr(PoolSettings(), name)
        assert field.alias == key.argument.replace("_", "-")
        for bound, value in key.bounds().items():
            assert any(getattr(m, bound, None) == value for m in field.metadata), (name, bound)


@pytest.mark.parametrize("name, value", [("window", 0), ("min_peers", -1), ("pool_peers", -1), ("weight", 0.0),
                                         ("weight", 2e6)])
def test_a_value_out_of_bounds_is_refused_by_the_pool_and_by_the_recipe_alike(name, value):
    with pytest.raises(InputError, match=f"peer pool: {name} must be"):
        PoolSettings(**{name: value})
    key = POOL_KEYS[name].argument.replace("_", "-")
    with pytest.raises(RecipeError, match=key):
        load_recipe("tiny", [f"kfca.{key}={value}"])


def test_the_recipes_pool_and_the_strategys_arguments_derive_from_the_table():
    recipe = load_recipe("tiny", ["kfca.min-peers=3", "kfca.pool-window=4", "kfca.pool-peers=5", "kfca.pool-weight=0.25"])
    settings = pool_settings(recipe)
    assert (settings.min_peers, settings.window, settings.pool_peers, settings.weight) == (3, 4, 5, 0.25)
    arguments = pool_arguments(settings)
    assert arguments == {"min_peers": 3, "pool_window": 4, "pool_peers": 5, "pool_weight": 0.25,
                         "own_replay_limit": settings.own_replay_limit}
    pytest.importorskip("flwr", reason="Flower is the optional extra kfca-llm[flower]")
    from kfca_llm.flower import KFCAStrategy

    signature = inspect.signature(KFCAStrategy.__init__).parameters
    assert {a: signature[a].default for a in arguments} == pool_arguments(PoolSettings())


def test_one_registry_of_rules_names_what_an_earlier_rule_was():
    """``PoolSettings`` and the verifier read the same registry: the rule computed is its newest, an earlier one is
    refused with what it was, an unknown one as no such rule."""
    from kfca_llm.fl.pool_settings import POOL_RULE, POOL_RULES, check_pool_rule

    assert POOL_RULE == max(POOL_RULES) and PoolSettings().rule == POOL_RULE
    check_pool_rule(POOL_RULE)
    with pytest.raises(InputError, match=r"rule 5 \(as 4, within public strata"):
        PoolSettings(rule=5)
    with pytest.raises(InputError, match=r"rule 99 \(no such rule\)"):
        check_pool_rule(99)


@pytest.mark.parametrize("value", ["true", 1, None, 0.0])
def test_waiting_for_the_round_after_is_true_or_false_and_a_ledgers_other_value_is_refused(value):
    """``next_round`` (pool rule 15) is a bool: a ledger's settings naming anything else are refused, briefly."""
    from kfca_llm.fl.pool_store import recorded_pool_settings

    assert PoolSettings().next_round is True and PoolSettings(next_round=False).next_round is False
    with pytest.raises(InputError, match="next_round must be true or false"):
        PoolSettings(next_round=value)
    with pytest.raises(InputError, match="next_round must be true or false, got 'xxxxx"):
        recorded_pool_settings({**PoolSettings().to_dict(), "next_round": "x" * 1000})
    assert recorded_pool_settings({**PoolSettings().to_dict(), "next_round": False}).next_round is False


def test_the_round_after_is_read_only_where_the_model_aggregates_the_deviations():
    """Pool rule 15 reads how the round after a disagreeing pair moved on from it: under ``kfca.aggregate = "honest"``
    (the paper's setting, deviations never reach the model) the recipe's pool leaves it off; aggregating every
    update, or by reward, it is on."""
    assert pool_settings(load_recipe("tiny")).next_round is False
    for aggregate in ("all", "exclude-negative", "reward-weighted"):
        assert pool_settings(load_recipe("tiny", [f"kfca.aggregate={aggregate}"])).next_round is True
