"""The peer pool's policy, read off its store (``fl.pool_store.PeerPool``): which entries may be a short participant's
peers (``eligible``; ``PeerPool.candidates`` draws from them), and what ranks a participant in a disagreeing pair
beside its verdict: its ``record`` (``rank_by="record"``, ``"verdict-first"``) or its ``reputation``
(``rank_by="reputation"``). ``fl.pool_reward`` applies them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol


class PoolRecords(Protocol):
    """What the policy reads of the store (``PeerPool``; typed here, not imported: the store draws its pool peers with
    ``eligible``)."""

    def entries(self, before_round: int, extra: int = 0, horizon: int | None = None) -> list: ...

    def score_of(self, name: str) -> float | None: ...

    def run_scores(self, participant: str) -> dict[int, float | None]: ...

    def run_evidence(self, participant: str) -> dict[int, float]: ...

    def charged(self, name: str) -> bool: ...

REPUTATION_FORGETTING = 0.8
"""``rank_by="reputation"``: the weight of a participant's evidence one participation older than the next."""
BAD_EVIDENCE_WEIGHT = 2.0
"""``rank_by="reputation"``: the weight of negative evidence against positive evidence's 1 (bad evidence
weighs more, so a participant that turns deviator loses its reputation faster than it built it)."""


def eligible(pool: PoolRecords, before_round: int, participant: str, exclude: Sequence[str],
             horizon: int | None = None) -> list:
    """Each other participant's nearest entry (most recent, without a ``horizon``) its round did not score <= 0,
    nearest first: what ``PeerPool.candidates`` draws from (a benchmark draws otherwise among them)."""
    seen, out = set(exclude) | {participant}, []
    for entry in pool.entries(before_round, horizon=horizon):
        score = pool.score_of(entry.name)
        if entry.participant not in seen and (score is None or score > 0):
            seen.add(entry.participant)
            out.append(entry)
    return out


def record(pool: PoolRecords, participant: str, before_round: int, horizon: int | None = None) -> float | None:
    """``participant``'s record, which settles who deviated in a disagreeing pair with its current verdict: the lower
    of its recent record (the mean score of its entries of the window and the round before it; with a ``horizon``,
    the rounds after ``before_round`` up to it too) and its run's (the mean score of every submission of the run
    but ``before_round``'s), or the one it has; None: nothing of it was scored. Late in training a round's verdicts
    fade while a persistent deviator's run record does not; a participant that turns deviator is caught by its
    recent record before its run record has moved. Submissions charged back (``PeerPool.mark_charged``: resubmitted,
    or forfeited by a turn) count in neither (pool rule 10): a sleeper's honest record, taken back at its turn, does
    not rank it above its honest partners after it."""
    recent = [pool.score_of(e.name) for e in pool.entries(before_round, extra=1, horizon=horizon)
              if e.participant == participant and not pool.charged(e.name)]
    whole = [score for t, score in pool.run_scores(participant).items()
             if t != before_round and t <= (before_round - 1 if horizon is None else horizon)]
    means = [sum(found) / len(found) for found in ([s for s in recent if s is not None],
                                                   [s for s in whole if s is not None]) if found]
    return min(means) if means else None


def reputation(pool: PoolRecords, participant: str, before_round: int, now: float, horizon: int | None = None) -> float:
    """``participant``'s reputation in ``before_round``, whose verdict's evidence on it is ``now``
    (``fl.pool_weights.evidence_of``): the weighted mean of ``now`` and of the evidence of its other submissions of
    the run (up to ``horizon``, with one), each ``REPUTATION_FORGETTING`` times the weight of the one nearer
    ``before_round`` (``now`` weighs 1), a negative one ``BAD_EVIDENCE_WEIGHT`` times more. Built from the pool's
    verdicts only: a pair ranked the wrong way round does not raise the reputation of the one it favoured, and a
    verdict counts by how clear it was, hardly by when in training it was measured."""
    high = before_round - 1 if horizon is None else horizon
    found = sorted(((abs(t - before_round), -t), value) for t, value in pool.run_evidence(participant).items()
                   if t != before_round and t <= high)
    weights = [REPUTATION_FORGETTING ** age for age in range(len(found) + 1)]
    values = [now, *(value for _, value in found)]
    weights = [w * (BAD_EVIDENCE_WEIGHT if v < 0 else 1.0) for w, v in zip(weights, values)]
    return sum(w * v for w, v in zip(weights, values)) / sum(weights)
