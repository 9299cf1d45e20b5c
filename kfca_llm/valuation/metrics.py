"""How close a reward vector is to a reference (the exact Shapley value): the paper's distances.

Shared by the fidelity experiment and the per-round valuation of adapter updates.
"""

from __future__ import annotations

import numpy as np


def normalise(q: np.ndarray) -> tuple[np.ndarray, str]:
    """``q / sum q`` (the paper's normalisation); by the sum of |q| when the sum is not positive."""
    total = float(q.sum())
    if total > 0:
        return q / total, "sum"
    scale = float(np.abs(q).sum())
    return (q / scale if scale > 0 else np.full_like(q, 1.0 / q.size)), "abs-sum"


def spearman(a: np.ndarray, b: np.ndarray) -> float | None:
    """Spearman rank correlation (average ranks for ties); None when either side is constant."""
    from scipy.stats import rankdata

    ra, rb = rankdata(a), rankdata(b)
    if np.ptp(ra) == 0 or np.ptp(rb) == 0:
        return None
    return float(np.corrcoef(ra, rb)[0, 1])


def distances(reference: np.ndarray, q: np.ndarray) -> dict[str, float]:
    """The paper's distances between normalised exact SV and normalised rewards."""
    cos = float(reference @ q / (np.linalg.norm(reference) * np.linalg.norm(q)))
    return {"cosine": 1.0 - cos, "euclidean": float(np.linalg.norm(reference - q)),
            "max_diff": float(np.max(np.abs(reference - q)))}
