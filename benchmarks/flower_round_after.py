"""What the rounds around a disagreeing pair say about which of the two deviated, measured on captured Flower runs.

Every pair of a round (``flower_few_peers.py --capture``) whose two sign vectors agree on less than half the tasks and
of which exactly one participant is honest (by the capture's attack schedule: a flipping node while it flips, a free
rider always) is compared with round t + k's other participants: does the honest one agree more with them, on average
over them, than its partner? Those participants are the round's submissions that are not its pair's participants,
not a constant report (a zero update: one sign on every task) and not a resubmission (within 2% of the signs of an
earlier submission of the same partition); ``coherent`` asks two or more of them agreeing with each other on half the
tasks or more, as pool rule 15 does (``fl.pool_next``); ``single`` takes rounds with one. Prints, per k and per kind of
partner, the pairs measured and how many the honest one won (benchmarks/ROBUSTNESS.md, pool rule 15)::

    .venv/bin/python benchmarks/flower_round_after.py run1.npz run2.npz ...

``--agreeing`` measures the other pairs: two usable participants agreeing on half the tasks or more, both honest or
both flipping (two flipped updates agree, and are paid as an honest pair is). Against a coherent round t + k, each
pair's *higher* share of agreement with that round's other participants (each member's mean over them, less one
half) is what a rule holding such a pair could read: the quantiles of it per kind, and how many pairs of each kind
stand below each threshold (benchmarks/ROBUSTNESS.md, flip meets flip)::

    .venv/bin/python benchmarks/flower_round_after.py --agreeing --lags 1,2 run1.npz run2.npz ...

``--agreeing --chained`` measures them against the judges pool rule 18 would give them instead (a coherent round after,
or through the rounds after it where it disagrees with itself): how many flip-flip pairs such a rule would reach::

    .venv/bin/python benchmarks/flower_round_after.py --agreeing --chained --thresholds=-0.08,-0.1 run1.npz ...

``--judges`` takes each usable participant of round t + k alone as the judge of each disagreeing pair, counted by that
judge's kind in its round (honest, flipping, or its attack while it does not flip): an honest judge alone is decisive,
a flipping one decisive the other way (pool rule 18, benchmarks/ROBUSTNESS.md)::

    .venv/bin/python benchmarks/flower_round_after.py --judges --lags 1,2 run1.npz run2.npz ...
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path

import numpy as np

from flower_few_peers import kinds_by_round  # this folder: on the path as a script
from kfca_llm.fl.pool_next import WAITING, judges
from kfca_llm.fl.pool_store import PoolEntry

REPLAY_LIMIT = 0.02
"""A submission within this share of the signs of an earlier one of the same partition is a resubmission."""


def bits(words: np.ndarray) -> np.ndarray:
    return np.unpackbits(np.asarray(words, dtype=np.int32).view(np.uint8)).astype(bool)


def load(path: Path) -> tuple[dict[int, dict[int, np.ndarray]], dict[int, np.ndarray], dict[int, str]]:
    """(round -> partition -> sign bits, round -> task bits, partition -> its attack)."""
    data = np.load(path)
    meta = json.loads(bytes(data["__meta__"]).decode())
    partition_of = {int(t): {c: int(p) for c, p in who.items()} for t, who in meta["partition_of"].items()}
    signs, tasks = {}, {}
    for k, r in enumerate(meta["rounds"]):
        t = r["round"]
        tasks[t] = bits(data[f"{k}.task"])
        signs[t] = {partition_of[t][c]: bits(data[f"{k}.signs.{c}"]) for c in r["clients"] if c in partition_of[t]}
    return signs, tasks, {int(p): a for p, a in meta["attacks"].items()}


def usable(signs, tasks) -> dict[int, list[int]]:
    """Round -> its partitions that are neither a constant report nor a resubmission."""
    seen: dict[int, list[np.ndarray]] = {}
    out = {}
    for t in sorted(signs):
        on = tasks[t]
        out[t] = []
        for p, s in signs[t].items():
            constant = s[on].all() or not s[on].any()
            replay = any(np.mean(s[on] != e[on]) <= REPLAY_LIMIT for e in seen.get(p, ()))
            if not constant and not replay:
                out[t].append(p)
        for p, s in signs[t].items():
            seen.setdefault(p, []).append(s)
    return out


def disagreeing_pairs(signs, tasks, attacks):
    """Each round t of two participants, one honest and one deviating (a flipping node while it flips, a free rider
    always), whose signs agree on less than half the tasks: (t, the honest one, the deviating one, its kind), with
    each round's kind of every participant (``kinds``: round -> partition -> "honest", "flipping" or its attack)."""
    kinds = kinds_by_round(((t, signs[t]) for t in sorted(signs)), attacks)
    pairs = []
    for t in sorted(signs):
        honest = [p for p in signs[t] if kinds[t][p] == "honest"]
        deviating = [p for p in signs[t] if kinds[t][p] == "flipping" or kinds[t][p].startswith("free-ride")]
        if len(signs[t]) != 2 or len(honest) != 1 or not deviating:
            continue
        (h,), (d,) = honest, deviating
        if np.mean(signs[t][h][tasks[t]] == signs[t][d][tasks[t]]) < 0.5:
            pairs.append((t, h, d, kinds[t][d]))
    return pairs, kinds


