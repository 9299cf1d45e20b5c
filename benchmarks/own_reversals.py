"""How a participant's update relates to its own previous one on captured Flower runs: what pool rules 7, 14 and 20
(``fl.pool_reversal.own_relation``) take for a reversal, by kind of update and rounds between the two.

Each captured submission (``flower_few_peers.py --capture``) is judged as the pool judges it, on the sketches of every
earlier submission of the run that joined the pool (the capture replayed: copies never join), and labelled by its node's
attack: ``honest`` (an honest update after an honest one), ``turn`` (a flip after an honest update: a sleeper's turn, an
on-off node's flip), ``back`` (an honest update after a flip) and ``flip-flip``. Printed per label and gap: the
correlation of its signs with its previous update's in standard errors (``sign_correlation_z``: minimum and median), and
how many pool rule 19 (the margins of rules 7 and 14) and rule 20 (the correlation alone, 3 rounds apart or more; the
margins' reversals running against the previous update) reverse. A reversal of an honest update is what must never
happen (it can forfeit what the honest node was paid).

    .venv/bin/python benchmarks/own_reversals.py run1.npz run2.npz ...

``--others`` prints the same correlation between two *different* honest nodes' updates by lag, the reason rule 20
also asks for the pairs of others where they judge: the global overshoots and turns back, and two nodes' updates some
rounds apart can run against each other far more than chance.
"""

from __future__ import annotations

import argparse
import json
import statistics
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kfca_llm.fl import pool_reversal
from kfca_llm.fl.pool_copies import set_bits, sketch
from kfca_llm.fl.pool_reversal import own_relation, sign_correlation_z
from kfca_llm.fl.pool_store import PeerPool

from flower_capture import replay  # this folder: on the path as a script

GAPS = ((1, 1), (2, 4), (5, 16), (17, 10**6))
KINDS = ("honest", "turn", "back", "flip-flip")


@dataclass(frozen=True)
class Submission:
    round: int
    node: int
    words: np.ndarray
    mask: np.ndarray
    flipped: bool | None
    """Whether its node's attack flipped this update; None: neither honest nor flipped (zero, stale, ...)."""


def flipped(attack: str | None, index: int) -> bool | None:
    """Whether an update, its node's ``index``-th (from 0), is a flip under ``attack`` (None: honest)."""
    if attack is None:
        return False
    if attack == "flip":
        return True
    if attack.startswith("flip-after:"):
        return index >= int(attack.split(":", 1)[1])
    if attack == "on-off":
        return index % 2 == 1
    return None


def pooled(path: Path) -> set[tuple[int, str]]:
    """(round, participant) of the capture's submissions that joined the pool's sketches as its replay pays it (copies
    never do)."""
    joined: set[tuple[int, str]] = set()
    add_round = PeerPool.add_round

    def spy(pool, round_, signs, *args, **kwargs):
        joined.update((int(round_), who) for who in signs)
        return add_round(pool, round_, signs, *args, **kwargs)

    PeerPool.add_round = spy
    try:
        replay(path, {})
    finally:
        PeerPool.add_round = add_round
    return joined


def submissions(path: Path) -> list[Submission]:
    """The capture's submissions that joined the pool, in the order they did."""
    joined = pooled(path)
    data = np.load(path)
    meta = json.loads(bytes(data["__meta__"]).decode())
    attacks = {int(p): a for p, a in meta["attacks"].items()}
    seen: dict[int, int] = {}
    out = []
    for k, r in enumerate(meta["rounds"]):
        node_of = meta["partition_of"][str(r["round"])]
        mask = sketch(data[f"{k}.task"])
        for client in sorted(r["clients"]):
            node = node_of[client]
            index = seen.get(node, 0)
            seen[node] = index + 1
            if (r["round"], client) not in joined:
                continue
            out.append(Submission(r["round"], node, sketch(data[f"{k}.signs.{client}"]), mask,
                                  flipped(attacks.get(node), index)))
    return out


