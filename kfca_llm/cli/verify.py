"""``kfca-llm verify LEDGER``: check a reward ledger's hash chain and recompute its rounds from the kept signs.

Exit status 0 when the chain holds and no round mismatches, 1 otherwise (2: the ledger cannot be read).
``--node-update FILE --round R``: a participant checks that the update it holds is the one scored in round R.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict


def _node_update(args: argparse.Namespace) -> int:
    from ..errors import InputError
    from ..flower.audit import check_node_update, load_update_file

    if args.round is None:
        raise InputError("--node-update needs --round R (the round whose payment to check)")
    rows = check_node_update(args.path, load_update_file(args.node_update), args.round, args.run)
    if args.json:
        print(json.dumps({"round": args.round, "matches": [asdict(r) for r in rows]}, indent=2))
    for row in rows if not args.json else ():
        print(f"round {row.round} of run {row.run_id[:8]}: this update is the one scored for participant "
              f"{row.participant} (node {row.node_id}), paid {row.reward:+.6f}")
    if not rows:
        print(f"round {args.round}: no participant was scored with this update's signs (SHA-256 differs)")
    return 0 if rows else 1


def run(args: argparse.Namespace) -> int:
    from ..flower.audit import MISMATCH, verify_ledger
    from ..report import printable

    if args.node_update is not None:
        return _node_update(args)
    check = verify_ledger(args.path, expect_head=args.expect_head, backend=args.backend)
    if args.json:
        print(json.dumps({"ok": check.ok, "head": check.head, "chain_errors": check.chain_errors,
                          "notes": check.notes, "rounds": [asdict(r) for r in check.rounds]}, indent=2))
        return 0 if check.ok else 1
    for r in check.rounds:
        print(f"run {r.run_id[:8]} round {r.round}: {r.status} ({printable(r.detail)})")
        for row in r.rows:
            print(f"    {printable(row)}")
    for note in check.notes:
        print(f"note: {note}")
    for problem in check.chain_errors:
        print(f"chain: {printable(problem)}")
    counts = {s: sum(r.status == s for r in check.rounds) for s in ("match", MISMATCH, "unverifiable")}
    print(f"chain {'intact' if not check.chain_errors else 'BROKEN'} (head {check.head}); "
          + ", ".join(f"{n} {s}" for s, n in counts.items()))
    return 0 if check.ok else 1


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser("verify", help="verify a KFCA reward ledger: hash chain and recomputed rounds")
    parser.add_argument("path", help="the ledger file (KFCAStrategy(ledger=..., keep_signs=True))")
    parser.add_argument("--expect-head", metavar="HASH", help="the chain head published earlier (detects truncation)")
    parser.add_argument("--node-update", metavar="FILE",
                        help="your update (.safetensors or .npz: what you sent minus what you were sent)")
    parser.add_argument("--round", type=int, help="with --node-update: the round to check")
    parser.add_argument("--run", metavar="RUN_ID", help="with --node-update: only this run (a prefix of its id)")
    parser.add_argument("--backend", default="auto", help="scoring backend for the recomputation (default auto)")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.set_defaults(handler=run)
