"""How a short participant's pool peers are weighted (``fl.peer_pool``): each lag gets a signed weight from the
median payment between pool entries that far apart, and a participant's reward is the weighted mean of its
payments (in-round peers weigh 1)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..engine.stats import RoundCounts, pair_payments


def pool_lag_weights(counts: RoundCounts, entries: Sequence, first: int, round_: int, window: int,
                     weight: float) -> dict[int, float]:
    """Lag -> ``weight * m_k / max_j |m_j|``, ``m_k`` the median payment between pool entries of other
    participants k rounds apart (``entries``: the pool's ``PoolEntry`` rows, ``first`` onwards of ``counts``), on
    this round's partition."""
    pairs, lags = [], []
    for a, newer in enumerate(entries):
        for b, older in enumerate(entries):
            k = newer.round - older.round
            if 1 <= k <= window and newer.participant != older.participant:
                pairs.append((first + a, first + b))
                lags.append(k)
    if not pairs:
        return {}
    payment, _, _ = pair_payments(counts, np.array(pairs, dtype=np.int64))
    lags_array = np.array(lags)
    medians = {k: float(np.median(payment[lags_array == k])) for k in sorted(set(lags))}
    scale = max(abs(m) for m in medians.values())
    if scale == 0.0:
        return {}
    # Lags the pool cannot estimate (no pair that far apart yet) get no weight.
    return {k: float(weight) * m / scale for k, m in medians.items() if k <= round_}


def weighted_means(keys: Sequence[tuple[str, str]], payment: np.ndarray, weights: Sequence[float]) -> dict[str, float]:
    """Per scorer: sum of weight x payment over the sum of |weight| (a negative weight reads an anti-agreeing
    lag the right way round; a peer of weight 0 counts for nothing)."""
    totals: dict[str, list[float]] = {}
    for (client, _), pay, weight in zip(keys, payment.tolist(), weights):
        acc = totals.setdefault(client, [0.0, 0.0])
        acc[0] += weight * pay
        acc[1] += abs(weight)
    return {c: acc[0] / acc[1] if acc[1] else 0.0 for c, acc in sorted(totals.items())}
