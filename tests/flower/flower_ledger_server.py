"""The server side of the ledger crash tests: KFCAStrategy over in-process numpy nodes.

``python flower_ledger_server.py LEDGER --pause-round R`` stops inside round R's ledger transaction
(after its first reward row is written) and prints ``IN-TRANSACTION``, so a test can kill it there;
``--row-delay S`` sleeps S seconds before each row of every round's transaction instead (a slow disk, so
that a kill at a random time often lands inside a transaction). Each round that reached the ledger prints
``ROUND {json}`` with its rewards. ``--keep-signs`` and ``--resume`` are the strategy's options.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time

from flower_local import LocalGrid, initial_arrays, numpy_node
from flwr.serverapp.strategy import FedAvg

from kfca_llm.flower import KFCAStrategy

NODES = {1: "honest", 2: "honest", 3: "honest", 4: "flip", 5: "zero"}


class PausingRows(list):
    """Reward rows that block the writer after the first one: a server stuck mid-transaction."""

    def __init__(self, rows, *, pause_after: int | None = 1, delay: float = 0.0):
        super().__init__(rows)
        self.pause_after, self.delay = pause_after, delay

    def __iter__(self):
        for k, row in enumerate(list.__iter__(self)):
            if k == self.pause_after:
                print("IN-TRANSACTION", flush=True)
                time.sleep(600)
            time.sleep(self.delay)
            yield row


def serve(ledger, *, rounds: int = 3, pause_round: int | None = None, row_delay: float = 0.0, report=print,
          **options) -> KFCAStrategy:
    strategy = KFCAStrategy(FedAvg(fraction_evaluate=0.0), ledger=ledger, seed=3, **options)
    write = strategy.ledger.record_round

    def record_round(entry):
        if entry.round == pause_round:
            entry = dataclasses.replace(entry, rewards=PausingRows(entry.rewards))
        elif row_delay:
            entry = dataclasses.replace(entry, rewards=PausingRows(entry.rewards, pause_after=None, delay=row_delay))
        write(entry)
        report("ROUND " + json.dumps({"round": entry.round, "rewards": strategy.rewards.get(entry.round, {})}))

    strategy.ledger.record_round = record_round
    grid = LocalGrid({node: numpy_node(kind) for node, kind in NODES.items()})
    initial = strategy.resume_arrays() or initial_arrays()
    if rounds > strategy.round_offset:
        strategy.start(grid=grid, initial_arrays=initial, num_rounds=rounds - strategy.round_offset)
    return strategy


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("ledger")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--pause-round", type=int, default=None)
    parser.add_argument("--row-delay", type=float, default=0.0)
    parser.add_argument("--keep-signs", action="store_true")
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--public-steps", type=int, default=None)
    args = parser.parse_args()
    serve(args.ledger, rounds=args.rounds, pause_round=args.pause_round, row_delay=args.row_delay,
          keep_signs=args.keep_signs, resume=args.resume, report=lambda line: print(line, flush=True),
          **({} if args.public_steps is None else {"public_steps": args.public_steps}))
