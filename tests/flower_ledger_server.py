"""The server side of the ledger crash test: KFCAStrategy over in-process numpy nodes.

``python flower_ledger_server.py LEDGER --pause-round R`` stops inside round R's ledger transaction
(after its first reward row is written) and prints ``IN-TRANSACTION``, so the test can kill it there.
Each round that reached the ledger prints ``ROUND {json}`` with its rewards.
"""

from __future__ import annotations

import argparse
import json
import time

from flower_local import LocalGrid, initial_arrays, numpy_node
from flwr.serverapp.strategy import FedAvg

from kfca_llm.flower import KFCAStrategy

NODES = {1: "honest", 2: "honest", 3: "honest", 4: "flip", 5: "zero"}


class PausingRows(list):
    """Reward rows that block the writer after the first one: a server stuck mid-transaction."""

    def __iter__(self):
        for k, row in enumerate(list.__iter__(self)):
            if k == 1:
                print("IN-TRANSACTION", flush=True)
                time.sleep(600)
            yield row


def serve(ledger, *, rounds: int = 3, pause_round: int | None = None, report=print) -> KFCAStrategy:
    strategy = KFCAStrategy(FedAvg(fraction_evaluate=0.0), ledger=ledger, seed=3)
    write = strategy.ledger.record_round

    def record_round(server_round, *, rewards, **kwargs):
        write(server_round, rewards=PausingRows(rewards) if server_round == pause_round else rewards, **kwargs)
        report("ROUND " + json.dumps({"round": server_round, "rewards": strategy.rewards[server_round]}))

    strategy.ledger.record_round = record_round
    grid = LocalGrid({node: numpy_node(kind) for node, kind in NODES.items()})
    strategy.start(grid=grid, initial_arrays=initial_arrays(), num_rounds=rounds)
    return strategy


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("ledger")
    parser.add_argument("--pause-round", type=int, default=None)
    args = parser.parse_args()
    serve(args.ledger, pause_round=args.pause_round, report=lambda line: print(line, flush=True))
