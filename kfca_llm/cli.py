"""The ``kfca-llm`` command line."""

from __future__ import annotations

import argparse
import logging
import sys
import warnings

from .errors import InputError

DESCRIPTION = """\
Knowledge-Free Correlated Agreement (KFCA) rewards for federated adapter tuning.
Each adapter coordinate is a task and a client's report is the sign of its update there: a client earns
its agreement with a peer on bonus coordinates minus the agreement between two different penalty coordinates.
"""


def _add_scoring_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--peers", type=int, default=None,
                        help="peers sampled per client (default: every other client)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the task partition and draws")
    parser.add_argument("--penalty", choices=("expected", "sampled"), default="expected",
                        help="expected: exact expectation of the penalty (default); sampled: the paper's draws")
    parser.add_argument("--bonus-fraction", type=float, default=0.5, help="fraction of tasks used as bonus tasks")
    parser.add_argument("--backend", choices=("auto", "numpy", "triton"), default="auto")


def _score(args: argparse.Namespace) -> int:
    from .api import score_checkpoints
    from .report import write_json

    report = score_checkpoints(args.paths, reference=args.reference, peers=args.peers, seed=args.seed,
                               penalty=args.penalty, bonus_fraction=args.bonus_fraction, backend=args.backend,
                               device=args.device)
    print(report.table())
    if args.json:
        write_json(args.json, report.to_dict())
        print(f"wrote {args.json}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kfca-llm", description=DESCRIPTION,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    score = sub.add_parser("score", help="score adapter checkpoints (PEFT directories or .safetensors files)",
                           description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    score.add_argument("paths", nargs="+", help="one adapter per client; the client id is the directory/file name")
    score.add_argument("--reference", default=None,
                       help="previous global adapter: updates are client minus reference")
    score.add_argument("--json", default=None, help="also write the report as JSON to this file")
    score.add_argument("--device", default=None, help="stream tensors to this device (e.g. cuda)")
    _add_scoring_options(score)
    score.set_defaults(handler=_score)
    from .simulate import add_simulate_parser
    add_simulate_parser(sub)
    from .flower.ledger import add_ledger_parser
    add_ledger_parser(sub)
    return parser


def _hide_known_third_party_noise() -> None:
    """Two messages every CPU run would print, neither about anything kfca-llm does.

    peft probes transformers' deprecated ``is_gradient_checkpointing``; bitsandbytes, on CPUs with
    AVX512-BF16, reports that an optional 4-bit CPU kernel from the Hugging Face hub is missing.
    """
    warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning)
    logging.getLogger("bitsandbytes.backends.cpu.ops").addFilter(
        lambda record: "gemm_4bit_forward" not in record.getMessage())


def main(argv: list[str] | None = None) -> int:
    _hide_known_third_party_noise()
    args = build_parser().parse_args(argv)
    try:
        return args.handler(args)
    except InputError as exc:
        print(f"kfca-llm: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
