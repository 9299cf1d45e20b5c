"""Both front ends take their replies from the one rule (``kfca_llm.fl.aggregate.SELECTION_RULES``):
``kfca-llm simulate``'s ``kfca.aggregate`` and ``KFCAStrategy(aggregation=...)``."""

from pathlib import Path

import pytest

pytest.importorskip("flwr", reason="Flower is the optional extra kfca-llm[flower] (make install installs it)")

import torch  # noqa: E402
from flower_local import LocalGrid, initial_arrays, numpy_node  # noqa: E402
from flower_strategy_runs import RecordingFedAvg  # noqa: E402

from kfca_llm.fl import aggregate  # noqa: E402
from kfca_llm.fl.client import ClientUpdate  # noqa: E402
from kfca_llm.fl.rounds import RoundAggregation, aggregate_round  # noqa: E402
from kfca_llm.fl.scoring import Submission  # noqa: E402
from kfca_llm.flower import KFCAStrategy  # noqa: E402
from kfca_llm.recipe import load_recipe  # noqa: E402

TINY = Path(__file__).resolve().parents[2] / "recipes" / "tiny.toml"
REWARDS = {"a": 0.2, "b": 0.0, "c": -0.1, "d": 0.05}


def _round(rewards):
    """One round of 1-element updates, one per client, at 10 examples each."""
    updates = {cid: {"w": torch.tensor([float(i + 1)])} for i, cid in enumerate(sorted(rewards))}
    trained = {cid: ClientUpdate(u, 10, 0.0, 0.0) for cid, u in updates.items()}
    submissions = [Submission(cid, "honest", u, 10) for cid, u in updates.items()]
    return RoundAggregation(1, {"w": torch.zeros(1)}, trained, submissions, dict(rewards))


def _recipe(mode):
    return load_recipe(TINY, [f"kfca.aggregate={mode}"])


def test_both_front_ends_take_their_replies_from_the_one_rule(monkeypatch):
    """Swap the shared rule for exclude-negative (keep only the lowest-paid reply): simulate and KFCAStrategy
    both follow, so neither carries a rule of its own."""
    def lowest_only(rewards, weights):
        lowest = min(rewards, key=rewards.get)
        return {lowest: weights[lowest]}

    nodes = {1: numpy_node("honest"), 2: numpy_node("honest"), 3: numpy_node("honest"), 4: numpy_node("flip")}

    def flower_kept():
        inner = RecordingFedAvg()
        strategy = KFCAStrategy(inner, ledger=None, aggregation="exclude-negative")
        strategy.start(grid=LocalGrid(nodes), initial_arrays=initial_arrays(), num_rounds=1)
        return strategy, [m.metadata.src_node_id for m in inner.received[1]]

    strategy, kept = flower_kept()
    assert kept == [1, 2, 3]  # the shared rule as shipped: the flip node (paid < 0) is left out
    assert set(aggregate_round(_recipe("exclude-negative"), _round(REWARDS))[1]) == {"a", "b", "d"}

    monkeypatch.setitem(aggregate.SELECTION_RULES, "exclude-negative", lowest_only)
    strategy, kept = flower_kept()
    rewards = strategy.rewards[1]
    assert kept == [4] and min(rewards, key=rewards.get).startswith("key:")
    assert set(aggregate_round(_recipe("exclude-negative"), _round(REWARDS))[1]) == {"c"}


def test_both_front_ends_hand_the_pools_verdicts_and_the_weak_verdict_rule_to_the_one_rule(monkeypatch, tmp_path):
    """Two replies a round (each short of min_peers in-round peers): simulate's ``kfca.weak-verdict`` and
    ``KFCAStrategy(weak_verdict=...)`` both reach ``fl.aggregate``'s weak-verdict step with the scoring's
    verdicts. Swapped for a rule that leaves out every short reply, both aggregate nothing; as shipped both
    keep the honest pair of round 1 (paid > 0 in its round and by the empty pool alike)."""
    from kfca_llm.fl.rounds import FederationOptions, run_federation

    seen = []

    def every_short_reply_out(rule, verdicts):
        seen.append((rule, sorted(verdicts.short)))
        return verdicts.short, frozenset(), frozenset()

    nodes = {1: numpy_node("honest"), 2: numpy_node("honest")}

    def flower_kept():
        inner = RecordingFedAvg()
        strategy = KFCAStrategy(inner, ledger=None, aggregation="exclude-negative", weak_verdict="confirm-always")
        strategy.start(grid=LocalGrid(nodes), initial_arrays=initial_arrays(), num_rounds=1)
        return strategy, [m.metadata.src_node_id for m in inner.received.get(1, [])]

    recipe = load_recipe(TINY, ["num-clients=4", "strategy.fraction-train=0.5", "num-server-rounds=1",
                                "train.training-arguments.max-steps=1", "kfca.attacks=[]",
                                "kfca.aggregate=exclude-negative", "kfca.weak-verdict=confirm-always",
                                "train.save-client-updates=false"])

    def simulate_kept():
        report = run_federation(recipe, FederationOptions(progress=False, cpu=True, evaluate=False)).to_report()
        return report["round_records"][0]["aggregated"], report["round_records"][0]["clients"]

    assert flower_kept()[1] == [1, 2]
    kept, clients = simulate_kept()
    assert set(kept) == set(clients) and len(clients) == 2

    monkeypatch.setattr(aggregate, "_weak", every_short_reply_out)
    strategy, kept = flower_kept()
    assert kept == [] and seen == [("confirm-always", sorted(strategy.rewards[1]))]
    kept, clients = simulate_kept()
    assert kept == {} and seen[1] == ("confirm-always", sorted(clients))
