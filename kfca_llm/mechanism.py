"""Categorical multi-task peer prediction: delta matrices, score matrices and MTPP payments.

This is the label-level form of the mechanism (the paper's Definitions 2.1-3.2), used for
KFCA-D-style categorical reports and as an independent check of the packed sign engine: for
binary labels ``neg = (x < 0)``, task k = coordinate k, and the same seed, ``mtpp_payment``
reproduces ``engine.stats.pair_payment`` bit for bit (same partition, same penalty draws, same
integer-then-divide arithmetic).

Reports are 1-D integer numpy arrays of labels in ``[0, L)``; report k of both clients refers to
the same task k.
"""

from __future__ import annotations

import numpy as np

from .engine.stats import PairPayment, delta_from_joint
from .errors import InputError
from .partition import MAX_TASKS, check_penalty, penalty_ranks, scoring_partition

def check_num_labels(num_labels: int) -> int:
    """``num_labels`` as an int if it is an integer >= 2, else an ``InputError``."""
    if isinstance(num_labels, bool) or not isinstance(num_labels, (int, np.integer)) or num_labels < 2:
        raise InputError(f"num_labels must be an integer >= 2, got {num_labels!r}")
    return int(num_labels)


def _check_reports(r1, r2, num_labels: int) -> tuple[np.ndarray, np.ndarray]:
    out = []
    for name, r in (("r1", r1), ("r2", r2)):
        a = np.asarray(r)
        if a.ndim != 1:
            raise InputError(f"{name} must be a 1-D array of labels, got shape {a.shape}")
        # bool is not an integer dtype in numpy; we refuse it so that label meaning stays explicit
        if a.size and not np.issubdtype(a.dtype, np.integer):
            raise InputError(f"{name} must hold integer labels, got dtype {a.dtype}")
        a = a.astype(np.int64)
        if a.size and (a.min() < 0 or a.max() >= num_labels):
            raise InputError(f"{name} has labels outside [0, {num_labels})")
        out.append(a)
    if out[0].size != out[1].size:
        raise InputError(f"reports cover different numbers of tasks ({out[0].size} vs {out[1].size})")
    if out[0].size == 0:
        raise InputError("reports must cover at least one shared task")
    if out[0].size > MAX_TASKS:
        raise InputError(f"at most 2**32 tasks are supported, got {out[0].size}")
    return out[0], out[1]


def _check_square(matrix, what: str) -> np.ndarray:
    m = np.asarray(matrix, dtype=np.float64)
    if m.ndim != 2 or m.shape[0] != m.shape[1] or m.shape[0] < 2:
        raise InputError(f"{what} must be a square (L, L) matrix with L >= 2, got shape {m.shape}")
    if not np.all(np.isfinite(m)):
        raise InputError(f"{what} must be finite")
    return m


def _check_label_map(f, num_labels: int, name: str) -> np.ndarray:
    a = np.asarray(f)
    if a.shape != (num_labels,) or not np.issubdtype(a.dtype, np.integer):
        raise InputError(f"{name} must be an integer label map of shape ({num_labels},), got {a.shape} {a.dtype}")
    if a.min() < 0 or a.max() >= num_labels:
        raise InputError(f"{name} maps to labels outside [0, {num_labels})")
    return a.astype(np.int64)


def joint_counts(r1, r2, num_labels: int) -> np.ndarray:
    """int64 (L, L) table: how many tasks have report a from client 1 and b from client 2."""
    num_labels = check_num_labels(num_labels)
    a, b = _check_reports(r1, r2, num_labels)
    return np.bincount(a * num_labels + b, minlength=num_labels * num_labels).reshape(num_labels, num_labels)


def delta_matrix(r1, r2, num_labels: int) -> np.ndarray:
    """Empirical delta matrix P(a, b) - P(a) P(b) of two clients' reports over their shared tasks.

    Definition 2.2 with the probabilities replaced by frequencies over the tasks; rows and columns
    sum to zero (up to rounding).
    """
    return delta_from_joint(joint_counts(r1, r2, num_labels))


def categorical_world(delta) -> bool:
    """Definition 3.1: every diagonal entry strictly positive, every off-diagonal one strictly negative."""
    d = _check_square(delta, "delta")
    off = ~np.eye(d.shape[0], dtype=bool)
    return bool(np.all(np.diag(d) > 0) and np.all(d[off] < 0))


