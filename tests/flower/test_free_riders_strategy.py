"""Free riders at FlowerTune's scale (20 nodes, two per round, ``KFCAStrategy``'s defaults): nodes that train
nothing and replay the global's change since they last received one (Lin et al. 2019; Fraboni et al. 2021), rescaled
to an honest update's norm. The public strata (``engine.public``, every pair of a round, pool pairs included) pay them
about nothing; without them (``public_steps=0``) the pool pays them like honest nodes.

The honest updates are test_peer_pool_strategy's: a persistent direction (what the global's trajectory shows), a
direction of the round (what only this round's trainers share) and each node's noise.
"""

import random

import numpy as np
import pytest

pytest.importorskip("flwr", reason="Flower is the optional extra kfca-llm[flower] (make install installs it)")

from flwr.app import Array, ArrayRecord  # noqa: E402
from flwr.serverapp.strategy import FedAvg  # noqa: E402
from flower_local import LocalGrid, initial_arrays, pid, reply_with  # noqa: E402
from test_peer_pool_strategy import NODES, update  # noqa: E402

from kfca_llm.flower import KFCAStrategy, verify_ledger  # noqa: E402

ROUNDS, FREE_RIDERS = 40, (4, 9, 15)


def run(ledger, **options) -> KFCAStrategy:
    received: dict[int, dict[str, np.ndarray]] = {}

    def node(message):
        n, t = message.metadata.dst_node_id, int(message.content["config"]["server-round"])
        sent = {k: a.numpy() for k, a in message.content["arrays"].items()}
        honest = update(n, t)
        if n in FREE_RIDERS:  # the change since it last received a global (none the first time), at the honest norm
            last = received.get(n, sent)
            received[n] = sent
            change = {k: sent[k] - last[k] for k in sent}
            honest = {k: c * (np.linalg.norm(honest[k]) / np.linalg.norm(c)) if np.linalg.norm(c) > 0 else c
                      for k, c in change.items()}
        return reply_with(message, ArrayRecord({k: Array(sent[k] + u) for k, u in honest.items()}))

    random.seed(11)  # FedAvg samples its nodes with the random module
    strategy = KFCAStrategy(FedAvg(fraction_train=0.1, fraction_evaluate=0.0), ledger=ledger, keep_signs=True,
                            **options)
    strategy.start(grid=LocalGrid({n: node for n in range(1, NODES + 1)}), initial_arrays=initial_arrays(),
                   num_rounds=ROUNDS)
    return strategy


def means(strategy: KFCAStrategy) -> tuple[float, float, int]:
    """(the free riders' mean reward over their replays, the honest nodes' mean reward, the replays paid)."""
    riders = {pid(n) for n in FREE_RIDERS}
    replays = [v for who in riders for v in [r[who] for t, r in sorted(strategy.rewards.items()) if who in r][1:]]
    honest = [v for r in strategy.rewards.values() for who, v in r.items() if who not in riders]
    return float(np.mean(replays)), float(np.mean(honest)), len(replays)  # a first reply replays nothing (zero)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("free-rider")
    return run(folder / "on.sqlite"), run(folder / "off.sqlite", public_steps=0), folder / "on.sqlite"


def test_the_public_strata_pay_a_replay_of_the_globals_change_about_nothing(runs):
    conditioned, unconditioned, _ = runs
    rider, honest, replays = means(conditioned)
    assert replays >= 6 and honest > 0
    assert abs(rider) <= 0.1 * honest, (rider, honest)
    # Without the strata the same replays are paid like honest work: what the conditioning removes.
    rider_off, honest_off, _ = means(unconditioned)
    assert rider_off > 0.5 * honest_off > 0, (rider_off, honest_off)


def test_the_conditioned_pool_rounds_verify(runs):
    """Pool pairs are scored within the round's strata too: verify rebuilds the pool and recomputes every round."""
    check = verify_ledger(runs[2])
    assert check.ok and {r.status for r in check.rounds} == {"match"}
