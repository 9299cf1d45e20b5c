"""Stratum counts in plain numpy: what the CPU and Triton kernels must reproduce.

A coordinate's public stratum is read from ``P`` bit planes (packed like the sign words): stratum
``s = sum_p bit_p << p``, so there are ``2**P`` strata. Per task set (bonus, M_1, M_2) and stratum,
each client's count of negative reports and the set's size there. Unpacked to one bool per
coordinate: slow and obvious.
"""

from __future__ import annotations

import numpy as np

from kfca_llm.partition import BONUS, PENALTY_1, PENALTY_2, partition_classes

from ..sign_pack.reference import unpack_words


def stratum_counts(sign_words: np.ndarray, task_words: np.ndarray, plane_words: np.ndarray, seed: int,
                   bonus_fraction: float) -> tuple[np.ndarray, np.ndarray]:
    """(negatives int64 [3, S, n], sizes int64 [3, S]) with S = 2 ** len(plane_words)."""
    signs = np.stack([unpack_words(row) for row in np.atleast_2d(sign_words)])
    task = unpack_words(task_words)
    planes = np.asarray(plane_words, dtype=np.int32).reshape(-1, np.asarray(task_words).size)
    stratum = np.zeros(task.size, dtype=np.int64)
    for p, plane in enumerate(planes):
        stratum |= unpack_words(plane).astype(np.int64) << p
    classes = partition_classes(np.arange(task.size), seed, bonus_fraction)
    n_strata = 1 << planes.shape[0]
    negatives = np.zeros((3, n_strata, signs.shape[0]), dtype=np.int64)
    sizes = np.zeros((3, n_strata), dtype=np.int64)
    for t in (BONUS, PENALTY_1, PENALTY_2):
        for s in range(n_strata):
            members = task & (classes == t) & (stratum == s)
            sizes[t, s] = members.sum()
            negatives[t, s] = (signs & members).sum(axis=1)
    return negatives, sizes
