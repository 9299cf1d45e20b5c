"""The ``kfca-llm`` command line: one module per subcommand (argument parsing lives here, not in domain modules)."""

from __future__ import annotations

import argparse
import sys
import warnings
from importlib import import_module

DESCRIPTION = """\
Knowledge-Free Correlated Agreement (KFCA) rewards for federated adapter tuning.
Each adapter coordinate is a task and a client's report is the sign of its update there: a client earns
its agreement with a peer on bonus coordinates minus the agreement between two different penalty coordinates.
"""


# One module of this package per subcommand, each with ``add_parser(subparsers)``. A module is imported only
# when it is the command (they import torch, numba or Flower), so `kfca-llm --help` stays fast.
# name -> one-line help shown by --help.
SUBCOMMANDS = {
    "score": "score adapter checkpoints (PEFT directories or .safetensors files)",
    "simulate": "run a KFCA-FedAvg federation with the attack analysis (the main job)",
    "fidelity": "reward fidelity: KFCA, CA and Shapley estimators against exact Shapley",
    "ledger": "print the balances per participant of a KFCA reward ledger (SQLite)",
    "verify": "verify a KFCA reward ledger: hash chain and recomputed rounds",
    "check": "check rewards against expectations (the attack ordering; JUnit XML for CI)",
}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The command line, with the parser of ``command`` (one of ``SUBCOMMANDS``) in full."""
    from .. import __version__

    parser = argparse.ArgumentParser(prog="kfca-llm", description=DESCRIPTION,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"kfca-llm {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, help_text in SUBCOMMANDS.items():
        if name == command:
            import_module(f"{__name__}.{name}").add_parser(sub)
        else:  # listed for --help without importing it
            sub.add_parser(name, help=help_text, add_help=False)
    return parser


def _hide_known_third_party_noise() -> None:
    """A warning every CPU run would print, not about anything kfca-llm does: peft probes transformers'
    deprecated ``is_gradient_checkpointing`` (bitsandbytes' missing hub kernel: see ``kfca_llm/__init__.py``)."""
    warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning)


# Conditions a user can fix (bad input, no GPU/backend, no bitsandbytes): one line and exit status 2, no
# traceback. Looked up in sys.modules: an exception of a class whose module was never imported cannot occur.
_EXPECTED_ERRORS = (("kfca_llm.errors", "InputError"), ("kfca_llm.errors", "BackendUnavailable"),
                    ("kfca_llm.modeling", "QuantizationUnavailableError"))


def _expected(exc: BaseException) -> bool:
    classes = (getattr(sys.modules.get(module), name, None) for module, name in _EXPECTED_ERRORS)
    return any(cls is not None and isinstance(exc, cls) for cls in classes)


def main(argv: list[str] | None = None) -> int:
    _hide_known_third_party_noise()
    # Python hides a DeprecationWarning raised outside __main__; the command's user should see ours (an old
    # backend name, for one).
    warnings.filterwarnings("default", category=DeprecationWarning, module=r"kfca_llm\.")
    argv = sys.argv[1:] if argv is None else list(argv)
    command = next((arg for arg in argv if not arg.startswith("-")), None)
    if not argv:  # what a first try types: the help, not "the following arguments are required"
        build_parser().print_help()
        return 0
    args = build_parser(command).parse_args(argv)
    try:
        return args.handler(args)
    except Exception as exc:
        if not _expected(exc):
            raise
        print(f"kfca-llm: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2

