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

from ..errors import NoTasksError
from ..partition import BONUS, PENALTY_1, PENALTY_2


@dataclass(frozen=True)
class RoundCounts:
    gram: np.ndarray
    """int64 [3, n, n]: co-negative counts per task set."""
    sizes: np.ndarray
    """int64 [3]: number of tasks in the bonus set, M_1 and M_2."""
    strata_negatives: np.ndarray | None = None
    """int64 [3, S, n]: each client's negative count per task set and public stratum (``engine.public``);
    None: the penalty is not conditioned on public information (today's rewards)."""
    strata_sizes: np.ndarray | None = None
    """int64 [3, S]: members of each task set per public stratum."""

    def __post_init__(self):
        n_bonus, m1, m2 = (int(v) for v in self.sizes)
        if min(n_bonus, m1, m2) == 0:
            raise NoTasksError(
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
        """Exact expectation of 1{r_i[p1] == r_j[p2]} for p1 ~ U(M_1), p2 ~ U(M_2); with public strata, p1 and p2
        drawn within the stratum of a bonus task drawn uniformly (``conditioned_penalty``)."""
        if self.strata_sizes is not None:
            return float(conditioned_penalty(self, np.array([i]), np.array([j]))[0])
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


def pair_payments(counts: RoundCounts, pairs: np.ndarray,
                  sampled_matches: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(payment, bonus agreement, penalty agreement) float64 [P] of the ordered pairs ([P, 2]).

    ``pair_payment`` for many pairs at once, with the same integer-then-divide arithmetic, so every
    float is bit-identical to it (int64 numerators are exact, and below 2**53 so is their conversion).
    """
    pairs = np.asarray(pairs, dtype=np.int64).reshape(-1, 2)
    i, j = pairs[:, 0], pairs[:, 1]
    n_bonus, m1, m2 = (int(v) for v in counts.sizes)
    g = counts.gram
    bonus = (n_bonus - (g[BONUS, i, i] + g[BONUS, j, j] - 2 * g[BONUS, i, j])) / n_bonus
    if sampled_matches is not None:
        penalty = np.asarray(sampled_matches, dtype=np.int64) / n_bonus
    elif counts.strata_sizes is not None:
        penalty = conditioned_penalty(counts, i, j)
    elif m1 * m2 < 2**53:
        a, b = g[PENALTY_1, i, i], g[PENALTY_2, j, j]
        penalty = (a * b + (m1 - a) * (m2 - b)) / (m1 * m2)
    else:  # beyond float64's exact integers: Python's exactly rounded int division, pair by pair
        penalty = np.array([counts.expected_penalty(int(x), int(y)) for x, y in pairs], dtype=np.float64)
    return bonus - penalty, bonus, penalty


def conditioned_penalty(counts: RoundCounts, i: np.ndarray, j: np.ndarray) -> np.ndarray:
    """float64 [P]: the expected penalty with p1 in M_1 and p2 in M_2 drawn within the public stratum of a bonus
    task drawn uniformly: ``sum_s pi_s pen_s``, ``pi_s = |B & s| / |B|``, ``pen_s = (a b + (m1 - a)(m2 - b)) /
    (m1 m2)`` with ``a`` client i's negatives in ``M_1 & s`` and ``b`` peer j's in ``M_2 & s``. A stratum whose
    ``M_1`` or ``M_2`` part is empty takes the unconditioned penalty for its share. Integer numerators, one
    division each, summed over strata in stratum order: every backend's integers give the same floats."""
    neg, sizes = counts.strata_negatives, counts.strata_sizes
    n_bonus, m1, m2 = (int(v) for v in counts.sizes)
    a_all, b_all = counts.gram[PENALTY_1, i, i], counts.gram[PENALTY_2, j, j]
    unconditioned = (a_all * b_all + (m1 - a_all) * (m2 - b_all)) / (m1 * m2)
    penalty = np.zeros(len(i), dtype=np.float64)
    for s in range(sizes.shape[1]):
        in_bonus, m1_s, m2_s = (int(v) for v in sizes[:, s])
        if in_bonus == 0:
            continue
        if m1_s and m2_s:
            a, b = neg[PENALTY_1, s, i], neg[PENALTY_2, s, j]
            pen = (a * b + (m1_s - a) * (m2_s - b)) / (m1_s * m2_s)
        else:
            pen = unconditioned
        penalty += in_bonus / n_bonus * pen
    return penalty


def joint_tables(counts: RoundCounts, pairs: np.ndarray) -> np.ndarray:
    """int64 [P, 2, 2]: ``RoundCounts.joint_counts`` of each ordered pair of ``pairs``."""
    pairs = np.asarray(pairs, dtype=np.int64).reshape(-1, 2)
    i, j = pairs[:, 0], pairs[:, 1]
    both = counts.gram[:, i, j].sum(axis=0)
    neg_i = counts.gram[:, i, i].sum(axis=0)
    neg_j = counts.gram[:, j, j].sum(axis=0)
    total = int(counts.sizes.sum())
    return np.stack([np.stack([both, neg_i - both], axis=1),
                     np.stack([neg_j - both, total - neg_i - neg_j + both], axis=1)], axis=1)


def delta_from_joint(joint: np.ndarray) -> np.ndarray:
    """Empirical delta matrix P(a, b) - P(a) P(b) from a joint count table."""
    return deltas_from_joints(np.asarray(joint)[None])[0]


def deltas_from_joints(joints: np.ndarray) -> np.ndarray:
    """``delta_from_joint`` of each table of ``joints`` ([P, L, L]) at once (one code path for both)."""
    totals = joints.sum(axis=(1, 2))
    if joints.shape[0] and not totals.all():
        raise NoTasksError("no tasks to estimate a delta matrix from")
    p = joints / totals[:, None, None]
    return p - p.sum(axis=2)[:, :, None] * p.sum(axis=1)[:, None, :]


@dataclass(frozen=True)
class LabelCounts:
    """Integer statistics of one KFCA-D round over its ordered pairs (``RoundCounts`` for labels)."""

    sizes: np.ndarray
    """int64 [3]: number of tasks in the bonus set, M_1 and M_2."""
    joints: np.ndarray
    """int64 [P, L, L]: (label of the client, label of the peer) over all tasks, per pair."""
    bonus_agreements: np.ndarray
    """int64 [P]: bonus tasks where the two labels agree."""
    penalty_matches: np.ndarray
    """int64 [P]: penalty task pairs (p1 in M_1, p2 in M_2) where the client's label at p1 equals the peer's
    at p2: all of M_1 x M_2 (the expected penalty) or the sampled draws."""
    penalty_pairs: int
    """How many penalty task pairs ``penalty_matches`` counts over: |M_1| |M_2| or the number of draws."""


def label_pair_payments(counts: LabelCounts) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(payment, bonus agreement, penalty agreement) float64 [P]: integers divided once, as ``pair_payments``."""
    bonus = counts.bonus_agreements / int(counts.sizes[BONUS])
    penalty = counts.penalty_matches / counts.penalty_pairs
    return bonus - penalty, bonus, penalty
