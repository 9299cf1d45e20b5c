"""Sign packing in plain numpy: slow, obvious, what the CPU and Triton kernels must reproduce word for word.

Element ``e`` of a tensor is bit ``e % 32`` (least significant first) of word ``e // 32``; padding bits
past the last element are 0.
"""

from __future__ import annotations

import numpy as np

from ..intrinsics import WORD_BITS


def pack_words(bits: np.ndarray) -> np.ndarray:
    """Pack a bool vector into int32 words, bit e % 32 of word e // 32 (padding bits are 0)."""
    n_words = -(-bits.size // WORD_BITS)
    padded = np.zeros(n_words * WORD_BITS, dtype=bool)
    padded[: bits.size] = bits
    return np.packbits(padded, bitorder="little").view("<u4").astype(np.uint32).view(np.int32)


def unpack_words(words: np.ndarray) -> np.ndarray:
    return np.unpackbits(np.ascontiguousarray(words).astype("<i4").view(np.uint8), bitorder="little").astype(bool)


def pack_signs(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(negative words, non-zero words) of one tensor's values; -0.0 is zero, not negative."""
    flat = np.asarray(values, dtype=np.float64).ravel()
    return pack_words(flat < 0), pack_words(flat != 0)
