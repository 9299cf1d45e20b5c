"""Permutation-sampling Shapley estimators: TMC-Shapley and GTG-Shapley's in-round estimator.

Both walk sampled permutations, add each player's marginal contribution to its running mean and
truncate a permutation once the coalition's value is within ``truncation`` of v(N) (the remaining
players get marginal 0 without evaluation). They stop by the paper's criterion (from GTG-Shapley):
the mean relative change of the estimates over the last 10 permutations is below 0.05, unless a
fixed ``permutations`` budget is given.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import InputError
from .utility import CachedUtility, Utility, as_cached

CONVERGENCE_WINDOW = 10
CONVERGENCE_TOLERANCE = 0.05


@dataclass(frozen=True)
class ShapleyEstimate:
    """Estimated Shapley values and what they cost."""

    values: np.ndarray
    """float64 (n,) estimates."""
    coalitions_evaluated: int
    """distinct coalitions whose utility was evaluated (cache size after the run)."""
    permutations: int
    """permutations walked."""
    converged: bool
    """whether the stopping criterion was met (False: budget or ``max_permutations`` reached)."""


def mean_relative_change(history: list[np.ndarray], window: int = CONVERGENCE_WINDOW) -> float:
    """(1 / (n * window)) * sum_{l=1..window} sum_i |phi_i^h - phi_i^{h-l}| / |phi_i^h| (inf if too short).

    A player with phi_i^h = 0 contributes 0 when its past estimates are 0 too, and inf otherwise.
    """
    if len(history) <= window:
        return float("inf")
    now = history[-1]
    total = 0.0
    for past in history[-window - 1:-1]:
        diff = np.abs(now - past)
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.where(diff == 0, 0.0, diff / np.abs(now))
        total += float(np.sum(ratio))
    return total / (now.size * window)


def _check_args(n: int, permutations: int | None, max_permutations: int, truncation: float) -> None:
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise InputError(f"the number of players must be a positive integer, got {n!r}")
    for name, value in (("permutations", permutations), ("max_permutations", max_permutations)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1):
            raise InputError(f"{name} must be a positive integer, got {value!r}")
    if not truncation >= 0:
        raise InputError(f"truncation must be >= 0, got {truncation!r}")


def _estimate(cached: CachedUtility, n: int, next_permutation, permutations: int | None,
              max_permutations: int, truncation: float, prefetch: int) -> ShapleyEstimate:
    empty, grand = cached(frozenset()), cached(frozenset(range(n)))
    tolerance = truncation * abs(grand)
    total = np.zeros(n)
    history: list[np.ndarray] = []
    limit = permutations if permutations is not None else max_permutations
    converged = False
    queue: list[np.ndarray] = []
    while len(history) < limit:
        if not queue:
            queue = [next_permutation(len(history) + k) for k in range(min(prefetch, limit - len(history)))]
            cached.prefetch(frozenset(p[:k].tolist()) for p in queue for k in range(1, n))
        order = queue.pop(0)
        previous, members = empty, set()
        for position, player in enumerate(order):
            if abs(grand - previous) <= tolerance and position > 0:
                break  # truncated: the remaining players add (almost) nothing
            members.add(int(player))
            value = grand if len(members) == n else cached(frozenset(members))
            total[player] += value - previous
            previous = value
        history.append(total / (len(history) + 1))
        if permutations is None and mean_relative_change(history) < CONVERGENCE_TOLERANCE:
            converged = True
            break
    return ShapleyEstimate(history[-1], cached.num_evaluated, len(history), converged)


def shapley_tmc(utility: Utility | CachedUtility, n: int, *, seed: int = 0, permutations: int | None = None,
                max_permutations: int = 500, truncation: float = 0.01, prefetch: int = 1) -> ShapleyEstimate:
    """TMC-Shapley (Ghorbani and Zou, 2019): uniformly random permutations with truncation.

    ``truncation``: a permutation stops once |v(N) - v(prefix)| <= truncation * |v(N)|.
    ``prefetch``: permutations drawn ahead whose prefixes go to the utility's batch evaluator in
    one call (a speed/evaluation-count trade-off for batched utilities; 1 = none ahead).
    """
    _check_args(n, permutations, max_permutations, truncation)
    rng = np.random.default_rng(seed)
    return _estimate(as_cached(utility, int(n)), int(n), lambda _: rng.permutation(n), permutations,
                     max_permutations, truncation, prefetch)


def shapley_gtg(utility: Utility | CachedUtility, n: int, *, seed: int = 0, permutations: int | None = None,
                max_permutations: int = 500, truncation: float = 0.01, prefetch: int = 1) -> ShapleyEstimate:
    """GTG-Shapley's in-round estimator (Liu et al., 2022): guided sampling with truncation.

    Permutation k starts with player k mod n (every player leads in turn, so each one's
    contribution to small coalitions, the largest marginal gains, is sampled evenly); the rest of
    the order is random. Truncation and stopping as in ``shapley_tmc``.
    """
    _check_args(n, permutations, max_permutations, truncation)
    rng = np.random.default_rng(seed)

    def guided(k: int) -> np.ndarray:
        lead = k % n
        rest = np.delete(np.arange(n), lead)
        return np.concatenate(([lead], rng.permutation(rest)))

    return _estimate(as_cached(utility, int(n)), int(n), guided, permutations, max_permutations, truncation,
                     prefetch)
