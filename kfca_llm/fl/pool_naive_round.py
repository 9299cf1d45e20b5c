"""One round of the naive peer-pool reference (``fl.pool_naive``): a round's scoring on the pool of earlier entries.

``score`` scores round t (or, settling it, round t again at a later horizon) from plain lists as the rules read in
docs/few-peers.md; ``Entry`` is a submission that joined the pool, ``Scored`` what ``score`` finds (``sampled`` values:
``fl.pool_naive.sampled``). What the reference covers, and how ``naive_run`` drives ``score`` round after round and
settles, is in ``fl.pool_naive``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from statistics import median

import numpy as np

from ..partition import BONUS, PENALTY_1, PENALTY_2, partition_classes
from .pool_naive_lineage import Lineage

WORD_BITS, SKETCH_WORDS = 32, 128


@dataclass
class Entry:
    """A submission that joined the pool."""

    round: int
    client: str
    negative: list[bool]
    score: float
    """Its round's score (before the undetermined and copy rules): vetting and records."""
    paid: float
    evidence: float | None
    """tanh(its round's verdict on it over its standard error) (None: no verdict): reputations."""
    charged: bool = False
    """Charged back: resubmitted, or forfeited by its participant's turn (settled later at most 0)."""
    values: list[float] = field(default_factory=list)
    """Its values at the sampled coordinates (``sampled``)."""