def judged(subs: list[Submission]) -> list[dict]:
    """Each submission with a previous one of its node, both honest or flipped: its label, gap, correlation z and
    whether rules 7/14 alone, and with rule 20, reverse it."""
    rows = []
    for k, mine in enumerate(subs):
        before = [s for s in subs[:k] if s.round < mine.round]
        own = [s for s in before if s.node == mine.node]
        if not own or mine.flipped is None or own[-1].flipped is None:
            continue
        previous = own[-1]
        kind = {(False, False): "honest", (False, True): "turn", (True, False): "back", (True, True): "flip-flip"}[
            (previous.flipped, mine.flipped)]
        sketches = [(f"{s.node}@{s.round}", s.words) for s in before]
        bits = set_bits(mine.mask)
        reverses = {}
        # rule 19: no reversal by the correlation alone (ANTI_Z), none asked of the margins' (RUNS_AGAINST_Z)
        for name, anti_z, runs_against_z in (("rule 19", float("inf"), float("-inf")),
                                             ("rule 20", pool_reversal.ANTI_Z, pool_reversal.RUNS_AGAINST_Z)):
            defaults = pool_reversal.ANTI_Z, pool_reversal.RUNS_AGAINST_Z
            pool_reversal.ANTI_Z, pool_reversal.RUNS_AGAINST_Z = anti_z, runs_against_z
            try:
                relation = own_relation(sketches, str(mine.node), mine.round, mine.words, mine.mask)
            finally:
                pool_reversal.ANTI_Z, pool_reversal.RUNS_AGAINST_Z = defaults
            reverses[name] = relation is not None and relation.reverses
        rows.append({"kind": kind, "round": mine.round, "node": mine.node, "gap": mine.round - previous.round,
                     "z": sign_correlation_z(mine.words, previous.words, mine.mask, bits), **reverses})
    return rows


def table(rows: list[dict]) -> str:
    lines = ["| update | rounds since its previous | n | correlation z: min | median | reversed under rule 19 "
             "| under rule 20 |", "|---|---|---|---|---|---|---|"]
    for kind in KINDS:
        for low, high in GAPS:
            found = [r for r in rows if r["kind"] == kind and low <= r["gap"] <= high]
            if found:
                z = [r["z"] for r in found]
                span = f"{low}" if low == high else f"{low}+" if high > 10**5 else f"{low}-{high}"
                lines.append(f"| {kind} | {span} | {len(found)} | {min(z):+.2f} | {statistics.median(z):+.2f} | "
                             f"{sum(r['rule 19'] for r in found)} | {sum(r['rule 20'] for r in found)} |")
    return "\n".join(lines)


def others_table(runs: list[list[Submission]]) -> str:
    """The correlation z of two different honest nodes' updates, by rounds between them."""
    by_lag: dict[int, list[float]] = {}
    for subs in runs:
        honest = [s for s in subs if s.flipped is False]
        for k, mine in enumerate(honest):
            bits = set_bits(mine.mask)
            for other in honest[:k]:
                if other.node != mine.node and other.round < mine.round:
                    band = min((mine.round - other.round - 1) // 8, 5)
                    by_lag.setdefault(band, []).append(sign_correlation_z(mine.words, other.words, mine.mask, bits))
    lines = ["| rounds apart | pairs | mean | standard deviation | min | below -ANTI_Z |", "|---|---|---|---|---|---|"]
    for band, z in sorted(by_lag.items()):
        z = np.asarray(z)
        span = f"{band * 8 + 1}-{band * 8 + 8}" if band < 5 else f"{band * 8 + 1}+"
        lines.append(f"| {span} | {z.size} | {z.mean():+.2f} | {z.std():.2f} | {z.min():+.2f} | "
                     f"{int((z < -pool_reversal.ANTI_Z).sum())} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("captures", nargs="+", type=Path)
    parser.add_argument("--others", action="store_true", help="also two different honest nodes' updates, by lag")
    parser.add_argument("--rows", type=Path, default=None, help="write every judged submission here (JSON)")
    args = parser.parse_args(argv)
    runs = [submissions(path) for path in args.captures]
    rows = [{"capture": path.name, **row} for path, subs in zip(args.captures, runs) for row in judged(subs)]
    print(table(rows))
    if args.rows is not None:
        args.rows.write_text(json.dumps(rows))
    if args.others:
        print()
        print(others_table(runs))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
