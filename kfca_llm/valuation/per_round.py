"""Per-round Shapley values summed over a federation's rounds: Fed-SV and TMR on any sequence of round games.

Round t's game is v_t(S) (in the fidelity experiment: the test accuracy of theta_t plus the
FedAvg-weighted updates of S, the reconstruction of MR); both methods add per-round values.

- **Fed-SV** (Wang et al., 2020, "A principled approach to data valuation for federated learning"):
  the federated Shapley value, sum_t phi_t with phi_t the Shapley value of round t's participants in
  v_t, each estimated by group testing (``shapley_group_testing``) as the paper does.
- **TMR** (Wei et al., 2020, "Efficient and fair data valuation for horizontal federated
  learning"): truncated multi-round reconstruction. Round t's exact Shapley value is weighted by
  ``decay ** t`` (rounds counted from 0: later rounds, whose models change less, count less) and a
  round whose weight falls below ``truncation`` is not reconstructed at all. Values of the two
  parameters are not fixed by the comparison; ours are chosen (``TMR_DECAY``, ``TMR_TRUNCATION``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from ..errors import InputError
from .group_testing import shapley_group_testing
from .utility import CachedUtility, Utility

TMR_DECAY = 0.9  # lambda: round t weighs 0.9^t (chosen)
TMR_TRUNCATION = 0.5  # rounds weighing less than this are skipped: 7 of 10 computed (chosen)


@dataclass(frozen=True)
class RoundSum:
    values: np.ndarray
    """float64 (n,) summed (weighted) per-round values."""
    coalitions: int
    """distinct coalitions evaluated over all rounds."""
    rounds_computed: int
    extra: dict


def fed_sv(round_utilities: Sequence[Utility | CachedUtility], n: int, *, seed: int = 0,
           **group_testing) -> RoundSum:
    """Federated Shapley value: sum over rounds of the group-testing estimate of each round's game
    (round t with seed ``seed + t``; ``group_testing``: keyword arguments of ``shapley_group_testing``)."""
    total, coalitions, tests, converged = np.zeros(n), 0, 0, 0
    for t, utility in enumerate(round_utilities):
        est = shapley_group_testing(utility, n, seed=seed + t, **group_testing)
        total += est.values
        coalitions += est.coalitions_evaluated
        tests += est.tests
        converged += est.converged
    return RoundSum(total, coalitions, len(round_utilities), {"tests": tests, "rounds_converged": converged})


def tmr_weights(rounds: int, decay: float = TMR_DECAY, truncation: float = TMR_TRUNCATION) -> dict[int, float]:
    """round -> weight decay^t of the rounds TMR computes (those with decay^t >= truncation)."""
    if not 0 < decay <= 1 or not 0 <= truncation <= 1:
        raise InputError(f"TMR needs 0 < decay <= 1 and 0 <= truncation <= 1, got {decay!r}, {truncation!r}")
    return {t: decay ** t for t in range(rounds) if decay ** t >= truncation}


def tmr(round_shapley: Callable[[int], tuple[np.ndarray, int]], rounds: int, n: int, *, decay: float = TMR_DECAY,
        truncation: float = TMR_TRUNCATION) -> RoundSum:
    """TMR: sum_t decay^t phi_t over the rounds ``tmr_weights`` keeps; ``round_shapley(t)`` returns round
    t's exact Shapley values and the coalitions it evaluated (it is never called for a skipped round)."""
    weights = tmr_weights(rounds, decay, truncation)
    total, coalitions = np.zeros(n), 0
    for t, weight in weights.items():
        phi, evaluated = round_shapley(t)
        total += weight * phi
        coalitions += evaluated
    return RoundSum(total, coalitions, len(weights), {"decay": decay, "truncation": truncation,
                                                     "rounds_skipped": rounds - len(weights)})