def measure(path: Path, lags, coherent: bool, counts: Counter) -> None:
    signs, tasks, attacks = load(path)
    ok = usable(signs, tasks)
    for t, h, d, kind in disagreeing_pairs(signs, tasks, attacks)[0]:
        for k in lags:
            others = [p for p in ok.get(t + k, ()) if p not in (h, d)]
            on = tasks[t] & tasks.get(t + k, tasks[t])
            if coherent and (len(others) < 2 or any(np.mean(signs[t + k][x][on] == signs[t + k][y][on]) < 0.5
                                                    for i, x in enumerate(others) for y in others[i + 1:])):
                continue
            if not coherent and len(others) != 1:
                continue
            mean = {p: np.mean([np.mean(signs[t][p][on] == signs[t + k][o][on]) for o in others]) for p in (h, d)}
            counts[(k, kind, "pairs")] += 1
            counts[(k, kind, "honest agrees more")] += bool(mean[h] > mean[d])


def judged_by_one(path: Path, lags, counts: Counter) -> None:
    """Each disagreeing pair of ``measure`` against each usable participant of round t + k alone (not of the pair),
    counted by that judge's kind there (pool rule 18: which one of a round after that disagrees with itself judges)."""
    signs, tasks, attacks = load(path)
    ok = usable(signs, tasks)
    pairs, kinds = disagreeing_pairs(signs, tasks, attacks)
    for t, h, d, _ in pairs:
        for k in lags:
            on = tasks[t] & tasks.get(t + k, tasks[t])
            for j in (p for p in ok.get(t + k, ()) if p not in (h, d)):
                judge = kinds[t + k][j]
                counts[(k, judge, "pairs")] += 1
                counts[(k, judge, "honest agrees more")] += bool(
                    np.mean(signs[t][h][on] == signs[t + k][j][on]) > np.mean(signs[t][d][on] == signs[t + k][j][on]))


def agreeing_pairs(path: Path, lags, shares: dict, chained: bool = False) -> None:
    """Add to ``shares[(k, kind)]`` the higher agreement share (less 1/2) of each agreeing pair of ``path`` with round
    t + k's coherent other participants; kind: ``"honest"`` (neither flips there: a sleeper before its turn, an on-off
    node between flips count) or ``"flipping"`` (both flip); a pair of one of each is ``"mixed"``. ``chained``: against
    the judges pool rule 18 would give the pair instead (``fl.pool_next.judges`` over the usable submissions of the
    next ``WINDOW`` rounds, sign agreement on the pair's tasks standing in for KFCA's payment), under k ``"judges"``."""
    signs, tasks, attacks = load(path)
    ok = usable(signs, tasks)
    kinds = kinds_by_round(((t, signs[t]) for t in sorted(signs)), attacks)

    def share(t, p, u, q):
        on = tasks[t] & tasks.get(u, tasks[t])
        return float(np.mean(signs[t][p][on] == signs[u][q][on])) - 0.5

    for t in sorted(signs):
        flipping = {p for p in signs[t] if kinds[t][p] == "flipping"}
        if len(signs[t]) != 2 or len(ok[t]) != 2 or share(t, ok[t][0], t, ok[t][1]) < 0:
            continue
        kind = ("honest", "mixed", "flipping")[len(flipping)]
        if chained:
            found = rule_judges(t, ok, lambda u, p, v, q: float(np.mean(signs[u][p][tasks[t]] == signs[v][q][tasks[t]]))
                                - 0.5)
            if found:
                higher = max(np.mean([share(t, p, u, q) for u, q in found]) for p in ok[t])
                shares.setdefault(("judges", kind), []).append(higher)
            continue
        for k in lags:
            others = [p for p in ok.get(t + k, ()) if p not in ok[t]]
            if len(others) < 2 or any(share(t + k, x, t + k, y) < 0
                                      for i, x in enumerate(others) for y in others[i + 1:]):
                continue
            higher = max(np.mean([share(t, p, t + k, o) for o in others]) for p in ok[t])
            shares.setdefault((k, kind), []).append(higher)


