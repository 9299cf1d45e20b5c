"""Closed forms of the paper's robustness results, used to check the mechanism by simulation.

Conventions: a confusion matrix ``C`` has ``C[k, l] = P(report l | Y = k)`` (rows: true label);
``prior[k] = P(Y = k)``; ``lam`` is the fraction of malicious clients among a client's peers.
"""

from __future__ import annotations

import numpy as np

from .errors import InputError

_ATOL = 1e-9


def _check_alpha(alpha: float) -> float:
    a = float(alpha)
    if not 0.0 <= a < 0.5:
        raise InputError(f"alpha (honest error rate) must lie in [0, 0.5), got {alpha!r}")
    return a


def _check_lam(lam: float) -> float:
    x = float(lam)
    if not 0.0 <= x <= 1.0:
        raise InputError(f"lam (malicious fraction) must lie in [0, 1], got {lam!r}")
    return x


def _check_prior(prior) -> np.ndarray:
    p = np.asarray(prior, dtype=np.float64)
    if p.ndim != 1 or p.size < 2 or not np.all(np.isfinite(p)) or np.any(p < 0) or abs(p.sum() - 1) > _ATOL:
        raise InputError("prior must be a probability vector over at least two labels")
    return p


def _check_confusion(matrix, num_labels: int, name: str) -> np.ndarray:
    c = np.asarray(matrix, dtype=np.float64)
    if c.shape != (num_labels, num_labels):
        raise InputError(f"{name} must have shape ({num_labels}, {num_labels}), got {c.shape}")
    if not np.all(np.isfinite(c)) or np.any(c < 0) or np.any(np.abs(c.sum(axis=1) - 1) > _ATOL):
        raise InputError(f"{name} must be row-stochastic (non-negative rows summing to 1)")
    return c


def binary_robustness(alpha: float, lam: float) -> float:
    """Expected KFCA payment of an honest client (Proposition, binary case).

    Uniform prior, honest symmetric error ``alpha``, a fraction ``lam`` of label-flipping peers:
    E = (1 - 2 lam) (1/2 - 2 alpha (1 - alpha)), positive iff lam < 1/2.
    """
    a, x = _check_alpha(alpha), _check_lam(lam)
    return (1.0 - 2.0 * x) * (0.5 - 2.0 * a * (1.0 - a))


def honest_agreement(prior, honest) -> float:
    """A = sum_k pi_k sum_l alpha_kl^2: bonus match probability of two honest clients."""
    p = _check_prior(prior)
    c = _check_confusion(honest, p.size, "honest")
    return float(p @ (c * c).sum(axis=1))


def cross_agreement(prior, honest, malicious) -> float:
    """B = sum_k pi_k sum_l alpha_kl alpha~_kl: bonus match probability of an honest and a malicious client."""
    p = _check_prior(prior)
    c = _check_confusion(honest, p.size, "honest")
    m = _check_confusion(malicious, p.size, "malicious")
    return float(p @ (c * m).sum(axis=1))


def mixed_report_marginal(prior, honest, malicious, lam: float) -> np.ndarray:
    """q_l = (1 - lam) sum_k pi_k alpha_kl + lam sum_k pi_k alpha~_kl."""
    p = _check_prior(prior)
    c = _check_confusion(honest, p.size, "honest")
    m = _check_confusion(malicious, p.size, "malicious")
    x = _check_lam(lam)
    return (1.0 - x) * (p @ c) + x * (p @ m)


def penalty_agreement(prior, honest, malicious, lam: float) -> float:
    """The paper's E_penalty = sum_l q_l^2 with q the mixed report marginal.

    This is the exact expected penalty of an honest client only when honest and malicious report
    marginals coincide (e.g. uniform prior with doubly stochastic confusions, or any permutation
    attack on a uniform marginal). In general the exact one is sum_l h_l q_l, h the honest marginal.
    """
    q = mixed_report_marginal(prior, honest, malicious, lam)
    return float(q @ q)


def multiclass_expected_reward(prior, honest, malicious, lam: float) -> float:
    """The paper's E_total = (1 - lam) A + lam B - E_penalty for an honest client (multi-class case)."""
    x = _check_lam(lam)
    a = honest_agreement(prior, honest)
    b = cross_agreement(prior, honest, malicious)
    return (1.0 - x) * a + x * b - penalty_agreement(prior, honest, malicious, x)


def multiclass_robustness_bound(A: float, B: float, E_pen: float) -> float:
    """Largest tolerable malicious fraction, (A - E_pen) / (A - B); requires A > B.

    Since E_total = (A - E_pen) - lam (A - B), an honest client's reward is positive exactly when
    lam is below this value (E_pen evaluated at that lam).
    """
    a, b, e = float(A), float(B), float(E_pen)
    if not all(np.isfinite(v) for v in (a, b, e)):
        raise InputError("A, B and E_pen must be finite")
    if not a > b:
        raise InputError(f"the bound needs A > B (honest clients agree more with each other), got A={a}, B={b}")
    return (a - e) / (a - b)


def signal_delta(prior, confusion_1, confusion_2) -> np.ndarray:
    """Population delta matrix of two conditionally independent clients: C1^T diag(pi) C2 - h1 h2^T."""
    p = _check_prior(prior)
    c1 = _check_confusion(confusion_1, p.size, "confusion_1")
    c2 = _check_confusion(confusion_2, p.size, "confusion_2")
    joint = c1.T @ (p[:, None] * c2)
    return joint - np.outer(p @ c1, p @ c2)


def permutation_deviation(delta, permutation, lam: float) -> float:
    """E_honest - E_pi-flipper = (1 - 2 lam)(D + |O|), D = sum_a delta(a,a), |O| = -sum_a delta(a, pi(a)).

    A fraction ``lam`` of clients reports pi(signal), the rest truthfully; ``delta`` is the
    (symmetric, homogeneous-client) signal delta matrix. Honest reporting wins iff lam < 1/2.
    """
    d = np.asarray(delta, dtype=np.float64)
    if d.ndim != 2 or d.shape[0] != d.shape[1] or d.shape[0] < 2 or not np.all(np.isfinite(d)):
        raise InputError(f"delta must be a finite square (L, L) matrix with L >= 2, got shape {d.shape}")
    perm = np.asarray(permutation)
    if (perm.shape != (d.shape[0],) or not np.issubdtype(perm.dtype, np.integer)
            or not np.array_equal(np.sort(perm), np.arange(d.shape[0]))):
        raise InputError(f"permutation must be a bijection of 0..{d.shape[0] - 1}")
    x = _check_lam(lam)
    diag = float(np.trace(d))
    off = -float(d[np.arange(d.shape[0]), perm].sum())
    return (1.0 - 2.0 * x) * (diag + off)
