"""Pair counts (the binary Gram matrices) in plain numpy: what the CPU and Triton kernels must reproduce.

Co-negative counts per task set: ``popcount(s_i & s_j & set)`` with ``np.bitwise_count`` on uint32
words, one pass per pair and set, the partition taken from ``kfca_llm.partition.partition_classes``.
"""

from __future__ import annotations

import numpy as np

from kfca_llm.partition import BONUS, PENALTY_1, PENALTY_2, partition_classes

from ..intrinsics import WORD_BITS
from ..sign_pack.reference import pack_words


def binary_gram(sign_words: np.ndarray, task_words: np.ndarray, seed: int,
                bonus_fraction: float) -> tuple[np.ndarray, np.ndarray]:
    """(gram int64 [3, n, n], sizes int64 [3]): co-negative counts and members of each task set."""
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
    return gram, sizes
