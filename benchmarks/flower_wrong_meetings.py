"""Which rule ranked each flipping update's meeting with an honest node in captured Flower runs, and where the meetings
paid wrongly come from (benchmarks/ROBUSTNESS.md, pool rule 19).

Each capture (``flower_few_peers.py --capture``) is paid again under this version's rule (``flower_capture.replay``)
while a read-only watcher sees every scoring's ranking (``fl.peer_pool.rank_pairs``: its evidence and its result). A
meeting's *ruling* is what ranked the pair at the last scoring of its round (the one whose pay stands: in its round,
or the settlement): ``judges`` (the rounds after it, pool rules 15, 18 and 19), ``trajectory`` (the verdicts without the
public strata, pool rule 6), ``lineage`` (one of the two turned by its own lineage, pool rule 7), ``records`` (verdicts
plus records, or reputations), or ``agreeing`` (the pair agreed: nothing ranked it); ``held``: the pair waited for the
rounds after it. Prints every meeting paid wrongly with its ruling, the rulings of all meetings and of the wrong ones,
and how often the trajectory ranked an honest-flip pair right as its round was scored::

    .venv/bin/python benchmarks/flower_wrong_meetings.py run1.npz run2.npz ...
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path
from typing import NamedTuple

import numpy as np

import kfca_llm.fl.peer_pool as peer_pool
from kfca_llm.fl.pool_store import VERDICT_GATE
from kfca_llm.fl.pool_weights import trajectory_settles

from flower_capture import replay  # this folder: on the path as a script
from flower_few_peers import flip_meetings, kinds_by_round


class Ruling(NamedTuple):
    rule: str
    held: bool
    horizon: int | None
    """The horizon of the scoring (None: as the round was scored)."""
    higher: bool
    """The scorer ranked above its peer."""


def ruling_of(ev, c: str, p: str) -> str:
    """What ranked the in-round pair (c, p) of ``ev`` (``fl.pool_reward.rank_pairs``' order, the last one standing)."""
    if ev.pay[(c, p)] >= 0:
        return "agreeing"
    if (c, p) in ev.next_round:
        return "judges"
    if c in ev.blind and p in ev.blind and trajectory_settles(ev.blind[c], ev.blind[p], VERDICT_GATE):
        return "trajectory"
    if p in ev.verdict and (c in ev.turned) != (p in ev.turned):
        return "lineage"
    return "records"


def rulings(path: Path) -> tuple[dict, dict[tuple[int, int], Ruling], list[tuple[int, int, int, Ruling]]]:
    """(the replay's JSON, (round, partition) -> the ruling of its disagreeing or agreeing in-round pair at the last
    scoring of its round, every (round, partition, peer partition, ruling) as its round was scored)."""
    meta = json.loads(bytes(np.load(path)["__meta__"]).decode())
    partition = {int(t): {c: int(p) for c, p in who.items()} for t, who in meta["partition_of"].items()}
    last, first = {}, []
    original = peer_pool.rank_pairs

    def watch(ev, pool, horizon):
        ranked = original(ev, pool, horizon)
        for (c, p), (mine, theirs) in ranked[0].items():
            if (c, p) in ev.in_round_keys and c in partition[ev.round] and p in partition[ev.round]:
                found = Ruling(ruling_of(ev, c, p), (c, p) in ev.held, horizon, theirs is not None and mine > theirs)
                last[(ev.round, partition[ev.round][c])] = found
                if horizon is None:
                    first.append((ev.round, partition[ev.round][c], partition[ev.round][p], found))
        return ranked

    peer_pool.rank_pairs = watch
    try:
        out = replay(path, {})
    finally:
        peer_pool.rank_pairs = original
    return out, last, first


def kinds(out: dict) -> dict[tuple[int, int], str]:
    """(round, partition) -> "honest", "flipping" or the node's attack there."""
    attacks = {int(p): a for p, a in out["attacks"].items()}
    by_round = kinds_by_round(((r["round"], map(int, r["rewards"])) for r in out["rounds"]), attacks)
    return {(t, p): kind for t, found in by_round.items() for p, kind in found.items()}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("captures", nargs="+", type=Path)
    args = parser.parse_args(argv)
    every, wrong, trajectory = Counter(), Counter(), Counter()
    for path in args.captures:
        out, last, first = rulings(path)
        attacks = {int(p): a for p, a in out["attacks"].items()}
        kind = kinds(out)
        for m in flip_meetings(out["rounds"], attacks):
            ruling = last.get((m.round, m.partner), Ruling("unscored", False, None, False))
            every[ruling.rule] += 1
            if not m.undetermined and not m.right:
                wrong[ruling.rule] += 1
                print(f"{path.name} round {m.round}: honest {m.partner} {m.partner_paid:+.4f}, flipping {m.flipper} "
                      f"{m.flipper_paid:+.4f}: {ruling.rule}{' (held)' if ruling.held else ''}, scored at "
                      f"{'its round' if ruling.horizon is None else f'round {ruling.horizon}'}")
        for t, p, q, ruling in first:
            if ruling.rule == "trajectory" and kind[(t, p)] == "honest" and kind[(t, q)] == "flipping":
                trajectory["right" if ruling.higher else "wrong"] += 1
    print(f"{len(args.captures)} captures; meetings by ruling: {dict(every)}; paid wrongly: {dict(wrong)}")
    print(f"honest-flip pairs the trajectory ranked as their round was scored: {dict(trajectory)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
