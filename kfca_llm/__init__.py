"""kfca-llm: Knowledge-Free Correlated Agreement rewards for federated LLM adapter tuning.

Every adapter coordinate is a task and a client's report is the sign of its update there; a
client earns agreement with a peer on bonus coordinates minus agreement between two different
penalty coordinates (the paper's multi-task peer prediction with the KFCA score 1{r1 == r2}).
"""

import logging
from importlib import import_module

from .errors import InputError
from . import attacks_public  # noqa: F401  registers the free riders beside the built-in attacks

# bitsandbytes (which peft imports) looks for an optional 4-bit CPU kernel in the Hugging Face hub package
# `kernels` on CPUs with AVX512-BF16, and warns in every process where that package is absent (kfca-llm runs
# no hub code; from the repository root `import kernels` finds this repository's kernels/ folder, with the same
# result): in the CLI, Flower's ServerApp and every Ray worker. Set here, before anything imports
# bitsandbytes, that one message is dropped wherever kfca_llm is used.
logging.getLogger("bitsandbytes.backends.cpu.ops").addFilter(
    lambda record: "gemm_4bit_forward" not in record.getMessage())

__version__ = "0.1.0"

__all__ = ["InputError", "RewardReport", "SignPacker", "score_checkpoints", "score_labels", "score_updates"]

# Imported on first use (PEP 562): torch and numba take a second to import, and `kfca-llm --help`
# or `from kfca_llm import InputError` need neither.
_LAZY = {"RewardReport": ".report", "SignPacker": ".packer", "score_checkpoints": ".api", "score_labels": ".api",
         "score_updates": ".api"}


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(import_module(_LAZY[name], __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(__all__))
