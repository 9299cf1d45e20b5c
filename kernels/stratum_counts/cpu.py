"""Stratum counts on the CPU (numba): 64-bit ``ctpop`` over packed words, no per-coordinate unpacking.

Per chunk of words, the ``3 x S`` masks (task set AND stratum) are built once from the partition hash
and the ``P`` public planes (a stratum's word is the AND of each plane or its complement); then every
client's row runs one AND + popcount reduction per mask over the chunk, which LLVM vectorises.
"""

from __future__ import annotations

import numba
import numpy as np
from numba import prange

from ..intrinsics.cpu import popcount64, set_masks64
from ..numba_setup import configure_numba, serial_and_parallel

configure_numba()  # before the cache=True kernels below are defined

# 3 x 64 strata x 1024 words x 8 bytes = 1.5 MiB of masks per thread at the most strata.
_WORDS_PER_CHUNK = 1 << 10


def _strata_kernel(signs, task, planes, key, t_bonus, t_m1, n_groups):
    """(negatives [groups, 3, S, n], sizes [groups, 3, S]): per-group partial counts, chunks dealt round-robin."""
    n, n_words = signs.shape
    n_planes = planes.shape[0]
    n_strata = 1 << n_planes
    n_chunks = (n_words + _WORDS_PER_CHUNK - 1) // _WORDS_PER_CHUNK
    n_groups = max(min(n_groups, n_chunks), 1)
    negatives = np.zeros((n_groups, 3, n_strata, n), dtype=np.int64)
    sizes = np.zeros((n_groups, 3, n_strata), dtype=np.int64)
    for group in prange(n_groups):
        masks = np.empty((3 * n_strata, _WORDS_PER_CHUNK), dtype=np.uint64)
        sets = np.empty(3, dtype=np.uint64)
        for chunk in range(group, n_chunks, n_groups):
            start = chunk * _WORDS_PER_CHUNK
            stop = min(start + _WORDS_PER_CHUNK, n_words)
            width = stop - start
            for k in range(width):
                w = start + k
                t = task[w]
                if t == 0:
                    for m in range(3 * n_strata):
                        masks[m, k] = 0
                    continue
                sets[0], sets[1], sets[2] = set_masks64(w, t, key, t_bonus, t_m1)
                for s in range(n_strata):
                    stratum = t
                    for p in range(n_planes):
                        if (s >> p) & 1:
                            stratum &= planes[p, w]
                        else:
                            stratum &= ~planes[p, w]
                    for c in range(3):
                        masks[c * n_strata + s, k] = sets[c] & stratum
            for m in range(3 * n_strata):
                c, s = m // n_strata, m % n_strata
                total = 0
                for k in range(width):
                    total += popcount64(masks[m, k])
                sizes[group, c, s] += total
                if total == 0:  # no member in this chunk: no client can be negative there
                    continue
                for i in range(n):
                    acc = 0
                    for k in range(width):
                        acc += popcount64(signs[i, start + k] & masks[m, k])
                    negatives[group, c, s, i] += acc
    return negatives, sizes


_STRATA = serial_and_parallel(_strata_kernel)


def stratum_counts(signs: np.ndarray, task: np.ndarray, planes: np.ndarray, key, t_bonus,
                   t_m1) -> tuple[np.ndarray, np.ndarray]:
    """(negatives int64 [3, S, n], sizes int64 [3, S]), S = 2 ** planes.shape[0].

    ``signs`` [n, words], ``task`` [words] and ``planes`` [P, words] are uint64 views of the packed int32
    words (rows padded to an even number of words).
    """
    parallel = signs.shape[1] > _WORDS_PER_CHUNK  # one chunk of words: one thread
    negatives, sizes = _STRATA[parallel](signs, task, np.ascontiguousarray(planes), key, t_bonus, t_m1,
                                         4 * numba.get_num_threads())
    return negatives.sum(axis=0), sizes.sum(axis=0)
