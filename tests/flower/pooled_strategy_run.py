"""The pooled KFCAStrategy run at FlowerTune's scale that the peer-pool tests read: 20 nodes, ``FedAvg(fraction_train=
0.1)`` (two per round), one flipper, over the in-process grid (no Ray). Honest updates share a persistent direction (as
updates of nearby rounds do) plus a per-round one and each node's noise. ``tests/conftest.py`` runs it once per worker
(the ``pooled`` fixture) for the strategy's tests and the ledger's."""

import random

import numpy as np
from flower_local import SHAPES, LocalGrid, initial_arrays, reply_with
from flwr.app import Array, ArrayRecord
from flwr.serverapp.strategy import FedAvg

from kfca_llm.flower import KFCAStrategy

NODES, ROUNDS, FLIPPER = 20, 24, 2  # node 2 trains in rounds 2 (undetermined), 5, 7, 11, 14, 16, 17
PERSISTENT = {k: np.random.default_rng(5).standard_normal(s) for k, s in SHAPES.items()}


def update(node: int, t: int) -> dict[str, np.ndarray]:
    this_round, own = np.random.default_rng(1000 + t), np.random.default_rng(7919 * node + t)
    return {k: (0.6 * PERSISTENT[k] + 0.6 * this_round.standard_normal(s) + own.standard_normal(s)).astype(np.float32)
            * 0.01 for k, s in SHAPES.items()}


def node(message):
    n, t = message.metadata.dst_node_id, int(message.content["config"]["server-round"])
    sent = {k: a.numpy() for k, a in message.content["arrays"].items()}
    sign = -1.0 if n == FLIPPER else 1.0
    return reply_with(message, ArrayRecord({k: Array(sent[k] + sign * u) for k, u in update(n, t).items()}))


def run(ledger, rounds: int = ROUNDS, **options):
    random.seed(7)  # FedAvg samples its nodes with the random module
    strategy = KFCAStrategy(FedAvg(fraction_train=0.1, fraction_evaluate=0.0), ledger=ledger, keep_signs=True,
                            **options)
    result = strategy.start(grid=LocalGrid({n: node for n in range(1, NODES + 1)}), initial_arrays=initial_arrays(),
                            num_rounds=rounds)
    return strategy, result
