"""Scoring engine: packed sign bits and the backends that pack and count them (``kfca_llm.packer`` streams into it)."""

from .backends import Backend, BackendUnavailable, PackedBuffers, available_backends, get_backend, register_backend
from .cpu import CpuBackend
from .duplicates import (DUPLICATE_POLICIES, DuplicateGroup, DuplicatePair, DuplicateRule, apply_duplicate_policy,
                         disagreement_counts, find_duplicates)
from .layout import Layout, TensorSlot


def _triton_backend() -> Backend:
    # Imported lazily: triton is optional (Linux only) and heavy to import.
    from .triton_backend import TritonBackend

    return TritonBackend()


register_backend("numpy", CpuBackend)
register_backend("triton", _triton_backend)

__all__ = ["DUPLICATE_POLICIES", "Backend", "BackendUnavailable", "CpuBackend", "DuplicateGroup", "DuplicatePair",
           "DuplicateRule", "Layout", "PackedBuffers", "TensorSlot", "apply_duplicate_policy",
           "available_backends", "disagreement_counts", "find_duplicates", "get_backend", "register_backend"]
