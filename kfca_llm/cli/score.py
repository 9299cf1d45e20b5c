"""``kfca-llm score``: KFCA-QP rewards of adapter checkpoints (PEFT directories or .safetensors files)."""

from __future__ import annotations

import argparse
import sys

from ..partition import PENALTY_MODES
from . import DESCRIPTION


def run(args: argparse.Namespace) -> int:
    from ..api import score_checkpoints
    from ..engine.public import PublicConditioning
    from ..report import check_output_path, write_json

    if args.json:
        check_output_path(args.json)  # before scoring, not after printing the table
    report = score_checkpoints(args.paths, reference=args.reference, peers=args.peers, seed=args.seed,
                               penalty=args.penalty, bonus_fraction=args.bonus_fraction, backend=args.backend,
                               device=args.device, duplicates=args.duplicates, public=args.public,
                               conditioning=PublicConditioning(steps=args.public_steps,
                                                               magnitude_buckets=args.public_buckets))
    print(report.table())
    for warning in report.warnings:  # also in the table's notes; on stderr for whoever reads only the JSON
        print(f"kfca-llm: warning: {warning}", file=sys.stderr)
    if args.json:
        write_json(args.json, report.to_dict())
        print(f"wrote {args.json}")
    return 0


def add_parser(subparsers) -> None:
    score = subparsers.add_parser("score", help="score adapter checkpoints (PEFT directories or .safetensors files)",
                                  description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    score.add_argument("paths", nargs="+", help="one adapter per client; the client id is the directory/file name")
    score.add_argument("--reference", default=None,
                       help="previous global adapter: updates are client minus reference")
    score.add_argument("--public", nargs="+", default=None, metavar="EARLIER_GLOBAL",
                       help="earlier global adapters, oldest first (the reference is the newest): pay only for "
                            "agreement the global's public steps do not predict (kfca_llm.engine.public)")
    score.add_argument("--public-steps", type=int, default=5,  # PublicConditioning's (engine.public imports torch)
                       help="sign planes of the global's change over the last 1, 2, 4, ... rounds (default 5; 0: off)")
    score.add_argument("--public-buckets", type=int, default=2,
                       help="magnitude buckets of the newest public step (a power of two; default 2)")
    score.add_argument("--json", default=None, help="also write the report as JSON to this file")
    score.add_argument("--device", default=None, help="stream tensors to this device (e.g. cuda)")
    score.add_argument("--peers", type=int, default=None,
                       help="peers sampled per client (default: every other client)")
    score.add_argument("--seed", type=int, default=0, help="seed of the task partition and draws")
    score.add_argument("--penalty", choices=PENALTY_MODES, default="expected",
                       help="expected: exact expectation of the penalty (default); sampled: the paper's draws")
    score.add_argument("--bonus-fraction", type=float, default=0.5, help="fraction of tasks used as bonus tasks")
    score.add_argument("--backend", choices=("auto", "cpu", "triton", "numpy"), default="auto",
                       help="auto: triton for CUDA devices, cpu otherwise; numpy: the old name of cpu (deprecated)")
    score.add_argument("--duplicates", choices=("flag", "split", "zero"), default="zero",
                       help="clients whose reports are copies of each other: zero (groups are paid nothing, "
                            "default; the JSON keeps the unadjusted rewards for review), split (each group is "
                            "paid as one client), flag (report only)")
    score.set_defaults(handler=run)
