"""``kfca-llm ledger PATH [--json | --csv]``: totals per node of a KFCA reward ledger."""

from __future__ import annotations

import argparse
import csv
import io
import json
from dataclasses import asdict

MAX_FAILURES_SHOWN = 20


def _one_line(reason: str, width: int = 160) -> str:
    """A failure reason as one printable line (a node's error text may hold tracebacks and ANSI codes)."""
    line = "".join(c if c.isprintable() else " " for c in (reason.strip().splitlines() or [""])[0])
    return line if len(line) <= width else line[:width - 3] + "..."


def run(args: argparse.Namespace) -> int:
    from rich.markup import escape

    from ..flower.ledger import SCORED, ledger_summary, read_ledger
    from ..report import text_table

    contents = read_ledger(args.path)
    summary = ledger_summary(contents)
    if args.json:
        print(json.dumps({"totals": summary, "runs": len({r.run_id for r in contents.rounds}),
                          "rounds": [asdict(r) for r in contents.rounds],
                          "failures": [asdict(f) for f in contents.failures]}, indent=2))
    elif args.csv:
        buffer = io.StringIO()
        writer = csv.DictWriter(buffer, fieldnames=["node_id", "total", "rounds", "mean"], lineterminator="\n")
        writer.writeheader()
        writer.writerows(summary)
        print(buffer.getvalue(), end="")
    else:
        scored = sum(r.status == SCORED for r in contents.rounds)
        notes = [f"{len({r.run_id for r in contents.rounds})} run(s), {len(contents.rounds)} round(s) recorded "
                 f"({scored} scored), {len(contents.failures)} failure(s)"]
        notes += [f"round {f.round} of run {f.run_id[:8]}: node {f.node_id}: {escape(_one_line(f.reason))}"
                  for f in contents.failures[:MAX_FAILURES_SHOWN]]
        if len(contents.failures) > MAX_FAILURES_SHOWN:
            notes.append(f"... {len(contents.failures) - MAX_FAILURES_SHOWN} more failure(s) (--json lists all)")
        print(text_table(f"KFCA reward ledger {args.path}", ["#", "node", "total reward", "rounds", "mean"],
                         [(str(k), s["node_id"], f"{s['total']:+.6f}", str(s["rounds"]), f"{s['mean']:+.6f}")
                          for k, s in enumerate(summary, start=1)], notes))
    return 0


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser("ledger", help="print the totals per node of a KFCA reward ledger (SQLite)")
    parser.add_argument("path", help="the ledger file (KFCAStrategy(ledger=...))")
    form = parser.add_mutually_exclusive_group()
    form.add_argument("--json", action="store_true", help="print totals, rounds and failures as JSON")
    form.add_argument("--csv", action="store_true", help="print the totals per node as CSV")
    parser.set_defaults(handler=run)
