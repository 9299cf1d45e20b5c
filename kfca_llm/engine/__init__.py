"""Scoring engine: the backends that pack sign bits and count them, and the integer contract.

``backends`` (the registry), ``cpu`` and ``triton_backend`` (launchers: buffers in, the kernels of
``kfca_llm.kernels`` run, integers out), ``labels`` (KFCA-D's launcher), ``layout`` (where each tensor's
bits go), ``stats`` (integer counts -> every float of a reward), ``duplicates`` (copy detection from the
counts). ``kfca_llm.packer`` streams into it.
"""

import importlib.util

from ..errors import BackendUnavailable
from .backends import Backend, PackedBuffers, available_backends, get_backend, register_backend
from .cpu import CpuBackend
from .duplicates import (DUPLICATE_POLICIES, DuplicateGroup, DuplicatePair, DuplicateRule, apply_duplicate_policy,
                         disagreement_counts, find_duplicates)
from .layout import FlatUpdate, Layout, TensorSlot


def _triton_backend() -> Backend:
    if importlib.util.find_spec("triton") is None:
        raise BackendUnavailable("the triton backend needs the 'triton' package (Linux only)")
    # Imported when first asked for: triton is slow to import and reads TRITON_INTERPRET when its kernels are defined.
    from .triton_backend import TritonBackend

    return TritonBackend()


register_backend("cpu", CpuBackend)
register_backend("triton", _triton_backend)

__all__ = ["DUPLICATE_POLICIES", "Backend", "BackendUnavailable", "CpuBackend", "DuplicateGroup", "DuplicatePair",
           "DuplicateRule", "FlatUpdate", "Layout", "PackedBuffers", "TensorSlot", "apply_duplicate_policy",
           "available_backends", "disagreement_counts", "find_duplicates", "get_backend", "register_backend"]
