"""A naive reference of the peer pool at two participants per round: slow, short, from plain lists.

``naive_run`` pays a run of rounds of two participants each as ``fl.peer_pool.score_with_pool`` with a ``PeerPool``
closed after each round does (``PoolSettings`` defaults, penalty "expected", duplicate policy "zero"), written as
directly as the rules read in docs/few-peers.md, so that a test can hold the real implementation to it
(``tests/test_pool_naive.py``). Covered: the pool (which entries, vetted by their round's score), the signed lag
weights, the pool's verdict, the in-round peer read the way verdict plus record say, the record (the lower of the
window's and the run's mean score), undetermined participants (paid 0), copies of another participant's earlier
submission (within 2% of the signs: paid at most 0), own resubmissions (identical on every sign: scored without the
pool, paid at most 0, what the earlier submission was paid charged back once). Not covered: settlement of
undetermined rounds (``fl.pool_settle``: a settled round rescores its entries), in-round copies, the trusted
reference, the attack analysis' owned scorers, and the 4,096-bit sketch of updates longer than 4,096 coordinates
(up to that length the sketch is the whole update, so "any earlier submission of the run" is what it checks).

A submission is a list of floats (one tensor); its report on a coordinate is whether it is negative; the round's tasks
are the coordinates some submission of the round is non-zero at; the bonus / penalty partition of the tasks is
``partition.partition_classes`` (the seeded hash that defines it).
"""

from __future__ import annotations

from dataclasses import dataclass
from statistics import median

import numpy as np

from ..partition import BONUS, PENALTY_1, PENALTY_2, partition_classes


@dataclass
class Entry:
    """A submission that joined the pool."""

    round: int
    client: str
    negative: list[bool]
    score: float
    """Its round's score (before the undetermined and copy rules): vetting and records."""
    paid: float
    resubmitted: bool = False


def naive_run(rounds: list[dict[str, list[float]]], seeds: list[int], window: int = 10, pool_peers: int = 8,
              pool_weight: float = 0.5, min_peers: int = 2, max_copy: float = 0.02) -> list[dict[str, float]]:
    """What each participant of each round (round t = index + 1, seeded ``seeds[t - 1]``) is paid in its round."""
    history: list[Entry] = []
    out = []
    for t, (submissions, seed) in enumerate(zip(rounds, seeds), start=1):
        paid, joining, scores = naive_round(t, submissions, seed, history, window, pool_peers, pool_weight,
                                            min_peers, max_copy)
        for client in sorted(joining):
            negative = [v < 0 for v in submissions[client]]
            history.append(Entry(t, client, negative, scores[client], paid[client]))
        out.append(paid)
    return out


