"""A naive reference of the peer pool at two participants per round: slow, short, from plain lists.

``naive_run`` pays a run of rounds of two participants each as ``fl.peer_pool.score_with_pool`` and
``fl.pool_settle.close_round`` do (``PoolSettings`` defaults but the window, penalty "expected", duplicate policy
"zero"), written as directly as the rules read in docs/few-peers.md, so that a test can hold the real implementation
to it (``tests/test_pool_naive.py``). Covered: the pool (which entries, vetted by their round's score; sign words kept
for the window and one round more), the signed lag weights, the pool's verdict, the in-round peer read the way verdict
plus record say (or, with ``rank_by="verdict-first"``, by the verdicts alone where they differ by more than two
standard errors), the record (the lower of the window's and the run's mean score), undetermined
participants (paid 0), their settlement by a later round (the pool on both sides, once warm or at the window's last
round; a settled entry rescored), copies of another participant's earlier submission (within 2% of the signs: paid
at most 0), own resubmissions (identical on every sign: scored without the pool, paid at most 0, what the earlier
submission was paid charged back once). Not covered: in-round copies, the trusted reference, the attack analysis'
owned scorers, a non-zero ``own_replay_limit``, and the 4,096-bit sketch of updates longer
than 4,096 coordinates (up to that length the sketch is the whole update).

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
              pool_weight: float = 0.5, min_peers: int = 2, max_copy: float = 0.02, verdict_first: bool = False
              ) -> list[dict[str, float]]:
    """What each participant of each round (round t = index + 1, seeded ``seeds[t - 1]``) is paid for it, in its round
    or, undetermined there, by the later round that settled it."""
    rules = dict(window=window, pool_peers=pool_peers, pool_weight=pool_weight, min_peers=min_peers, max_copy=max_copy,
                 verdict_first=verdict_first)
    history: list[Entry] = []
    pending: dict[int, list[str]] = {}  # round -> its participants still waiting to be settled
    out = []
    for t, (submissions, seed) in enumerate(zip(rounds, seeds), start=1):
        negative = {c: [v < 0 for v in u] for c, u in submissions.items()}
        tasks = [k for k in range(len(next(iter(submissions.values())))) if any(u[k] != 0 for u in submissions.values())]
        result = score(t, negative, tasks, seed, history, horizon=None, **rules)
        for c in sorted(negative):
            if c not in result.copies:
                history.append(Entry(t, c, negative[c], result.scores[c], result.paid[c]))
        for e in result.resubmitted:
            e.paid, e.resubmitted = min(e.paid, 0.0), True
        if result.unsure:
            pending[t] = sorted(result.unsure)
        out.append(dict(result.paid))
        # Settle what the pool now can: every pending round scored on the pool as it stands, then applied.
        settled = {}
        for r in sorted(pending):
            if r < t:
                again = score(r, *_round_of(r, rounds, seeds), history, horizon=t, **rules)
                last = t - r >= window
                settled[r] = {c: again for c in pending[r] if c not in again.unsure and (last or c not in again.warming)}
        for r, done in settled.items():
            for c, again in done.items():
                for entry in (e for e in history if (e.round, e.client) == (r, c)):  # none for a copy
                    entry.score, entry.paid = again.scores[c], again.paid[c]
                out[r - 1][c] = again.paid[c]
            pending[r] = [c for c in pending[r] if c not in done]
            if not pending[r] or t - r >= window:
                del pending[r]
    return out


def _round_of(r: int, rounds, seeds):
    submissions = rounds[r - 1]
    negative = {c: [v < 0 for v in u] for c, u in submissions.items()}
    tasks = [k for k in range(len(next(iter(submissions.values())))) if any(u[k] != 0 for u in submissions.values())]
    return negative, tasks, seeds[r - 1]


@dataclass
class Scored:
    paid: dict[str, float]
    scores: dict[str, float]
    unsure: set[str]
    warming: set[str]
    copies: set[str]
    resubmitted: list[Entry]


def score(t, negative, tasks, seed, history, horizon, window, pool_peers, pool_weight, min_peers, max_copy,
          verdict_first):
    """Round ``t`` of two participants (``negative``: client -> its reports) on the pool of ``history``, or, settling it
    at ``horizon``, the pool on both sides of it."""
    a, b = sorted(negative)
    kinds = dict(zip(tasks, partition_classes(np.array(tasks), seed, 0.5).tolist()))

    def pay(mine: list[bool], peer: list[bool]) -> float:
        bonus = [k for k in tasks if kinds[k] == BONUS]
        first = [k for k in tasks if kinds[k] == PENALTY_1]
        second = [k for k in tasks if kinds[k] == PENALTY_2]
        agree = sum(mine[k] == peer[k] for k in bonus) / len(bonus)
        x, y = sum(mine[k] for k in first), sum(peer[k] for k in second)
        return agree - (x * y + (len(first) - x) * (len(second) - y)) / (len(first) * len(second))

    in_round = {a: pay(negative[a], negative[b]), b: pay(negative[b], negative[a])}
    # Entries whose sign words the pool still holds: the window and one round more before the last round that added any.
    latest = max((e.round for e in history), default=0)
    kept = [e for e in history if e.round >= latest - window]
    high = t - 1 if horizon is None else min(horizon, t + window)
    if horizon is None:
        def order(e):
            return (-e.round, e.client)  # newest first
    else:
        def order(e):
            return (abs(e.round - t), -e.round, e.client)  # nearest first, the later of two equally near
    rows = sorted((e for e in kept if t - window - 1 <= e.round <= high and e.round != t), key=order)
    if not rows:  # nothing to weigh: both undetermined
        return Scored({a: 0.0, b: 0.0}, in_round, {a, b}, {a, b}, set(), [])

    def differing(c: str, e: Entry) -> int:
        return sum(negative[c][k] != e.negative[k] for k in tasks)

    # Copies of earlier submissions (a settled round's judged as they were then): those whose words the pool holds,
    # and, on the sketch (the whole update here), every one older than the window; one's own only if identical.
    earlier = [e for e in rows if e.round < t] + [e for e in history if e.round < t - window]
    copied = {c: list({id(e): e for e in earlier if differing(c, e) == 0 or
                       (e.client != c and differing(c, e) <= max_copy * len(tasks))}.values()) for c in (a, b)}
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

    def pool_peers_of(c: str) -> list[Entry]:
        chosen, seen = [], {a, b}
        for e in rows:
            if e.round >= t - window and e.client not in seen and e.score > 0:
                seen.add(e.client)
                chosen.append(e)
        return chosen[:pool_peers]

    def record(c: str) -> float | None:
        recent = [e.score for e in rows if e.client == c]
        whole = [e.score for e in history if e.client == c and e.round != t and e.round <= high]
        means = [sum(s) / len(s) for s in (recent, whole) if s]
        return min(means) if means else None

    peers = {c: pool_peers_of(c) for c in (a, b)}
    terms = {c: [] if c in own else [(lag_weight.get(abs(t - e.round), 0.0), pay(negative[c], e.negative))
                                     for e in peers[c]] for c in (a, b)}
    verdict = {c: sum(w * p for w, p in terms[c]) / sum(abs(w) for w, _ in terms[c])
               for c in (a, b) if sum(abs(w) for w, _ in terms[c]) > 0}
    rank = {c: verdict[c] + (record(c) or 0.0) for c in verdict}
    error = {c: sum(w * w * (p - verdict[c]) ** 2 for w, p in terms[c]) ** 0.5 / sum(abs(w) for w, _ in terms[c])
             if sum(w != 0 for w, _ in terms[c]) >= 2 else float("inf") for c in verdict}
    if verdict_first and len(verdict) == 2 and not own and \
            abs(verdict[a] - verdict[b]) > 2.0 * (error[a] ** 2 + error[b] ** 2) ** 0.5:
        rank = dict(verdict)  # the verdicts are clear: they settle the pair alone

    paid, scores, unsure, warming = {}, {}, set(), set()
    for c, p in ((a, b), (b, a)):
        if c not in verdict:
            peer_sign = 1.0
        elif p in own or p not in rank:
            peer_sign = 0.0  # the pool has no verdict on the peer
        elif in_round[c] >= 0:
            peer_sign = 1.0
        else:
            peer_sign = -1.0 if rank[p] < rank[c] else 1.0  # the one ranked lower is fined, the other reads it back
        pool_total = sum(abs(w) for w, _ in terms[c])
        pool_sign = [w * pool_weight / pool_total if c in verdict else 0.0 for w, _ in terms[c]]
        own_pool = pool_weight if c in own and any(lag_weight.get(abs(t - e.round), 0.0) for e in peers[c]) else 0.0
        weight = abs(peer_sign) + sum(abs(w) for w in pool_sign) + own_pool
        scores[c] = (peer_sign * in_round[c] + sum(w * pay_ for w, (_, pay_) in zip(pool_sign, terms[c]))) / weight \
            if weight else 0.0
        distinct = {p} if peer_sign else set()
        distinct |= {e.client for w, e in zip(pool_sign, peers[c]) if w} | ({"(pool)"} if own_pool else set())
        reward = min(scores[c], 0.0) if c in other_copy else scores[c]
        if c in own:
            reward = min(reward, 0.0) - sum(max(e.paid, 0.0) for e in copied[c] if not e.resubmitted)
        elif len(distinct) < min_peers:
            reward = 0.0  # undetermined: no majority that could outvote a deviator
            unsure.add(c)
        if any(e.resubmitted for e in history if (e.round, e.client) == (t, c)):
            reward = min(reward, 0.0)  # resubmitted since: its settlement is paid at most 0
        paid[c] = reward
        support = 0 if c in own else len({e.client for e in peers[c] if lag_weight.get(abs(t - e.round), 0.0)})
        if c in unsure or support < pool_peers:
            warming.add(c)
    resubmitted = [e for c in sorted(own) for e in copied[c]]
    return Scored(paid, scores, unsure, warming, own | other_copy, resubmitted)
