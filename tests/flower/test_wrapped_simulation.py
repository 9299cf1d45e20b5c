"""Every ``kfca.wrapped-strategy`` key in a real Flower run (Flower's simulation engine, Ray): the repository's
ClientApp on 7 nodes (node 6 flips), and one ServerApp that builds the strategy from each key's run config in
turn (``build_strategy``, as the app's ServerApp does) and runs it for one round on the same grid, with
Flower's evaluate round on the held-out rows. One Ray start for the six strategies."""


import pytest
import torch

pytest.importorskip("flwr", reason="Flower is the optional extra kfca-llm[flower] (make install installs it)")

from flwr.app import ArrayRecord  # noqa: E402
from flwr.serverapp import ServerApp  # noqa: E402
from flower_local import run_ray_simulation  # noqa: E402

from kfca_llm.flower.client_app import make_client_app  # noqa: E402
from kfca_llm.flower.server_app import WRAPPED_STRATEGIES, build_strategy  # noqa: E402
from kfca_llm.flower.task import evaluate_global_adapter, initial_adapter, recipe_from_config  # noqa: E402

NODES = 7
# Evaluation on 2 of the 7 nodes (a fifth, raised to Flower's minimum of two): every node holds the same held-out
# rows, so two replies prove the aggregate as well as seven did, at 30 ClientApp calls fewer in the run.
CONFIG = {"num-server-rounds": 1, "num-clients": NODES, "strategy.fraction-train": 1.0, "strategy.fraction-evaluate": 0.2,
          "train.training-arguments.max-steps": 1, "kfca.attackers": "6=flip", "kfca.aggregation": "exclude-negative",
          "kfca.wrapped.num-malicious-nodes": 1, "kfca.wrapped.num-nodes-to-select": 3}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("wrapped")
    done = {}
    server_app = ServerApp()

    @server_app.main()
    def main(grid, context):
        for name in WRAPPED_STRATEGIES:
            config = {**CONFIG, "kfca.wrapped-strategy": name, "kfca.ledger": str(folder / f"{name}.sqlite")}
            recipe = recipe_from_config(config)
            strategy = build_strategy(recipe, config)
            result = strategy.start(grid=grid, initial_arrays=ArrayRecord(initial_adapter(recipe)), num_rounds=1)
            done[name] = (strategy, result)

    run_ray_simulation(server_app, make_client_app(CONFIG), NODES)
    return done


@pytest.mark.parametrize("name", list(WRAPPED_STRATEGIES))
def test_each_wrapped_strategy_runs_in_flower_pays_every_node_and_evaluates_the_global_adapter(runs, name):
    strategy, result = runs[name]
    assert type(strategy.strategy) is WRAPPED_STRATEGIES[name]
    assert len(strategy.rewards[1]) == NODES  # KFCA pays every reply, whatever aggregates them
    assert min(strategy.rewards[1].values()) < 0  # the flipper
    # Bulyan (f = 1) needs 4f + 3 = 7 replies: KFCA left the flipper out, so it refuses, no round produced
    # arrays (Flower's Result keeps none) and the nodes evaluate the initial adapter
    recipe = recipe_from_config(CONFIG)
    aggregated = len(result.arrays) > 0
    assert aggregated is (name != "bulyan")
    initial = initial_adapter(recipe)
    final = result.arrays.to_torch_state_dict() if aggregated else initial
    assert aggregated is not all(torch.equal(final[k], initial[k]) for k in initial)
    evaluated = result.evaluate_metrics_clientapp[1]
    expected = evaluate_global_adapter(recipe, final)
    assert evaluated["eval-loss"] == pytest.approx(expected["loss"], rel=1e-5)
    assert evaluated["eval-accuracy"] == pytest.approx(expected["accuracy"])