def naive_round(t, submissions, seed, history, window, pool_peers, pool_weight, min_peers, max_copy):
    """(paid, the clients that join the pool, their scores) of round ``t``; marks the resubmitted entries."""
    a, b = sorted(submissions)
    negative = {c: [v < 0 for v in submissions[c]] for c in (a, b)}
    tasks = [k for k in range(len(submissions[a])) if submissions[a][k] != 0 or submissions[b][k] != 0]
    kinds = dict(zip(tasks, partition_classes(np.array(tasks), seed, 0.5).tolist()))

    def pay(mine: list[bool], peer: list[bool]) -> float:
        bonus = [k for k in tasks if kinds[k] == BONUS]
        first = [k for k in tasks if kinds[k] == PENALTY_1]
        second = [k for k in tasks if kinds[k] == PENALTY_2]
        agree = sum(mine[k] == peer[k] for k in bonus) / len(bonus)
        x, y = sum(mine[k] for k in first), sum(peer[k] for k in second)
        return agree - (x * y + (len(first) - x) * (len(second) - y)) / (len(first) * len(second))

    in_round = {a: pay(negative[a], negative[b]), b: pay(negative[b], negative[a])}
    rows = [e for e in history if t - window - 1 <= e.round <= t - 1]
    if not rows:  # nothing to weigh: both undetermined
        return {a: 0.0, b: 0.0}, {a, b}, in_round

    def differing(c: str, e: Entry) -> int:
        return sum(negative[c][k] != e.negative[k] for k in tasks)

    # Copies: any earlier submission of the run; one's own only when identical on every sign.
    copied = {c: [e for e in history if differing(c, e) == 0
                  or (e.client != c and differing(c, e) <= max_copy * len(tasks))] for c in (a, b)}
    own = {c for c in (a, b) if copied[c] and all(e.client == c for e in copied[c])}
    other_copy = {c for c in (a, b) if copied[c] and c not in own}

    # Lag weights: the median payment between entries of other participants k rounds apart, over its largest size.
    by_lag: dict[int, list[float]] = {}
    for newer in rows:
        for older in rows:
            lag = newer.round - older.round
            if 1 <= lag <= window and newer.client != older.client:
                by_lag.setdefault(lag, []).append(pay(newer.negative, older.negative))
    medians = {k: median(v) for k, v in by_lag.items()}
    scale = max((abs(m) for m in medians.values()), default=0.0)
    lag_weight = {k: m / scale for k, m in medians.items()} if scale else {}

    def newest_first(entries):
        return sorted(entries, key=lambda e: (-e.round, e.client))

    def pool_peers_of(c: str) -> list[Entry]:
        chosen, seen = [], {a, b}
        for e in newest_first(e for e in history if t - window <= e.round <= t - 1):
            if e.client not in seen and e.score > 0:
                seen.add(e.client)
                chosen.append(e)
        return chosen[:pool_peers]

    def record(c: str) -> float | None:
        recent = [e.score for e in rows if e.client == c]
        whole = [e.score for e in history if e.client == c]
        means = [sum(s) / len(s) for s in (recent, whole) if s]
        return min(means) if means else None

    peers = {c: pool_peers_of(c) for c in (a, b)}
    terms = {c: [] if c in own else [(lag_weight.get(t - e.round, 0.0), pay(negative[c], e.negative))
                                     for e in peers[c]] for c in (a, b)}
    verdict = {c: sum(w * p for w, p in terms[c]) / sum(abs(w) for w, _ in terms[c])
               for c in (a, b) if sum(abs(w) for w, _ in terms[c]) > 0}
    rank = {c: verdict[c] + (record(c) or 0.0) for c in verdict}

    paid, scores = {}, {}
    for c, p in ((a, b), (b, a)):
        if c not in verdict:
            peer_sign = 1.0
        elif p in own:
            peer_sign = 0.0  # the pool has no verdict on a resubmission
        elif p not in rank:
            peer_sign = 0.0
        elif in_round[c] >= 0:
            peer_sign = 1.0
        else:
            peer_sign = -1.0 if rank[p] < rank[c] else 1.0  # the one ranked lower is fined, the other reads it back
        pool_total = sum(abs(w) for w, _ in terms[c])
        pool_sign = [w * pool_weight / pool_total if c in verdict else 0.0 for w, _ in terms[c]]
        own_pool = pool_weight if c in own and any(lag_weight.get(t - e.round, 0.0) for e in peers[c]) else 0.0
        weight = abs(peer_sign) + sum(abs(w) for w in pool_sign) + own_pool
        scores[c] = (peer_sign * in_round[c] + sum(w * pay_ for w, (_, pay_) in zip(pool_sign, terms[c]))) / weight \
            if weight else 0.0
        distinct = {p} if peer_sign else set()
        distinct |= {e.client for w, e in zip(pool_sign, peers[c]) if w} | ({"(pool)"} if own_pool else set())
        reward = min(scores[c], 0.0) if c in other_copy else scores[c]
        if c in own:
            charged = [e for e in copied[c] if not e.resubmitted]
            reward = min(reward, 0.0) - sum(max(e.paid, 0.0) for e in charged)
        elif len(distinct) < min_peers:
            reward = 0.0  # undetermined: no majority that could outvote a deviator
        paid[c] = reward
    for c in own:
        for e in copied[c]:
            e.paid, e.resubmitted = min(e.paid, 0.0), True
    return paid, {a, b} - own - other_copy, scores
