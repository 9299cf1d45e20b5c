"""The sampled penalty (the paper's Algorithm 1) in plain numpy, on unpacked booleans.

What the CPU and Triton kernels must reproduce: per ordered pair, the matches of one (p1, p2) draw
per bonus task, the ranks from ``kfca_llm.partition.penalty_ranks``.
"""

from __future__ import annotations

import numpy as np

from kfca_llm.partition import BONUS, PENALTY_1, PENALTY_2, partition_classes, penalty_ranks

from ..sign_pack.reference import unpack_words


def sampled_matches(sign_words: np.ndarray, task_words: np.ndarray, seed: int, bonus_fraction: float,
                    pairs: np.ndarray) -> np.ndarray:
    """int64 [P]: per ordered pair (i, j), matches over one (p1, p2) draw per bonus task."""
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
