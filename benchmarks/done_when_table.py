"""Issue 39's done-when, run by run and in total, from the round JSONs of Flower benchmark runs
(``flower_few_peers.py --out``) or their replays (``flower_capture.py --out-dir``).

    .venv/bin/python benchmarks/done_when_table.py /tmp/replayed/*.json

A run meets the whole done-when when every meeting of an honest node with a flipping update paid the honest node > 0
and more, every node that deviated ended below every honest node's mean, honest participations paid < 0 were at most
2% of the run's, and none was charged back (taken for an own resubmission, or forfeiting as turned). "Every node that
deviated" leaves out a node whose attack never started (a ``flip-after:K`` sleeper sampled at most K times, an
``on-off`` node sampled once); "every deviator" counts it.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from flower_few_peers import flip_meetings, paid_by_node  # this folder: on the path as a script

HONEST_BELOW_ZERO = 0.02


def deviated(attack: str, participations: int) -> bool:
    """Whether a node under ``attack``, sampled ``participations`` times, submitted a deviating update."""
    if attack.startswith("flip-after:"):
        return participations > int(attack.split(":", 1)[1])
    if attack == "on-off":
        return participations >= 2
    return participations > 0


def judge(rounds: list[dict], attack_of: dict[int, str]) -> dict:
    every = flip_meetings(rounds, attack_of)
    met = [m for m in every if not m.undetermined]
    paid = paid_by_node(rounds)
    means = {p: sum(v) / len(v) for p, v in paid.items()}
    honest = [v for p, values in paid.items() if p not in attack_of for v in values]
    lowest = min(m for p, m in means.items() if p not in attack_of)
    deviators = {p: m for p, m in means.items() if p in attack_of}
    charged = sum(p not in attack_of for r in rounds for p in [*r.get("resubmitted", ()), *r.get("forfeited", ())])
    out = {"meetings": len(met), "right": sum(m.right for m in met), "unpaid": len(every) - len(met),
           "honest": len(honest), "below_zero": sum(v < 0 for v in honest), "at_zero": sum(v == 0 for v in honest),
           "charged": charged, "lowest": lowest,
           "every_deviator": all(m < lowest for m in deviators.values()),
           "every_deviated": all(m < lowest for p, m in deviators.items() if deviated(attack_of[p], len(paid[p]))),
           "above": [f"{attack_of[p]} {m:+.4f}" for p, m in sorted(deviators.items()) if m >= lowest]}
    out["whole"] = (out["right"] == out["meetings"] and out["every_deviated"] and out["charged"] == 0
                    and out["below_zero"] <= HONEST_BELOW_ZERO * out["honest"])
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path)
    args = parser.parse_args(argv)
    print("| run | meetings right | unpaid | honest paid < 0 | charged back | lowest honest mean | above it | whole |")
    print("|---|---|---|---|---|---|---|---|")
    found = []
    for path in args.runs:
        data = json.loads(path.read_text())
        j = judge(data["rounds"], {int(p): a for p, a in data["attacks"].items()})
        found.append(j)
        above = ", ".join(j["above"]) or "-"
        print(f"| {path.stem} | {j['right']} of {j['meetings']} | {j['unpaid']} | {j['below_zero']} of {j['honest']} | "
              f"{j['charged']} | {j['lowest']:+.4f} | {above} | {'yes' if j['whole'] else 'no'} |")
    total = {k: sum(j[k] for j in found) for k in ("meetings", "right", "unpaid", "honest", "below_zero", "at_zero",
                                                   "charged", "every_deviator", "every_deviated", "whole")}
    print(f"\n{len(found)} runs: meetings right {total['right']} of {total['meetings']}, never settled "
          f"{total['unpaid']}; honest paid < 0 {total['below_zero']} of {total['honest']} "
          f"({100 * total['below_zero'] / max(total['honest'], 1):.2f}%), at 0 {total['at_zero']}, charged back "
          f"{total['charged']}; every deviator below every honest node {total['every_deviator']}, every node that "
          f"deviated {total['every_deviated']}; the whole done-when {total['whole']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
