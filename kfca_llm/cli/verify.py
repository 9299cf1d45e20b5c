"""``kfca-llm verify LEDGER``: check a reward ledger's hash chain and recompute its rounds from the kept signs.

Exit status 0 when the chain holds, every row reads, no round mismatches or has damaged signs and every
receipt given is in the ledger as signed; 1 otherwise (2: the ledger cannot be read at all, or bad arguments).
``--receipts DIR --server-key KEY.pub``: check the ledger against a participant's signed receipts.
``--node-update FILE --round R [--sent GLOBAL]``: a participant checks that the update it holds is the one scored in
round R, and that the round recorded its values as the update has them (``flower.node_check``).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict


def _node_update(args: argparse.Namespace) -> int:
    from ..errors import InputError
    from ..flower.node_check import check_node, load_update_file

    if args.round is None:
        raise InputError("--node-update needs --round R (the round whose payment to check)")
    update = load_update_file(args.node_update)
    sent = None if args.sent is None else load_update_file(args.sent, "global sent")
    matches = check_node(args.path, update, args.round, args.run, sent)
    if args.json:
        print(json.dumps({"round": args.round, "matches": [asdict(r) | {"values": asdict(v)} for r, v in matches]},
                         indent=2))
    for row, check in matches if not args.json else ():
        print(f"round {row.round} of run {row.run_id[:8]}: this update is the one scored for participant "
              f"{row.participant} (node {row.node_id}), paid {row.reward:+.6f}")
        print(f"    value sketch: {check.status}: {check.detail}")
    if not matches:
        print(f"round {args.round}: no participant was scored with this update's signs (SHA-256 differs)")
    return 0 if matches and all(check.ok for _, check in matches) else 1


def run(args: argparse.Namespace) -> int:
    from ..errors import InputError
    from ..flower.audit import verify_ledger
    from ..flower.recompute import STATUSES
    from ..report import printable

    if args.node_update is not None:
        return _node_update(args)
    if args.server_key is not None and args.receipts is None:
        raise InputError("--server-key is the key the receipts are checked with: give --receipts DIR too")
    check = verify_ledger(args.path, expect_head=args.expect_head, receipts=args.receipts, server_key=args.server_key,
                          backend=args.backend)
    if args.json:
        print(json.dumps({"ok": check.ok, "head": check.head, "chain_errors": check.chain_errors,
                          "bad_rows": check.bad_rows, "receipt_errors": check.receipt_errors,
                          "receipts_checked": check.receipts_checked, "notes": check.notes,
                          "rounds": [asdict(r) for r in check.rounds]}, indent=2))
        return 0 if check.ok else 1
    for r in check.rounds:
        print(f"run {printable(r.run_id[:8])} round {r.round}: {r.status} ({printable(r.detail)})")
        for row in r.rows:
            print(f"    {printable(row)}")
    for note in check.notes:
        print(f"note: {note}")
    for row in check.bad_rows:
        print(f"unreadable: {printable(row)}")
    for problem in check.chain_errors:
        print(f"chain: {printable(problem)}")
    for problem in check.receipt_errors:
        print(f"receipt: {printable(problem)}")
    counts = {s: sum(r.status == s for r in check.rounds) for s in STATUSES}
    verdict = "intact" if not check.chain_errors else "BROKEN"
    if check.bad_rows:
        verdict += f", {len(check.bad_rows)} unreadable row(s)"
    if check.receipts_checked is not None:
        verdict += (f"; {check.receipts_checked} receipt(s) checked, "
                    + ("all in the ledger as signed" if not check.receipt_errors
                       else f"{len(check.receipt_errors)} problem(s)"))
    print(f"chain {verdict} (head {printable(str(check.head))}); " + ", ".join(f"{n} {s}" for s, n in counts.items()))
    return 0 if check.ok else 1


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser("verify", help="verify a KFCA reward ledger: hash chain and recomputed rounds")
    parser.add_argument("path", help="the ledger file (KFCAStrategy(ledger=..., keep_signs=True))")
    parser.add_argument("--expect-head", metavar="HASH", help="the chain head published earlier (detects truncation)")
    parser.add_argument("--receipts", metavar="DIR", help="a folder of signed receipts (*.json) to check the ledger "
                        "against (what a participant was told it was paid)")
    parser.add_argument("--server-key", metavar="KEY", help="with --receipts: the server's published public key "
                        "(the .pub file beside KFCAStrategy's receipt_key, or its 64 hex digits)")
    parser.add_argument("--node-update", metavar="FILE",
                        help="your update (.safetensors or .npz: what you sent minus what you were sent)")
    parser.add_argument("--round", type=int, help="with --node-update: the round to check")
    parser.add_argument("--sent", metavar="FILE", help="with --node-update: the global you were sent that round "
                        "(.safetensors or .npz), to check the rounding slack the round recorded of your values too")
    parser.add_argument("--run", metavar="RUN_ID", help="with --node-update: only this run (a prefix of its id)")
    parser.add_argument("--backend", default="auto", help="scoring backend for the recomputation (default auto)")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.set_defaults(handler=run)
