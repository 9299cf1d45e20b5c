"""Pair counts (the binary Gram matrices) on the CPU (numba): 64-bit ``ctpop`` over packed words.

The seeded partition is hashed on the fly per word (``intrinsics.cpu.set_masks64``), so no index array
of size d is built; only the diagonal and the listed pairs are counted.
"""

from __future__ import annotations

import numba
import numpy as np
from numba import prange

from ..intrinsics.cpu import popcount64, set_masks64
from ..numba_setup import configure_numba, serial_and_parallel

configure_numba()  # before the cache=True kernels below are defined

_WORDS_PER_CHUNK = 1 << 14


def _gram_kernel(signs, task, key, t_bonus, t_m1, row_starts, cols, n_groups):
    """Co-negative counts of each client (the Gram diagonal) and of the listed pairs, per task set.

    Pairs are given row by row (CSR): client i's partners are ``cols[row_starts[i]:row_starts[i + 1]]``.
    ``signs`` and ``task`` are viewed as uint64 (two 32-bit words per lane; rows are padded to an
    even number of words). Per chunk of words the three set masks are built once; each row is
    masked once and then every listed pair runs a contiguous AND + popcount reduction over the
    chunk, which LLVM vectorises. Chunks are dealt round-robin to ``n_groups`` groups, so partials
    take ``n_groups`` x (n + pairs) counts of memory however long the rows are.
    """
    n, n_words = signs.shape
    n_pairs = cols.size
    n_chunks = (n_words + _WORDS_PER_CHUNK - 1) // _WORDS_PER_CHUNK
    n_groups = max(min(n_groups, n_chunks), 1)
    diagonal = np.zeros((n_groups, 3, n), dtype=np.int64)
    pair_counts = np.zeros((n_groups, 3, n_pairs), dtype=np.int64)
    sizes = np.zeros((n_groups, 3), dtype=np.int64)
    for group in prange(n_groups):
        masks = np.empty((3, _WORDS_PER_CHUNK), dtype=np.uint64)
        masked = np.empty(_WORDS_PER_CHUNK, dtype=np.uint64)
        for chunk in range(group, n_chunks, n_groups):
            start = chunk * _WORDS_PER_CHUNK
            stop = min(start + _WORDS_PER_CHUNK, n_words)
            width = stop - start
            for k in range(width):
                w = start + k
                t = task[w]
                if t == 0:
                    masks[0, k] = 0
                    masks[1, k] = 0
                    masks[2, k] = 0
                    continue
                masks[0, k], masks[1, k], masks[2, k] = set_masks64(w, t, key, t_bonus, t_m1)
            for s in range(3):
                total = 0
                for k in range(width):
                    total += popcount64(masks[s, k])
                sizes[group, s] += total
                for i in range(n):
                    row_i = signs[i, start:stop]
                    own = 0
                    for k in range(width):
                        masked[k] = row_i[k] & masks[s, k]
                        own += popcount64(masked[k])
                    diagonal[group, s, i] += own
                    for p in range(row_starts[i], row_starts[i + 1]):
                        row_j = signs[cols[p], start:stop]
                        acc = 0
                        for k in range(width):
                            acc += popcount64(masked[k] & row_j[k])
                        pair_counts[group, s, p] += acc
    return diagonal, pair_counts, sizes


_GRAM = serial_and_parallel(_gram_kernel)


def count_pairs(signs: np.ndarray, task: np.ndarray, key, t_bonus, t_m1, rows: np.ndarray,
                cols: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(diagonal int64 [3, n], pair counts int64 [3, P], set sizes int64 [3]) of the pairs (rows[p], cols[p]).

    ``signs`` [n, words] and ``task`` [words] are uint64 views of the packed int32 words (rows padded to
    an even number of words); the pairs are sorted by row. Per task set (bonus, M_1, M_2): the diagonal
    is each client's negative count, a pair's count the tasks where both are negative.
    """
    n = signs.shape[0]
    row_starts = np.searchsorted(rows, np.arange(n + 1)).astype(np.int64)
    parallel = signs.shape[1] > _WORDS_PER_CHUNK  # one chunk of words: one thread
    diagonal, counts, sizes = _GRAM[parallel](signs, task, key, t_bonus, t_m1, row_starts,
                                              np.ascontiguousarray(cols, dtype=np.int64), 4 * numba.get_num_threads())
    return diagonal.sum(axis=0), counts.sum(axis=0), sizes.sum(axis=0)
