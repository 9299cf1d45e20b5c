"""KFCA-D's integer counts on the CPU (numba): labels on a shared data set, one task per example.

Kernels over a [clients, tasks] array of small integer labels. Every count is an integer and
the score is the identity (Definition 3.2), so the payments built from them equal
``mechanism.mtpp_terms`` and ``joint_counts`` bit for bit (tests check it), while a round costs one
pass over the tasks per scored pair instead of several numpy calls per pair, and the all-pairs
disagreement matrix of copy detection is one vectorised comparison loop instead of n^2 numpy calls.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.extending import intrinsic

from kfca_llm.partition import BONUS, DRAW2_SALT, PENALTY_1, PENALTY_2, pair_keys

from ..intrinsics.cpu import ir_popcount, mix32
from ..numba_setup import configure_numba, serial_and_parallel

configure_numba()  # before the cache=True kernels below are defined


@intrinsic
def _differ64(typingctx, a, b, start):
    """How many of a[start:start + 64] and b[start:start + 64] differ: one vector compare into a 64-bit mask
    and a popcount (LLVM's own vectorisation widened every comparison to a 64-bit counter, 3x slower)."""
    width = a.dtype.bitwidth

    def codegen(context, builder, signature, args):
        vector_type = ir.VectorType(ir.IntType(width), 64)

        def load(k):
            array = context.make_array(signature.args[k])(context, builder, args[k])
            return builder.load(builder.bitcast(builder.gep(array.data, [args[2]]), vector_type.as_pointer()),
                                align=width // 8)

        differ = builder.bitcast(builder.icmp_unsigned("!=", load(0), load(1)), ir.IntType(64))
        return ir_popcount(builder, differ)

    return types.int64(a, b, start), codegen


@njit(inline="always")
def _disagreement_row(labels, i, out):
    a = labels[i]
    full = a.size // 64 * 64
    for j in range(i + 1, labels.shape[0]):
        b = labels[j]
        count = 0
        for t in range(0, full, 64):
            count += _differ64(a, b, t)
        for t in range(full, a.size):
            count += a[t] != b[t]
        out[i, j] = count
        out[j, i] = count


def _disagreements(labels):
    """int64 [n, n]: tasks where clients i and j give different labels.

    Rows i and n - 1 - i share one parallel iteration, so every thread gets the same share of the triangle.
    """
    n = labels.shape[0]
    out = np.zeros((n, n), dtype=np.int64)
    for first in prange((n + 1) // 2):
        _disagreement_row(labels, first, out)
        if n - 1 - first != first:
            _disagreement_row(labels, n - 1 - first, out)
    return out


def _pair_counts(labels, classes, pairs, num_labels):
    """(joint [P, L, L] over all tasks, bonus agreements [P]) of each ordered pair (client, peer)."""
    n_pairs = pairs.shape[0]
    joints = np.zeros((n_pairs, num_labels, num_labels), dtype=np.int64)
    bonus_agreements = np.zeros(n_pairs, dtype=np.int64)
    for p in prange(n_pairs):
        a = labels[pairs[p, 0]]
        b = labels[pairs[p, 1]]
        joint = joints[p]
        agree = 0
        for t in range(a.size):
            joint[a[t], b[t]] += 1
            agree += (classes[t] == BONUS) & (a[t] == b[t])
        bonus_agreements[p] = agree
    return joints, bonus_agreements


def _penalty_histograms(labels, classes, num_labels):
    """int64 [n, 2, L]: how often each client gives each label on M_1 and on M_2."""
    n, m = labels.shape
    out = np.zeros((n, 2, num_labels), dtype=np.int64)
    for i in prange(n):
        for t in range(m):
            if classes[t] == PENALTY_1:
                out[i, 0, labels[i, t]] += 1
            elif classes[t] == PENALTY_2:
                out[i, 1, labels[i, t]] += 1
    return out


def _sampled_matches(labels, bonus, penalty_1, penalty_2, pairs, keys, draw2_salt):
    """Matches of Algorithm 1's draws per ordered pair: ``partition.penalty_ranks``'s ranks, label equality."""
    n_pairs = pairs.shape[0]
    m1 = np.uint64(penalty_1.size)
    m2 = np.uint64(penalty_2.size)
    out = np.zeros(n_pairs, dtype=np.int64)
    for p in prange(n_pairs):
        a = labels[pairs[p, 0]]
        b = labels[pairs[p, 1]]
        matches = 0
        for k in range(bonus.size):
            u1 = mix32(np.uint32(bonus[k]) ^ keys[p])
            u2 = mix32(u1 ^ draw2_salt)
            rank1 = (np.uint64(u1) * m1) >> np.uint64(32)
            rank2 = (np.uint64(u2) * m2) >> np.uint64(32)
            matches += a[penalty_1[rank1]] == b[penalty_2[rank2]]
        out[p] = matches
    return out


_DISAGREEMENTS = serial_and_parallel(_disagreements)
_PAIR_COUNTS = serial_and_parallel(_pair_counts)
_PENALTY_HISTOGRAMS = serial_and_parallel(_penalty_histograms)
_SAMPLED_MATCHES = serial_and_parallel(_sampled_matches)
_PARALLEL_FROM = 1 << 21  # label comparisons (about 1 ms of work): below it one thread beats waking the pool


def compact_labels(rows, num_labels: int) -> np.ndarray:
    """[n, m] labels (rows already checked to lie in [0, num_labels)) in the narrowest unsigned dtype that holds
    them: the comparison loops then cover 64 tasks per vector, and no wide intermediate array is built."""
    rows = list(rows)
    out = np.empty((len(rows), len(rows[0])), dtype=np.uint8 if num_labels <= 256 else np.uint16)
    for k, row in enumerate(rows):
        out[k] = row
    return out


def label_disagreements(labels: np.ndarray) -> np.ndarray:
    """int64 [n, n]: tasks where each two clients' labels differ (``labels``: [n, m] from ``compact_labels``)."""
    n, m = labels.shape
    return _DISAGREEMENTS[n * n // 2 * m >= _PARALLEL_FROM](labels)


def label_pair_counts(labels: np.ndarray, classes: np.ndarray, pairs: np.ndarray,
                      num_labels: int) -> tuple[np.ndarray, np.ndarray]:
    """(joint tables [P, L, L] over every task, agreements on the bonus tasks [P]) of the ordered pairs."""
    pairs = np.ascontiguousarray(pairs, dtype=np.int64)
    return _PAIR_COUNTS[len(pairs) * labels.shape[1] >= _PARALLEL_FROM](labels, classes, pairs, num_labels)


def label_penalty_histograms(labels: np.ndarray, classes: np.ndarray, num_labels: int) -> np.ndarray:
    """int64 [n, 2, L]: each client's label counts on M_1 and M_2 (the expected penalty's frequencies)."""
    return _PENALTY_HISTOGRAMS[labels.size >= _PARALLEL_FROM](labels, classes, num_labels)


def label_sampled_matches(labels: np.ndarray, bonus: np.ndarray, penalty_1: np.ndarray, penalty_2: np.ndarray,
                          pairs: np.ndarray, seed: int) -> np.ndarray:
    """int64 [P]: equal labels at the sampled penalty tasks of each ordered pair (Algorithm 1's draws)."""
    pairs = np.ascontiguousarray(pairs, dtype=np.int64)
    return _SAMPLED_MATCHES[len(pairs) * bonus.size >= _PARALLEL_FROM](
        labels, bonus, penalty_1, penalty_2, pairs, pair_keys(seed, pairs), np.uint32(DRAW2_SALT))
