"""From integer agreement counts to KFCA-QP payments and delta matrices.

Backends only count bits; every float is computed here, from the same integers, so all backends
give bit-identical rewards.

Binary reports: label 0 is "negative" (update < 0), label 1 is "non-negative". ``gram[s, i, j]``
is the number of tasks of set ``s`` (BONUS, PENALTY_1, PENALTY_2) where clients i and j both
report negative; its diagonal is each client's count of negative reports in that set.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import InputError
from ..partition import BONUS, PENALTY_1, PENALTY_2


@dataclass(frozen=True)
class RoundCounts:
    gram: np.ndarray
    """int64 [3, n, n]: co-negative counts per task set."""
    sizes: np.ndarray
    """int64 [3]: number of tasks in the bonus set, M_1 and M_2."""

    def __post_init__(self):
        n_bonus, m1, m2 = (int(v) for v in self.sizes)
        if min(n_bonus, m1, m2) == 0:
            raise InputError(
                f"too few informative coordinates ({n_bonus + m1 + m2}) to form non-empty bonus and "
                f"penalty sets (bonus {n_bonus}, M_1 {m1}, M_2 {m2}); coordinates that are zero in "
                "every client's update are not tasks"
            )

    @property
    def n_clients(self) -> int:
        return self.gram.shape[1]

    def bonus_agreements(self, i: int, j: int) -> int:
        g = self.gram[BONUS]
        return int(self.sizes[BONUS]) - int(g[i, i] + g[j, j] - 2 * g[i, j])

    def expected_penalty(self, i: int, j: int) -> float:
        """Exact expectation of 1{r_i[p1] == r_j[p2]} for p1 ~ U(M_1), p2 ~ U(M_2)."""
        m1, m2 = int(self.sizes[PENALTY_1]), int(self.sizes[PENALTY_2])
        a = int(self.gram[PENALTY_1, i, i])
        b = int(self.gram[PENALTY_2, j, j])
        return (a * b + (m1 - a) * (m2 - b)) / (m1 * m2)

    def joint_counts(self, i: int, j: int) -> np.ndarray:
        """int64 [2, 2] table of (report_i, report_j) over all tasks; label 0 = negative."""
        both = int(self.gram[:, i, j].sum())
        neg_i = int(self.gram[:, i, i].sum())
        neg_j = int(self.gram[:, j, j].sum())
        total = int(self.sizes.sum())
        return np.array(
            [[both, neg_i - both], [neg_j - both, total - neg_i - neg_j + both]], dtype=np.int64
        )


@dataclass(frozen=True)
class PairPayment:
    payment: float
    bonus_agreement: float
    penalty_agreement: float


def pair_payment(counts: RoundCounts, i: int, j: int, sampled_matches: int | None = None) -> PairPayment:
    """MTPP payment of client i against peer j, averaged over the bonus tasks."""
    n_bonus = int(counts.sizes[BONUS])
    bonus = counts.bonus_agreements(i, j) / n_bonus
    penalty = counts.expected_penalty(i, j) if sampled_matches is None else sampled_matches / n_bonus
    return PairPayment(bonus - penalty, bonus, penalty)


def delta_from_joint(joint: np.ndarray) -> np.ndarray:
    """Empirical delta matrix P(a, b) - P(a) P(b) from a joint count table."""
    total = joint.sum()
    if total == 0:
        raise InputError("no tasks to estimate a delta matrix from")
    p = joint / total
    return p - np.outer(p.sum(axis=1), p.sum(axis=0))
