"""``kfca-llm ledger PATH [--json | --csv]``: balances per participant identity of a KFCA reward ledger.

Exit status 0; 1 when a row cannot be read as its type (each is named on stderr and left out of the
balances); 2 when the file is not a ledger.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
from dataclasses import asdict

MAX_FAILURES_SHOWN = 20
CSV_COLUMNS = ["participant", "label", "node_ids", "total", "rounds", "mean", "std_error",
               "distinguishable_from_zero", "undetermined_rounds", "settled_rounds"]
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def _one_line(reason: str, width: int = 160) -> str:
    """A failure reason as one printable line (a node's error text may hold tracebacks and ANSI codes)."""
    line = "".join(c if c.isprintable() else " " for c in (reason.strip().splitlines() or [""])[0])
    return line if len(line) <= width else line[:width - 3] + "..."


def csv_text(value) -> str:
    """A text cell that no spreadsheet reads as a formula (one starting with = + - @, tab or CR gets a ' first)
    nor as two rows (control characters, a carriage return included, are written as Python escapes)."""
    from ..text import printable

    text = "" if value is None else str(value)
    return printable("'" + text if text.startswith(_FORMULA_START) else text)


def _yes_no(value: bool | None) -> str:
    return "" if value is None else ("yes" if value else "no")


def _short(participant: str) -> str:
    kind, _, rest = participant.partition(":")
    return f"{kind}:{rest[:16]}..." if kind == "key" and len(rest) > 16 else participant


def run(args: argparse.Namespace) -> int:
    from rich.markup import escape

    import sys

    from ..flower.ledger import read_ledger
    from ..flower.ledger_rows import DISTINGUISHABLE_Z, SCORED, ledger_summary
    from ..text import printable, text_table

    contents = read_ledger(args.path)
    summary = ledger_summary(contents)
    for row in contents.bad_rows:  # on stderr: the table or JSON on stdout stays what it says it is
        print(f"kfca-llm ledger: unreadable {printable(row)} (left out of the balances)", file=sys.stderr)
    if args.json:
        print(json.dumps({"totals": summary, "runs": len({r.run_id for r in contents.rounds}),
                          "participants": [asdict(p) for p in contents.participants],
                          "rounds": [asdict(r) for r in contents.rounds],
                          "failures": [asdict(f) for f in contents.failures],
                          "settlements": [asdict(t) for t in contents.settlements], "bad_rows": contents.bad_rows},
                         indent=2))
    elif args.csv:
        buffer = io.StringIO()
        writer = csv.writer(buffer, lineterminator="\n")
        writer.writerow(CSV_COLUMNS)
        for s in summary:
            writer.writerow([csv_text(s["participant"]), csv_text(s["label"]), csv_text(" ".join(s["node_ids"])),
                             repr(s["total"]), s["rounds"], repr(s["mean"]),
                             "" if s["std_error"] is None else repr(s["std_error"]),
                             _yes_no(s["distinguishable_from_zero"]), s["undetermined_rounds"], s["settled_rounds"]])
        print(buffer.getvalue(), end="")
    else:
        scored = sum(r.status == SCORED for r in contents.rounds)
        notes = [f"{len({r.run_id for r in contents.rounds})} run(s), {len(contents.rounds)} round(s) recorded "
                 f"({scored} scored), {len(contents.failures)} failure(s)"]
        notes += [f"round {f.round} of run {f.run_id[:8]}: node {f.node_id}: {escape(_one_line(f.reason))}"
                  for f in contents.failures[:MAX_FAILURES_SHOWN]]
        if len(contents.failures) > MAX_FAILURES_SHOWN:
            notes.append(f"... {len(contents.failures) - MAX_FAILURES_SHOWN} more failure(s) (--json lists all)")
        undetermined = sum(bool(r.undetermined) for r in contents.rounds)
        if undetermined:
            notes.append(f"{undetermined} round(s) undetermined: a participant had fewer than min_peers distinct peers, "
                         "so its reward could not tell who deviated then (raise the clients per round or the pool "
                         f"window); {len(contents.settlements)} of their rewards settled by later rounds or the run's "
                         "last (counted with the settled reward)")
        notes.append(f"!= 0: the mean is more than {DISTINGUISHABLE_Z} standard errors from zero (two-sided 5%; "
                     "- below 2 rounds)")
        rows = [(str(k), _short(s["participant"]), s["label"] or "", " ".join(s["node_ids"]), f"{s['total']:+.6f}",
                 str(s["rounds"]), f"{s['mean']:+.6f}", "-" if s["std_error"] is None else f"{s['std_error']:.6f}",
                 _yes_no(s["distinguishable_from_zero"]) or "-",
                 f"{s['undetermined_rounds']} ({s['settled_rounds']} settled)" if s["undetermined_rounds"] else "0")
                for k, s in enumerate(summary, start=1)]
        print(text_table(f"KFCA reward ledger {args.path}",
                         ["#", "participant", "label", "node ids", "total reward", "rounds", "mean", "std error",
                          "!= 0", "undetermined"], rows, notes, width=140))
    return 1 if contents.bad_rows else 0


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser("ledger", help="print the balances per participant of a KFCA reward ledger")
    parser.add_argument("path", help="the ledger file (KFCAStrategy(ledger=...))")
    form = parser.add_mutually_exclusive_group()
    form.add_argument("--json", action="store_true", help="print balances, participants, rounds and failures as JSON")
    form.add_argument("--csv", action="store_true", help="print the balances per participant as CSV")
    parser.set_defaults(handler=run)