WINDOW = 10
"""Rounds after a pair that ``rule_judges`` looks through (the pool's default window)."""


def rule_judges(t: int, ok: dict[int, list[int]], agreement) -> list[tuple[int, int]] | None:
    """(round, partition) of the judges pool rule 18 gives round t's pair ``ok[t]`` from the usable submissions of the
    rounds after it (``agreement(u, p, v, q)``: their sign agreement less 1/2 on round t's tasks, standing in for
    KFCA's payment; usable submissions are never constant reports: each entry's one word holds one set bit of the
    all-set task word, which ``fl.pool_next.one_sign`` reads as not constant)."""
    by_round: dict[int, list[PoolEntry]] = {}
    for u in range(t + 1, t + WINDOW + 1):
        by_round[u] = [PoolEntry(u, str(q), np.ones(1, dtype=np.int32)) for q in sorted(ok.get(u, ()), key=str)]
    where = {e.name: (e.round, int(e.participant)) for entries in by_round.values() for e in entries}
    found = judges(t + 1, frozenset(map(str, ok[t])), by_round, np.full(1, -1, dtype=np.int32),
                   lambda x, y: agreement(*where[x], *where[y]), t + WINDOW)
    return None if found is None or found is WAITING else [where[n] for n in found.names]


def print_agreeing(shares: dict, thresholds) -> None:
    print("| k | pair | pairs | higher share: min | 1% | 5% | median | 95% | max | "
          + " | ".join(f"below {x:+.2f}" for x in thresholds) + " |")
    print("|---|---|---|---|---|---|---|---|---|" + "---|" * len(thresholds))
    for (k, kind), values in sorted(shares.items()):
        q = np.quantile(values, [0, 0.01, 0.05, 0.5, 0.95, 1])
        label = k if isinstance(k, str) else f"{k:+d}"
        print(f"| {label} | {kind} | {len(values)} | " + " | ".join(f"{v:+.3f}" for v in q) + " | "
              + " | ".join(str(sum(v < x for v in values)) for x in thresholds) + " |")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("captures", nargs="+", type=Path)
    parser.add_argument("--lags", type=lambda v: [int(k) for k in v.split(",")], default=[-2, -1, 1, 2, 3],
                        help="the rounds t + k compared, comma-separated (default -2,-1,1,2,3)")
    parser.add_argument("--single", action="store_true", help="rounds with one usable participant, not coherent ones")
    parser.add_argument("--agreeing", action="store_true", help="agreeing pairs (both honest or both flipping) instead")
    parser.add_argument("--chained", action="store_true",
                        help="with --agreeing: against the judges pool rule 18 would give each pair (--lags ignored)")
    parser.add_argument("--judges", action="store_true",
                        help="each participant of round t + k alone as the judge, counted by its kind there")
    parser.add_argument("--thresholds", type=lambda v: [float(x) for x in v.split(",")], default=[-0.06, -0.07, -0.08],
                        help="with --agreeing: count the pairs whose higher share stands below each (comma-separated)")
    args = parser.parse_args(argv)
    if args.agreeing:
        shares: dict = {}
        for path in args.captures:
            agreeing_pairs(path, args.lags, shares, args.chained)
        print(f"{len(args.captures)} captures, agreeing pairs against "
              + ("the judges pool rule 18 gives them" if args.chained else "a coherent round t + k"))
        print_agreeing(shares, args.thresholds)
        return 0
    counts: Counter = Counter()
    for path in args.captures:
        if args.judges:
            judged_by_one(path, args.lags, counts)
        else:
            measure(path, args.lags, not args.single, counts)
    print(f"{len(args.captures)} captures, round t + k "
          + ("each participant alone" if args.judges else "with one usable participant" if args.single else "coherent"))
    print(f"| k | {'judge' if args.judges else 'partner'} | pairs | the honest one agrees more |")
    print("|---|---|---|---|")
    for k, kind in sorted({(k, kind) for k, kind, _ in counts}):
        pairs, won = counts[(k, kind, "pairs")], counts[(k, kind, "honest agrees more")]
        print(f"| {k:+d} | {kind} | {pairs} | {won} ({won / pairs:.0%}) |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
