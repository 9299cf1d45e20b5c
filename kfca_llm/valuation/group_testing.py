"""Group-testing Shapley estimation (Jia et al., AISTATS 2019, Algorithm 1).

Test t draws a coalition size k with probability q(k) = (1/k + 1/(n-k)) / Z, Z = 2 sum_{k<n} 1/k,
then a uniform coalition S_t of that size, and records u_t = v(S_t). The Shapley differences are
estimated as Delta_ij = Z/T sum_t u_t (1{i in S_t} - 1{j in S_t}), and the values solve the
feasibility problem sum_i s_i = v(N) - v(empty), |(s_i - s_j) - Delta_ij| <= epsilon / (2 sqrt(n)).
(The paper assumes v(empty) = 0; efficiency of the Shapley value needs the difference.)

That estimator makes Delta_ij = a_i - a_j with a_i = Z/T sum_t u_t 1{i in S_t}, so the feasibility
problem always has the exact solution s_i = a_i + (v(N) - v(empty) - sum_j a_j) / n, whatever epsilon:
``differences_solution`` computes it in closed form (the least-squares and the min-max solution of
the difference equations coincide with it). The number of tests: ``tests`` fixes it (the paper's T);
otherwise tests are drawn n at a time (a "step", as many utility calls as one permutation of
TMC-Shapley) until the stopping rule of the paper's comparison (mean relative change over 10 steps
< 0.05, the rule every estimator of the comparison uses) fires, or until the bound of Jia et al. (2023,
Theorem 4) for an (epsilon, delta)-approximation in l2 norm is reached.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import InputError
from .sampling import CONVERGENCE_TOLERANCE, mean_relative_change
from .utility import CachedUtility, Utility, as_cached

EPSILON = 0.1  # l2 error target for utilities in [-1, 1] such as accuracy (chosen: the paper leaves it open)
DELTA = 0.05  # failure probability of the (epsilon, delta) bound (chosen)
PREFETCH_STEPS = 100  # steps (of n tests) drawn at once; their coalitions are evaluated together


@dataclass(frozen=True)
class GroupTestingEstimate:
    values: np.ndarray
    """float64 (n,) estimates, summing to v(N) - v(empty)."""
    tests: int
    """utility tests drawn (T)."""
    coalitions_evaluated: int
    """distinct coalitions whose utility was evaluated (cache size after the run)."""
    converged: bool
    """the stopping rule fired (False: a fixed ``tests`` or the bound ended the run)."""


def size_distribution(n: int) -> tuple[np.ndarray, np.ndarray, float]:
    """Sizes 1..n-1, their probabilities q(k) and the normaliser Z."""
    sizes = np.arange(1, n)
    weights = 1.0 / sizes + 1.0 / (n - sizes)
    z = 2.0 * float(np.sum(1.0 / sizes))
    return sizes, weights / z, z


def required_tests(n: int, epsilon: float = EPSILON, delta: float = DELTA, utility_range: float = 1.0) -> int:
    """Tests T for an (epsilon, delta)-approximation in l2 norm (Jia et al. 2023, Theorem 4, the corrected
    bound): ||s - phi||_2 <= epsilon with probability >= 1 - delta when |v| <= ``utility_range``."""
    sizes, q, z = size_distribution(n)
    q_tot = (n - 2) / n * q[0] + float(np.inner(q[1:], 1 + 2 * sizes[1:] * (sizes[1:] - n) / (n * (n - 1))))
    u = epsilon / utility_range / (2 * z * np.sqrt(n) * (1 - q_tot))
    h = (1 + u) * np.log1p(u) - u
    return int(np.ceil(np.log(n * (n - 1) / delta) / ((1 - q_tot) * h)))


def _draw_tests(rng: np.random.Generator, sizes: np.ndarray, q: np.ndarray, n: int, count: int) -> np.ndarray:
    """float64 (count, n) memberships beta_t of ``count`` tests: a size k ~ q, then a uniform k-subset.

    Drawn a batch at a time; every coalition of a batch is evaluated (in one call of the utility's
    batch evaluator), also where the stopping rule ends the run within the batch."""
    k = rng.choice(sizes, size=count, p=q)
    rank = np.argsort(np.argsort(rng.random((count, n)), axis=1), axis=1)  # a uniform permutation per test
    return (rank < k[:, None]).astype(np.float64)


def differences_solution(a: np.ndarray, total: float) -> np.ndarray:
    """The s with sum s = total and s_i - s_j = a_i - a_j for all i, j (the feasibility problem's solution)."""
    return a + (total - float(a.sum())) / a.size


def shapley_group_testing(utility: Utility | CachedUtility, n: int, *, seed: int = 0, tests: int | None = None,
                          epsilon: float = EPSILON, delta: float = DELTA,
                          max_tests: int | None = None) -> GroupTestingEstimate:
    """Group-testing Shapley values of the n players (see the module docstring).

    ``tests``: a fixed number of tests T (no early stop). ``max_tests``: cap of the adaptive run
    (default ``required_tests(n, epsilon, delta)``).
    """
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise InputError(f"the number of players must be a positive integer, got {n!r}")
    for name, value in (("tests", tests), ("max_tests", max_tests)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1):
            raise InputError(f"{name} must be a positive integer, got {value!r}")
    if not (epsilon > 0 and 0 < delta < 1):
        raise InputError(f"need epsilon > 0 and 0 < delta < 1, got {epsilon!r}, {delta!r}")
    n = int(n)
    cached = as_cached(utility, n)
    total = cached(frozenset(range(n))) - cached(frozenset())
    if n == 1:
        return GroupTestingEstimate(np.array([total]), 0, cached.num_evaluated, True)
    sizes, q, z = size_distribution(n)
    rng = np.random.default_rng(seed)
    limit = tests if tests is not None else (max_tests or required_tests(n, epsilon, delta))
    weighted = np.zeros(n)  # sum_t u_t beta_t
    bits = 1 << np.arange(n, dtype=np.int64)
    drawn, history, converged = 0, [], False
    while drawn < limit and not converged:
        member = _draw_tests(rng, sizes, q, n, min(PREFETCH_STEPS * n, limit - drawn))
        masks, inverse = np.unique(member.astype(np.int64) @ bits, return_inverse=True)
        coalitions = [frozenset(np.flatnonzero(m & bits).tolist()) for m in masks]
        cached.prefetch(coalitions)
        u = np.array([cached(s) for s in coalitions])[inverse]
        # running sums after each step of n tests: the rule is checked step by step
        running = weighted + np.cumsum(u[:, None] * member, axis=0)
        ends = np.minimum(np.arange(n, len(u) + n, n), len(u))
        for end in ends if tests is None else ends[-1:]:
            weighted_now = running[end - 1]
            if tests is None:
                history.append(differences_solution(z / (drawn + end) * weighted_now, total))
                if mean_relative_change(history) < CONVERGENCE_TOLERANCE:
                    converged = True
                    break
        weighted = weighted_now
        drawn += int(end)
    return GroupTestingEstimate(differences_solution(z / drawn * weighted, total), drawn, cached.num_evaluated,
                                converged)
