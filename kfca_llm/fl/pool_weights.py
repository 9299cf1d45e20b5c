"""How a short participant's reward is put together from its pool peers and its in-round peers (``fl.peer_pool``).

* **The pool's verdict** on a participant: each lag gets a signed weight from the median payment between pool entries
  that far apart (``pool_lag_weights``); the pool score ``z`` is the weighted mean of its pool payments.
* **In-round peers read the way the pool says they report**: at two per round the pair's payment is symmetric, so the
  pool decides who deviated. A pair that agrees (payment >= 0) counts as it is; a pair that disagrees is the fault
  of the participant ranked lower (``fl.peer_pool``: its pool score plus its record, ``fl.pool_policy.record``): the participant the pool ranks lower is fined the disagreement, the other is paid as if its
  peer had reported the opposite (a flipped peer's report read back). A peer the pool has no verdict on (an own
  resubmission, a participant without weighted pool peers) counts for nothing.
* **The pool as a whole** weighs ``pool_weight`` against an in-round peer's 1. An own resubmission never meets the
  pool: its pool term is 0 at that weight (nothing new stands behind it), so it is paid its in-round agreement on the
  same footing as everyone else, never more.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from ..engine.stats import RoundCounts, pair_payments


def pool_lag_weights(counts: RoundCounts, entries: Sequence, first: int, window: int) -> dict[int, float]:
    """Lag -> ``m_k / max_j |m_j|``, ``m_k`` the median payment between pool entries of other participants k rounds
    apart (``entries``: the pool's ``PoolEntry`` rows, ``first`` onwards of ``counts``), on this round's partition."""
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
    # Lags the pool cannot estimate (no pair that far apart yet) get no weight: they are not in ``medians``.
    return {k: m / scale for k, m in medians.items()}


def pool_scores(pool_terms: Mapping[str, Sequence[tuple[float, float]]]) -> dict[str, tuple[float, float]]:
    """Scorer -> (pool score z, sum of |weight|) from its (lag weight, payment) terms; scorers whose weights are all
    0 are left out (the pool has no verdict on them)."""
    out = {}
    for client, terms in pool_terms.items():
        total = sum(abs(w) for w, _ in terms)
        if total > 0:
            out[client] = (sum(w * pay for w, pay in terms) / total, total)
    return out


def public_blind_verdicts(plain: RoundCounts, rows: Mapping, first: int, window: int, round_: int,
                          pool_keys: Sequence[tuple[str, str]], index: Mapping[str, int]
                          ) -> dict[str, tuple[float, float]]:
    """Scorer -> (verdict, its standard error) as without the public strata: ``plain`` counts (no strata), their own
    lag weights, the same pool pairs (``rows``: pool entry name -> ``PoolEntry``, rows ``first`` onwards)."""
    lags = pool_lag_weights(plain, list(rows.values()), first, window)
    if not pool_keys or not lags:
        return {}
    payment, _, _ = pair_payments(plain, np.array([(index[c], index[p]) for c, p in pool_keys], dtype=np.int64))
    terms: dict[str, list[tuple[float, float]]] = {}
    for (client, entry), pay in zip(pool_keys, payment.tolist()):
        terms.setdefault(client, []).append((lags.get(abs(round_ - rows[entry].round), 0.0), pay))
    verdicts = pool_scores(terms)
    errors = verdict_errors(terms, verdicts)
    return {c: (z, errors[c]) for c, (z, _) in verdicts.items()}


def lower_verdicts(conditioned: Mapping[str, tuple[float, float]], blind: Mapping[str, tuple[float, float]]
                   ) -> dict[str, tuple[float, float]]:
    """Scorer -> (verdict, standard error): the lower of its verdict within the public strata and without them
    (``conditioned`` and ``blind``, each with its error). A free rider's conditioned verdict is about 0 and its blind
    one high; a flipped update's conditioned verdict is weak (the flip of what an honest update adds beyond the
    trajectory) and its blind one strongly negative (it runs against the trajectory); an honest update's are both
    above 0. So the lower one ranks each below an honest update, where either alone ranks one of them above it
    (``benchmarks/ROBUSTNESS.md``)."""
    return {c: blind[c] if c in blind and blind[c][0] < z else (z, error) for c, (z, error) in conditioned.items()}


def verdict_errors(pool_terms: Mapping[str, Sequence[tuple[float, float]]],
                   verdicts: Mapping[str, tuple[float, float]]) -> dict[str, float]:
    """Scorer -> the standard error of its verdict: the weighted spread of its pool payments about it,
    ``sqrt(sum w^2 (payment - z)^2) / sum |w|``; infinite with fewer than two weighted payments (no spread to tell how
    far the verdict could be off)."""
    return {c: float(np.sqrt(sum(w * w * (pay - z) ** 2 for w, pay in pool_terms[c]))) / total
            if sum(w != 0.0 for w, _ in pool_terms[c]) >= 2 else float("inf") for c, (z, total) in verdicts.items()}


def evidence_of(verdict: float, error: float) -> float:
    """What a verdict tells of its participant, in (-1, 1): ``tanh`` of the verdict in units of its standard error
    (``verdict_errors``), on a scale that hardly depends on when in training it was measured (early rounds pay 5-10
    times late ones, and their verdicts stand 3-5 standard errors from 0 against late ones' 0.5-1: bounded, a clear
    verdict counts about as much early as late); 0 where the error is infinite or 0 (no spread to tell how far the
    verdict could be off)."""
    return math.tanh(verdict / error) if 0.0 < error < float("inf") else 0.0


def verdict_settles(mine: tuple[float, float], peer: tuple[float, float] | None, gate: float) -> bool:
    """Whether two (verdict, standard error) differ by more than ``gate`` standard errors of their difference."""
    return peer is not None and abs(mine[0] - peer[0]) > gate * float(np.hypot(mine[1], peer[1]))


def trajectory_settles(mine: tuple[float, float], peer: tuple[float, float], gate: float) -> bool:
    """Whether two verdicts without the public strata (verdict, standard error) settle a disagreeing pair alone: the
    lower is below 0 (it ran against the way the pool moved) and they differ by more than ``gate`` standard errors of
    their difference. At two a round a flip's verdict without the strata is mostly below 0 (median -1.2 standard
    errors in Flower) and an honest update's rarely is (below -2 in 7 of 767); a free rider's is above 0 (it follows
    the trajectory), so it gains nothing from it (``benchmarks/ROBUSTNESS.md``, pool rule 6: 58 of 59 settled pairs
    named the flipping update)."""
    return min(mine[0], peer[0]) < 0.0 and verdict_settles(mine, peer, gate)


def orientation(payment: float, mine: float, peer: float | None) -> float:
    """How an in-round peer's payment counts for a scorer ranked ``mine``: +1 as it is, -1 read back (the pair
    disagrees and the peer ranks lower), 0 when the pool has no verdict on the peer."""
    if peer is None:
        return 0.0
    if payment >= 0.0:
        return 1.0
    return -1.0 if peer < mine else 1.0


CAUTIOUS_POOL_WEIGHT = 4.0
"""A pool peer of the strongest lag against an in-round peer's 1 in the cautious reward (pool rule 1's payment,
whose aggregation issue 29 measured)."""


def cautious_means(keys: Sequence[tuple[str, str]], payment: np.ndarray, in_round_keys: Sequence[tuple[str, str]],
                   lag_of: Mapping[str, float], reference_weight: float, verdict: Mapping[str, tuple[float, float]]
                   ) -> dict[str, float]:
    """Scorer -> its in-round payments as they are, beside its pool payments at ``CAUTIOUS_POOL_WEIGHT`` x lag
    weight (and the trusted reference, a key neither in-round nor a pool entry, at ``reference_weight``), in one
    weighted mean, for the scorers in ``verdict``. A disagreeing pair drags both down unless the pool
    clearly outweighs it: what the aggregation asks of a reply before it moves the model (a payment that reads the
    peer back may rest on a pool that ranked the pair wrong)."""
    in_round = set(in_round_keys)
    cautious_weights = [1.0 if key in in_round else CAUTIOUS_POOL_WEIGHT * lag_of[key[1]] if key[1] in lag_of
                        else reference_weight for key in keys]
    means = weighted_means(keys, payment, cautious_weights)
    return {c: means[c] for c in verdict if c in means}


def weighted_means(keys: Sequence[tuple[str, str]], payment: np.ndarray, weights: Sequence[float],
                   extra_weight: Mapping[str, float] | None = None) -> dict[str, float]:
    """Per scorer: sum of weight x payment over the sum of |weight| (+ ``extra_weight``: a term of payment 0, an own
    resubmission's pool). A negative weight reads a payment the other way round; a weight of 0 counts for nothing."""
    totals: dict[str, list[float]] = {}
    for (client, _), pay, weight in zip(keys, payment.tolist(), weights):
        acc = totals.setdefault(client, [0.0, 0.0])
        acc[0] += weight * pay
        acc[1] += abs(weight)
    for client, weight in (extra_weight or {}).items():
        totals.setdefault(client, [0.0, 0.0])[1] += weight
    return {c: acc[0] / acc[1] if acc[1] else 0.0 for c, acc in sorted(totals.items())}
