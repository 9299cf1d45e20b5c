"""The ``kfca-llm`` command line."""

from __future__ import annotations

import argparse
import logging
import sys
import warnings
from importlib import import_module

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
    parser.add_argument("--duplicates", choices=("flag", "split", "zero"), default="zero",
                        help="clients whose reports are copies of each other: zero (groups are paid nothing, "
                             "default; the JSON keeps the unadjusted rewards for review), split (each group is "
                             "paid as one client), flag (report only)")


def _score(args: argparse.Namespace) -> int:
    from .api import score_checkpoints
    from .report import check_output_path, write_json

    if args.json:
        check_output_path(args.json)  # before scoring, not after printing the table
    report = score_checkpoints(args.paths, reference=args.reference, peers=args.peers, seed=args.seed,
                               penalty=args.penalty, bonus_fraction=args.bonus_fraction, backend=args.backend,
                               device=args.device, duplicates=args.duplicates)
    print(report.table())
    if args.json:
        write_json(args.json, report.to_dict())
        print(f"wrote {args.json}")
    return 0


# Subcommands whose modules import torch, numba or Flower: each is imported only when it is the command,
# so `kfca-llm --help` stays fast. name -> (module, function adding its parser, one-line help).
SUBCOMMANDS = {
    "simulate": (".simulate", "add_simulate_parser",
                 "run a KFCA-FedAvg federation with the attack analysis (the main job)"),
    "fidelity": (".valuation.fidelity", "add_fidelity_parser",
                 "reward fidelity: KFCA, CA and Shapley estimators against exact Shapley"),
    "ledger": (".flower.ledger", "add_ledger_parser",
               "print the totals per node of a KFCA reward ledger (SQLite)"),
}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The command line, with the parser of ``command`` (one of ``SUBCOMMANDS``) in full."""
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
    for name, (module, adder, help_text) in SUBCOMMANDS.items():
        if name == command:
            getattr(import_module(module, __package__), adder)(sub)
        else:  # listed for --help without importing it
            sub.add_parser(name, help=help_text, add_help=False)
    return parser


def _hide_known_third_party_noise() -> None:
    """Two messages every CPU run would print, neither about anything kfca-llm does.

    peft probes transformers' deprecated ``is_gradient_checkpointing``; bitsandbytes, on CPUs with
    AVX512-BF16, reports that an optional 4-bit CPU kernel from the Hugging Face hub is missing.
    """
    warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning)
    logging.getLogger("bitsandbytes.backends.cpu.ops").addFilter(
        lambda record: "gemm_4bit_forward" not in record.getMessage())


# Conditions a user can fix (bad input, no GPU/backend, no bitsandbytes): one line and exit status 2, no
# traceback. Looked up in sys.modules: an exception of a class whose module was never imported cannot occur.
_EXPECTED_ERRORS = (("kfca_llm.errors", "InputError"), ("kfca_llm.engine.backends", "BackendUnavailable"),
                    ("kfca_llm.modeling", "QuantizationUnavailableError"))


def _expected(exc: BaseException) -> bool:
    classes = (getattr(sys.modules.get(module), name, None) for module, name in _EXPECTED_ERRORS)
    return any(cls is not None and isinstance(exc, cls) for cls in classes)


def main(argv: list[str] | None = None) -> int:
    _hide_known_third_party_noise()
    argv = sys.argv[1:] if argv is None else list(argv)
    command = next((arg for arg in argv if not arg.startswith("-")), None)
    args = build_parser(command).parse_args(argv)
    try:
        return args.handler(args)
    except Exception as exc:
        if not _expected(exc):
            raise
        print(f"kfca-llm: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
