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

REPUTATION_FORGETTING = 0.8
"""``rank_by="reputation"``: the weight of a participant's evidence one participation older than the next."""
BAD_EVIDENCE_WEIGHT = 2.0
"""The weight of bad evidence against good evidence's 1, in a ``record`` (a submission scored <= 0) and a
``reputation`` (a negative verdict): a participant that turns deviator loses either faster than it built it."""


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
    """``participant``'s record, which settles who deviated in a disagreeing pair with its current verdict (pool rule
    12): a Beta reputation of its run's submissions, ``(good + 1) / (good + BAD_EVIDENCE_WEIGHT * bad + 2) - 1/2``,
    ``good`` the submissions their rounds scored > 0 and ``bad`` those scored <= 0, every submission of the run but
    ``before_round``'s (up to ``horizon``, with one: settling sees both sides); None: nothing of it was scored, which
    ranks as a record of 0 (the prior, ``Beta(1, 1)``'s mean less 1/2).

    It counts how often a participant was paid, not how much. A mean score is dominated by the rounds early in
    training, which pay five to ten times late ones: an on-off attacker's or a sleeper's early honest rounds, or a
    flipper's one early agreement with another flipped update, outvoted every verdict late in the run
    (benchmarks/ROBUSTNESS.md, pool rule 12). A submission scored <= 0 weighs twice one scored > 0, so a participant
    that turns deviator loses its record faster than it built it. Submissions charged back (``PeerPool.mark_charged``:
    resubmitted, or forfeited by a turn) count for nothing (pool rule 10): a sleeper's honest record, taken back at its
    turn, does not rank it above its honest partners after it."""
    scores = [score for t, score in pool.run_scores(participant).items()
              if score is not None and t != before_round and t <= (before_round - 1 if horizon is None else horizon)]
    if not scores:
        return None
    good = sum(score > 0 for score in scores)
    return (good + 1) / (good + BAD_EVIDENCE_WEIGHT * (len(scores) - good) + 2) - 0.5


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
