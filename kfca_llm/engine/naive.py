"""Plain-numpy reference of the packed engine: slow, obvious, used by tests to check the fast paths.

Packs with ``np.packbits``, counts with ``np.bitwise_count`` on uint32 words (one pass per pair and
set), draws the sampled penalty on unpacked booleans. The fast backends (numba on the CPU, Triton on
the GPU) must reproduce its packed words and integer counts exactly.
"""

from __future__ import annotations

import numpy as np

from ..partition import BONUS, PENALTY_1, PENALTY_2, partition_classes, penalty_ranks
from .layout import WORD_BITS
from .stats import RoundCounts


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


def round_counts(sign_words: np.ndarray, task_words: np.ndarray, seed: int, bonus_fraction: float) -> RoundCounts:
    """Co-negative counts per task set: popcount (``np.bitwise_count`` on uint32) of s_i & s_j & set."""
    signs = np.ascontiguousarray(sign_words, dtype=np.int32).view(np.uint32)
    task = np.ascontiguousarray(task_words, dtype=np.int32).view(np.uint32)
    classes = partition_classes(np.arange(task.size * WORD_BITS), seed, bonus_fraction)
    n = signs.shape[0]
    gram = np.zeros((3, n, n), dtype=np.int64)
    sizes = np.zeros(3, dtype=np.int64)
    for s in (BONUS, PENALTY_1, PENALTY_2):
        in_set = pack_words(classes == s).view(np.uint32) & task
        sizes[s] = np.bitwise_count(in_set).sum()
        for i in range(n):
            for j in range(n):
                gram[s, i, j] = np.bitwise_count(signs[i] & signs[j] & in_set).sum()
    return RoundCounts(gram, sizes)


def sampled_matches(sign_words: np.ndarray, task_words: np.ndarray, seed: int, bonus_fraction: float,
                    pairs: np.ndarray) -> np.ndarray:
    """Algorithm 1's sampled penalty: per ordered pair, matches over one (p1, p2) draw per bonus task."""
    neg = np.stack([unpack_words(row) for row in sign_words])
    task = unpack_words(task_words)
    classes = partition_classes(np.arange(task.size), seed, bonus_fraction)
    bonus = np.flatnonzero(task & (classes == BONUS))
    m1_coords = np.flatnonzero(task & (classes == PENALTY_1))
    m2_coords = np.flatnonzero(task & (classes == PENALTY_2))
    out = np.zeros(len(pairs), dtype=np.int64)
    for k, (i, j) in enumerate(pairs):
        rank1, rank2 = penalty_ranks(bonus, seed, int(i), int(j), m1_coords.size, m2_coords.size)
        out[k] = np.count_nonzero(neg[i, m1_coords[rank1]] == neg[j, m2_coords[rank2]])
    return out