def kfca_score_matrix(num_labels: int) -> np.ndarray:
    """KFCA score (Definition 3.2): S(r1, r2) = 1{r1 == r2}, i.e. the identity matrix."""
    return np.eye(check_num_labels(num_labels), dtype=np.float64)


def ca_score_matrix(delta) -> np.ndarray:
    """CA score (Definition 2.4): S(a, b) = 1{delta(a, b) > 0}.

    With ``delta`` estimated from the reports themselves this is the knowledge-heavy baseline: the
    server must see the joint reports before it can score them.
    """
    return (_check_square(delta, "delta") > 0).astype(np.float64)


def mtpp_payment(r1, r2, score_matrix, *, seed: int = 0, bonus_fraction: float = 0.5,
                 penalty: str = "expected", pair: tuple[int, int] = (0, 1)) -> float:
    """MTPP payment of client 1 against peer 2: ``mtpp_terms(...).payment`` (see there)."""
    return mtpp_terms(r1, r2, score_matrix, seed=seed, bonus_fraction=bonus_fraction, penalty=penalty,
                      pair=pair).payment


def mtpp_terms(r1, r2, score_matrix, *, seed: int = 0, bonus_fraction: float = 0.5,
               penalty: str = "expected", pair: tuple[int, int] = (0, 1)) -> PairPayment:
    """MTPP payment (Definition 2.1) of client 1 against peer 2, averaged over the bonus tasks.

    ``mean_{k in M_b} S(r1[k], r2[k]) - penalty`` with the partition of ``task_partition``.

    ``penalty="sampled"``: Algorithm 1's draws. For every bonus task one p1 ~ U(M_1) and one
    p2 ~ U(M_2), regenerated from ``partition.penalty_ranks`` with the client indices
    ``pair = (i, j)`` (the packed engine's ordered pair), and the penalty is the mean of
    ``S(r1[p1], r2[p2])`` over the bonus tasks.

    ``penalty="expected"`` (default): the Rao-Blackwellised penalty, i.e. the exact expectation of
    the sampled one given the partition, ``sum_{a,b} f1(a) f2(b) S(a, b)`` with f1 / f2 the report
    frequencies of client 1 on M_1 and of client 2 on M_2. Same mean, lower variance, no draws;
    ``pair`` is unused.

    Sums of scores are formed first and divided once (``sum / |M_b|``, ``c1 @ S @ c2 / (|M_1| |M_2|)``)
    so that integer-valued scores give exactly the engine's floats.
    """
    s = _check_square(score_matrix, "score_matrix")
    a, b = _check_reports(r1, r2, s.shape[0])
    check_penalty(penalty)
    if (not isinstance(pair, tuple) or len(pair) != 2
            or not all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in pair)):
        raise InputError(f"pair must be a tuple of two client indices, got {pair!r}")
    part = scoring_partition(a.size, seed=seed, bonus_fraction=bonus_fraction)
    n_bonus, m1, m2 = part.bonus.size, part.penalty_1.size, part.penalty_2.size
    bonus = s[a[part.bonus], b[part.bonus]].sum() / n_bonus
    if penalty == "expected":
        c1 = np.bincount(a[part.penalty_1], minlength=s.shape[0])
        c2 = np.bincount(b[part.penalty_2], minlength=s.shape[0])
        pen = (c1 @ s @ c2) / (m1 * m2)
    else:
        rank1, rank2 = penalty_ranks(part.bonus, seed, int(pair[0]), int(pair[1]), m1, m2)
        pen = s[a[part.penalty_1[rank1]], b[part.penalty_2[rank2]]].sum() / n_bonus
    return PairPayment(float(bonus) - float(pen), float(bonus), float(pen))


def expected_reward(delta, f1, f2, score_matrix) -> float:
    """Expected MTPP reward of deterministic strategies (Eq. 1): sum_{a,b} delta(a,b) S(f1(a), f2(b)).

    ``f1`` / ``f2`` are label maps: ``f[a]`` is the report given signal ``a`` (identity = truthful).
    """
    d = _check_square(delta, "delta")
    s = _check_square(score_matrix, "score_matrix")
    if s.shape != d.shape:
        raise InputError(f"delta {d.shape} and score_matrix {s.shape} disagree on the number of labels")
    g1 = _check_label_map(f1, d.shape[0], "f1")
    g2 = _check_label_map(f2, d.shape[0], "f2")
    return float(np.sum(d * s[np.ix_(g1, g2)]))