def sketched(tasks: list[int], length: int) -> list[int]:
    """The tasks the 4,096-bit sketch holds: 128 words (32 coordinates each) of the update, every ``stride``-th from
    the first, ``stride`` the update's words over 128 (at most 4,096 coordinates: the whole update)."""
    stride = max(1, -(-length // WORD_BITS) // SKETCH_WORDS)
    return [k for k in tasks if (k // WORD_BITS) % stride == 0 and k // WORD_BITS < SKETCH_WORDS * stride]


@dataclass
class Scored:
    paid: dict[str, float]
    scores: dict[str, float]
    unsure: set[str]
    warming: set[str]
    copies: set[str]
    """Scorers that copied (in the round or earlier submissions): never pool entries."""
    resubmitted: list[Entry]
    matches: dict[str, list[Entry]] = field(default_factory=dict)
    """Scorer -> the earlier submissions it copies."""
    evidence: dict[str, float] = field(default_factory=dict)
    """Scorer the pool has a verdict on -> tanh(that verdict over its standard error)."""
    unclear: set[str] = field(default_factory=set)
    """Undetermined scorers with distinct peers enough: the pool alone, its verdict within two standard errors of 0."""
    by_trajectory: set[str] = field(default_factory=set)
    """Scorers in a disagreeing pair that the verdicts without the public strata settled (pool rule 6)."""
    by_lineage: set[str] = field(default_factory=set)
    """Scorers in a disagreeing pair that one participant's own lineage ranked (pool rule 7)."""
    forfeited: list[Entry] = field(default_factory=list)
    """Earlier submissions a participant that turned forfeited (pool rule 8)."""
    agreement_read_back: set[str] = field(default_factory=set)
    """Scorers of an agreeing pair fined the agreement: its peer turned, the scorer ran against the trajectory (pool
    rule 9)."""
    held: set[str] = field(default_factory=set)
    """Scorers of a disagreeing pair nothing settles as the round is scored: they wait for the round after (rule 15)."""
    by_next_round: set[str] = field(default_factory=set)
    """Scorers of a waiting pair that the round after it ranked otherwise than the verdicts and records (rule 15)."""
    by_chain: set[str] = field(default_factory=set)
    """Scorers of a waiting pair judged by one participant of a round after it that disagreed with itself (rule 18)."""
    waits: set[str] = field(default_factory=set)
    """Scorers of a waiting pair whose judges come after the horizon: not settled before them (rule 18)."""
    beside: dict[str, bool] = field(default_factory=dict)
    """Scorer of a waiting pair whose judges sat beside a participant of the pair -> whether they ranked it (they ranked
    that participant lower; higher is no evidence: rule 18)."""
    judged_lower: set[str] = field(default_factory=set)
    """Scorers of a waiting pair that the rounds after it ranked lower: paid at most 0 (rule 19)."""
    over_trajectory: set[str] = field(default_factory=set)
    """Scorers of a waiting pair the trajectory would settle that the rounds after it judged (rule 19: settling, they
    judge first)."""


def score(t, negative, owners, tasks, seed, reference, strata, history, horizon, window, pool_peers, pool_weight,
          min_peers, max_copy, rank_by, own_replay_limit, reference_weight, values, next_round):
    """Round ``t`` (``negative``: scorer -> its reports; ``owners``: the owned scorers' participants; ``strata``: each
    coordinate's public stratum, or None; ``values``: scorer -> its ``sampled`` values) on the pool of ``history``, or,
    settling it at ``horizon``, the pool on both sides of it."""
    a, b = sorted(c for c in negative if c not in owners)
    owner = {a: a, b: b, **owners}
    scorers = sorted(owner)
    peer_of = {c: b if owner[c] == a else a for c in scorers}  # the one in-round peer: the other participant
    kinds = dict(zip(tasks, partition_classes(np.array(tasks), seed, 0.5).tolist()))
    bonus = [k for k in tasks if kinds[k] == BONUS]
    first = [k for k in tasks if kinds[k] == PENALTY_1]
    second = [k for k in tasks if kinds[k] == PENALTY_2]

    def expected_penalty(mine: list[bool], peer: list[bool], first: list[int], second: list[int]) -> float:
        x, y = sum(mine[k] for k in first), sum(peer[k] for k in second)
        return (x * y + (len(first) - x) * (len(second) - y)) / (len(first) * len(second))

    def blind_pay(mine: list[bool], peer: list[bool]) -> float:
        agree = sum(mine[k] == peer[k] for k in bonus) / len(bonus)
        return agree - expected_penalty(mine, peer, first, second)

    # Within public strata the penalty pairs are drawn within the stratum of a uniform bonus task: per stratum of the
    # bonus tasks, its share of them and its penalty tasks of both sets (none of either: all of both, unconditioned).
    within = {}
    for s in sorted({strata[k] for k in bonus}) if strata is not None else ():
        in_first, in_second = [k for k in first if strata[k] == s], [k for k in second if strata[k] == s]
        within[s] = (sum(strata[k] == s for k in bonus) / len(bonus),
                     (in_first, in_second) if in_first and in_second else (first, second))

    def pay(mine: list[bool], peer: list[bool]) -> float:
        if strata is None:
            return blind_pay(mine, peer)
        agree = sum(mine[k] == peer[k] for k in bonus) / len(bonus)
        return agree - sum(share * expected_penalty(mine, peer, *sets) for share, sets in within.values())

    def differing(mine: list[bool], other: list[bool], on: list[int]) -> int:
        return sum(mine[k] != other[k] for k in on)

    in_round = {c: pay(negative[c], negative[peer_of[c]]) for c in scorers}
    # In-round copies: the two participants within 2% of the tasks (identical included), a group that earns nothing.
    twins = {a, b} if differing(negative[a], negative[b], tasks) <= max_copy * len(tasks) else set()
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
    if not rows and reference is None:  # nothing to weigh: all undetermined
        return Scored({c: 0.0 for c in scorers}, in_round, set(scorers), set(scorers), twins, [])

    # Copies of earlier submissions (a settled round's judged as they were then; none while the window holds no entry):
    # those whose words the pool holds on every task, and every one older than the window on the sketch's tasks; one's
    # own participant's only within ``own_replay_limit`` of them too, and at a limit of 0 with its sampled values.
    def copies(c: str, e: Entry, on: list[int]) -> bool:
        d = differing(negative[c], e.negative, on)
        own_replay = d <= own_replay_limit * len(on) and (own_replay_limit > 0 or values[c] == e.values)
        return bool(on) and d <= max_copy * len(on) and (e.client != owner[c] or own_replay)

    sketch = sketched(tasks, len(negative[a]))
    matches = {c: list({id(e): e for e in [e for e in rows if e.round < t and copies(c, e, tasks)] + [
        e for e in history if e.round < t - window and copies(c, e, sketch)]}.values()) if rows else []
        for c in scorers}
    own = {c for c in scorers if matches[c] and all(e.client == owner[c] for e in matches[c])}
    other_copy = {c for c in scorers if matches[c] and c not in own}

    # Lag weights: the median payment between entries of other participants k rounds apart, over its largest size.
    def lag_weights(payment) -> dict[int, float]:
        by_lag: dict[int, list[float]] = {}
        for newer in rows:
            for older in rows:
                lag = newer.round - older.round
                if 1 <= lag <= window and newer.client != older.client:
                    by_lag.setdefault(lag, []).append(payment(newer.negative, older.negative))
        medians = {k: median(v) for k, v in by_lag.items()}
        scale = max((abs(m) for m in medians.values()), default=0.0)
        return {k: m / scale for k, m in medians.items()} if scale else {}

    lag_weight = lag_weights(pay)
    chosen, seen = [], {a, b}  # pool peers (an owned scorer gets its participant's): one entry per other participant
    for e in rows:
        if e.round >= t - window and e.client not in seen and e.score > 0:
            seen.add(e.client)
            chosen.append(e)
    peers = chosen[:pool_peers]

    def record(c: str) -> float | None:  # a Beta reputation of the run's scores, one <= 0 weighing two
        scores = [e.score for e in history if e.client == c and e.round != t and e.round <= high and not e.charged]
        good, bad = sum(s > 0 for s in scores), sum(s <= 0 for s in scores)
        return (good + 1) / (good + 2 * bad + 2) - 0.5 if scores else None

    def verdicts(payment, weight_of: dict[int, float]) -> dict[str, tuple[float, float]]:
        """Scorer -> (the weighted mean of its pool payments, its standard error)."""
        out = {}
        for c in scorers:
            terms_ = [] if c in own else [(weight_of.get(abs(t - e.round), 0.0), payment(negative[c], e.negative))
                                          for e in peers]
            total = sum(abs(w) for w, _ in terms_)
            if total > 0:
                z = sum(w * p for w, p in terms_) / total
                out[c] = (z, sum(w * w * (p - z) ** 2 for w, p in terms_) ** 0.5 / total
                          if sum(w != 0 for w, _ in terms_) >= 2 else float("inf"))
        return out

    terms = {c: [] if c in own else [(lag_weight.get(abs(t - e.round), 0.0), pay(negative[c], e.negative))
                                     for e in peers] for c in scorers}
    conditioned = verdicts(pay, lag_weight)
    verdict = {c: z for c, (z, _) in conditioned.items()}
    # Ranked: within public strata, the lower of the verdict within them and the one without them (with its error).
    blind = verdicts(blind_pay, lag_weights(blind_pay)) if strata is not None else {}
    ranked = {c: blind[c] if c in blind and blind[c][0] < z else (z, e) for c, (z, e) in conditioned.items()}
    evidence = {c: math.tanh(z / e) if 0 < e < float("inf") else 0.0 for c, (z, e) in ranked.items()}

    def reputation(c: str) -> float:  # this round's evidence and the earlier ones, nearest first
        earlier = sorted((e for e in history if e.client == c and e.round != t and e.round <= high
                          and e.evidence is not None), key=lambda e: (abs(e.round - t), -e.round))
        values = [evidence[c], *(e.evidence for e in earlier)]
        weights = [0.8 ** age * (2.0 if v < 0 else 1.0) for age, v in enumerate(values)]
        return sum(w * v for w, v in zip(weights, values)) / sum(weights)

    # An owned scorer is ranked on its verdict alone: its participant's record is an honest submission's.
    if rank_by == "reputation":
        rank = {c: reputation(c) if c in (a, b) else evidence[c] for c in verdict}
    elif rank_by == "verdict":  # the verdict alone, no record
        rank = {c: ranked[c][0] for c in verdict}
    else:
        rank = {c: ranked[c][0] + ((record(c) if c in (a, b) else None) or 0.0) for c in verdict}

    def clear(c: str, p: str) -> bool:  # the verdicts differ by more than two standard errors: they settle the pair
        (z, e), (z_, e_) = ranked[c], ranked[p]
        return rank_by == "verdict-first" and abs(z - z_) > 2.0 * (e ** 2 + e_ ** 2) ** 0.5

    def against_trajectory(c: str, p: str) -> bool:  # within strata: the lower verdict without them is below 0 and
        if c not in blind or p not in blind:        # the two differ by more than two standard errors
            return False
        (z, e), (z_, e_) = blind[c], blind[p]
        return min(z, z_) < 0 and abs(z - z_) > 2.0 * (e ** 2 + e_ ** 2) ** 0.5

    lineage = Lineage(history, sketch)  # pool rules 7, 13, 14, 20 (fl.pool_naive_lineage)
    relation, turned = lineage.relation, lineage.turned

    has_turned = {c: c in (a, b) and c in verdict and turned(c, t, negative[c]) for c in scorers}

    # Pool rule 8: a participant (not a copy) that turned by reversing its previous submission, as its round is
    # scored, forfeits that one and those before it, newest first, up to one that had turned, three at most.
    def forfeits(c: str) -> list[Entry]:
        found = relation(c, t, negative[c])
        if horizon is not None or not rows or min_peers < 2 or found is None or not found[1] \
                or not turned(c, t, negative[c]):
            return []
        out = []
        for e in sorted((e for e in history if e.client == c and e.round < t), key=lambda e: -e.round):
            if len(out) == 3 or turned(c, e.round, e.negative):
                break
            out.append(e)
        return out

    forfeit = {c: [] if c in twins | own | other_copy else forfeits(c) for c in (a, b)}
    ref = reference_weight if reference is not None else 0.0

    # Pool rules 15 and 18: the rounds after a pair nothing above settles judge it. Round u's participants where two
    # or more (none reporting one sign) agree with each other (paid >= 0, in client order): those not of a pair judged
    # on the way, with those that are beside them; where two disagree, the one of them the rounds after u rank higher,
    # alone (unless it is of a pair judged on the way, or sat beside those judges). Each answer: (the judges' reports,
    # the participants beside them, whether a round that disagrees was judged on the way); None: nothing judges;
    # "waiting": a round after the horizon would.
    def judges(u: int, excluded: set[str]):
        if u > horizon:
            return "waiting"
        here = [e for e in rows if e.round == u and len({e.negative[k] for k in tasks}) > 1]
        if len(here) >= 2 and all(pay(x.negative, y.negative) >= 0 for i, x in enumerate(here) for y in here[i + 1:]):
            mine = [e.negative for e in here if e.client not in excluded]
            return (mine, {e.client for e in here if e.client in excluded}, False) if mine else None
        if len(here) != 2:
            return None
        later = judges(u + 1, excluded | {e.client for e in here})
        if later is None or later == "waiting":
            return later
        x, y = (sum(pay(e.negative, j) for j in later[0]) / len(later[0]) for e in here)
        higher = None if x == y else here[0] if x > y else here[1]
        if higher is None or higher.client in excluded or higher.client in later[1]:
            return None
        return [higher.negative], set(), True

    paid, scores, unsure, warming, unclear, by_trajectory, by_lineage = {}, {}, set(), set(), set(), set(), set()
    held, by_next_round = set(), set()  # rule 15: scorers waiting for the round after, those it ranked anew
    by_chain, waits, beside = set(), set(), {}  # rule 18: those a disagreeing round judged, those waiting for judges,
    # those judged beside a participant of their pair
    judged_lower, over_trajectory = set(), set()  # rule 19: those the rounds after ranked lower, or judged first
    agreement_read_back = set()
    for c in scorers:
        p = peer_of[c]
        if c not in verdict:
            peer_sign = 1.0
        elif p in own or p not in verdict or len({negative[p][k] for k in tasks}) < 2:
            peer_sign = 0.0  # the pool has no verdict on the peer, or the peer reports one sign on every task
        elif in_round[c] >= 0:  # as it is, unless its peer turned and the scorer ran against the trajectory (rule 9)
            ran_against = c in blind and blind[c][0] < -2.0 * blind[c][1]
            peer_sign = -1.0 if has_turned[p] and ran_against else 1.0
            if peer_sign < 0:
                agreement_read_back.add(c)
        else:  # the one ranked lower is fined, the other reads it back
            if against_trajectory(c, p):
                by_trajectory.add(c)
            elif has_turned[c] != has_turned[p]:
                by_lineage.add(c)
            mine, theirs = ((blind[c][0], blind[p][0]) if against_trajectory(c, p) else
                            ((-1.0, 0.0) if has_turned[c] else (0.0, -1.0)) if has_turned[c] != has_turned[p] else
                            (ranked[c][0], ranked[p][0]) if clear(c, p) else (rank[c], rank[p]))
            # (settling, the rounds after judge before the trajectory: rule 19)
            if next_round and not ref and {c, p} == {a, b} and (horizon is not None or not against_trajectory(c, p)) \
                    and has_turned[c] == has_turned[p] and not clear(c, p) and len({negative[c][k] for k in tasks}) > 1:
                if horizon is None:
                    held.add(c)
                elif (found := judges(t + 1, {owner[c], owner[p]})) == "waiting":
                    waits.add(c)  # ranked on the records for now, but not settled before its judges come (rule 18)
                elif found is not None:
                    means = (sum(pay(negative[c], x) for x in found[0]) / len(found[0]),
                             sum(pay(negative[p], x) for x in found[0]) / len(found[0]))
                    higher = owner[c] if means[0] > means[1] else owner[p] if means[1] > means[0] else None
                    if found[1]:
                        beside[c] = higher is not None and higher not in found[1]
                    if higher is not None and higher not in found[1]:  # a judge favouring one beside it: no evidence
                        by_chain.update([c] if found[2] else [])
                        if (means[1] < means[0]) != (theirs < mine):
                            by_next_round.add(c)  # it ranks the pair otherwise than the records would
                        over_trajectory.update([c] if against_trajectory(c, p) else [])
                        mine, theirs = means
                        judged_lower.update([c] if mine < theirs else [])
            peer_sign = -1.0 if theirs < mine else 1.0
        pool_total = sum(abs(w) for w, _ in terms[c])
        pool_sign = [w * pool_weight / pool_total if c in verdict else 0.0 for w, _ in terms[c]]
        own_pool = pool_weight if c in own and any(lag_weight.get(abs(t - e.round), 0.0) for e in peers) else 0.0
        weight = abs(peer_sign) + sum(abs(w) for w in pool_sign) + own_pool + ref
        scores[c] = (peer_sign * in_round[c] + sum(w * pay_ for w, (_, pay_) in zip(pool_sign, terms[c])) +
                     (ref * pay(negative[c], reference) if ref else 0.0)) / weight if weight else 0.0
        distinct = {p} if peer_sign else set()
        distinct |= {e.client for w, e in zip(pool_sign, peers) if w} | ({"(pool)"} if own_pool else set())
        reward = min(scores[c], 0.0) if c in twins or c in other_copy else scores[c]
        if c in own and c in (a, b):  # a participant's own resubmission (never an owned scorer's replay) is charged
            reward = min(reward, 0.0) - sum(max(e.paid, 0.0) for e in matches[c] if not e.charged)
        elif forfeit.get(c):  # and so is one that turned, what it forfeits
            reward = min(reward, 0.0) - sum(max(e.paid, 0.0) for e in forfeit[c] if not e.charged)
        elif c in held or not ref and len(distinct) < min_peers:
            reward = 0.0  # undetermined: no majority that could outvote a deviator (a trusted reference tells), or
            unsure.add(c)  # waiting for the round after it (rule 15)
        elif not ref and strata is not None and not peer_sign and c in verdict \
                and not abs(verdict[c]) > 2.0 * conditioned[c][1]:
            reward = 0.0  # undetermined too within strata: the pool alone, its verdict within two standard errors of 0
            unsure.add(c)
            unclear.add(c)
        if any(e.charged for e in history if (e.round, e.client) == (t, c)) or c in judged_lower:
            reward = min(reward, 0.0)  # charged back since, or the rounds after ranked it lower (rule 19): at most 0
        paid[c] = reward
        support = 0 if c in own else len({e.client for e in peers if lag_weight.get(abs(t - e.round), 0.0)})
        if not ref and (c in unsure or c in waits or support < pool_peers):
            warming.add(c)
    resubmitted = [e for c in sorted(own & {a, b}) for e in matches[c]]
    return Scored(paid, scores, unsure, warming, twins | own | other_copy, resubmitted, matches, evidence, unclear,
                  by_trajectory, by_lineage, [e for c in (a, b) for e in forfeit[c]], agreement_read_back, held,
                  by_next_round, by_chain, waits, beside, judged_lower, over_trajectory)
