"""The exact Shapley value: the definition over all 2^n coalitions."""

from __future__ import annotations

from math import factorial

import numpy as np

from ..errors import InputError
from .utility import CachedUtility, Utility, as_cached

MAX_EXACT_PLAYERS = 20  # 2^20 coalitions; beyond that use an estimator


def coalition_of(mask: int) -> frozenset:
    """Players whose bit is set in ``mask``."""
    return frozenset(i for i in range(mask.bit_length()) if mask >> i & 1)


def shapley_from_table(values: np.ndarray) -> np.ndarray:
    """Shapley values from ``values[mask]`` = v(coalition of ``mask``), for all 2^n masks.

    phi_i = sum_{S not containing i} |S|! (n - |S| - 1)! / n! * (v(S + i) - v(S)).
    """
    values = np.asarray(values, dtype=np.float64)
    n = values.size.bit_length() - 1
    if n < 1 or values.size != 1 << n:
        raise InputError(f"a value table needs 2^n entries, got {values.size}")
    masks = np.arange(1 << n, dtype=np.int64)
    sizes = np.bitwise_count(masks).astype(np.int64)
    weight = np.array([factorial(k) * factorial(n - k - 1) / factorial(n) for k in range(n)])
    phi = np.empty(n)
    for i in range(n):
        without = masks[(masks >> i & 1) == 0]
        phi[i] = np.sum(weight[sizes[without]] * (values[without | (1 << i)] - values[without]))
    return phi


def shapley_exact(utility: Utility | CachedUtility, n: int) -> np.ndarray:
    """Exact Shapley values of the n players; the utility is evaluated once per coalition (2^n calls).

    Satisfies efficiency (sum = v(N) - v(empty)), symmetry and the null-player axiom.
    """
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or not 1 <= n <= MAX_EXACT_PLAYERS:
        raise InputError(f"exact Shapley values need 1 <= n <= {MAX_EXACT_PLAYERS} players, got {n!r}")
    cached = as_cached(utility, int(n))
    cached.prefetch(coalition_of(m) for m in range(1 << n))
    return shapley_from_table(np.array([cached(coalition_of(m)) for m in range(1 << n)]))
