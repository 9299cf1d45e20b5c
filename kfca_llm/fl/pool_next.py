"""Pool rule 15: the round after a disagreeing pair tells which of the two deviated.

At two participants per round a pair that disagrees is ranked on the pool's verdicts plus the participants' records
(``fl.pool_reward.rank_pairs``). Late in training the verdicts stand within noise of each other, and the record
decides. A record is the pool's own earlier decisions: a deviator that won a meeting on it raised it and won the next
(a sleeper whose turn the lineage missed won five meetings in a row; ``benchmarks/ROBUSTNESS.md``, pool rule 15).

The round after the pair holds evidence no record does. FedAvg of an honest update and a flipped one nearly cancels,
so the next round's participants start from about where the pair did, and their updates point the way the honest one
did. On 98 captured Flower runs, wherever the next round's other participants (two or more) agreed with each other,
the honest update of a pair with a flipping one agreed more with them in 499 of 499 pairs, and with a free rider in 13
of 13 (``benchmarks/flower_round_after.py``). Where they disagree, one of them deviated, and their mean says nothing.

So a disagreeing pair that neither the trajectory (pool rule 6) nor a lineage (pool rule 7) settles, nor the verdicts
alone under ``rank_by="verdict-first"``, is **open**. Its scorers are held (undetermined, ``hold_unsure``) and
settled once the round after it is in the pool (``fl.pool_settle``). If that round's entries of other participants
are at least ``NEXT_ROUND_MIN``, none reports one sign on every task, and every two of them agree (KFCA's payment
between them >= 0, within the round's public strata where it has them), the one of the pair paid less against them on
average ranks lower. Otherwise the pair is ranked as any settled pair is, on the pool of both sides.

**Pool rule 18: a round after that disagrees with itself still judges, through the rounds after it.** Where the round
after holds two participants that disagree, one of them deviated, and their mean says nothing; but one of them alone
is decisive either way. On 120 captured Flower runs (stops 52-57), an honest participant of round t + 1 alone ranked
the honest update of an honest-flip pair higher in 1,577 of 1,579 pairs (an attacker's node not flipping there in 103
of 103), a flipping one in 0 of 135 (``benchmarks/flower_round_after.py --judges``). Which of the two
is honest is what the round after *them* tells: so the one of them that round t + 2 ranks higher (by the same rule,
recursively while the rounds disagree) judges the pair alone, and the pair waits for those rounds (it is not settled
before they come, but at the last chance it is ranked on verdicts and records). A participant of a pair judged on the
way never judges it; where it sits in a coherent round beside the judges, they agree with it, so they are of its
kind there, and their ranking it higher is no evidence (a flipper beside a flipping judge, as an honest one beside an
honest judge): only their ranking it lower (an on-off node back to honest beside an honest judge) counts.

**Pool rule 19: settling, the rounds after judge before the trajectory.** A waiting round scored again at a later
horizon reads its verdicts without the strata on pool entries of both sides of it, no longer on the path that led to
it; there they took a held pair away from its judges, as settling the trajectory (pool rule 6) then claimed it, and
ranked it wrongly (a live Flower run: the honest partner fined -0.085, the flipper paid +0.098, where the round after
ranked them the other way round). So a waiting round's disagreeing pairs are judged by the rounds after them first
(``open_pairs(..., settling=True)``), and the trajectory ranks one only where no round after judges it. The one they
rank lower is paid at most 0 (``fl.pool_reward.cap_judged_lower``): settling, its verdict reads the rounds after it
too, and paid four flippers more than their honest partners in 24 live runs (``benchmarks/ROBUSTNESS.md``, pool rule
19), each ranked lower by the rounds after: likely the signed lag weights, which pay an honest update's anti-agreement
with the next round (the global overshoots and turns back), paying a flipped one's too (FedAvg nearly cancelled it).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import NamedTuple

import numpy as np

from ..report import Pair
from .pool_store import PoolEntry
from .pool_weights import trajectory_settles, verdict_settles

NEXT_ROUND_MIN = 2
"""Entries of other participants the round after an open pair must hold to settle it: one alone may be a deviator's."""


def open_pairs(disagreeing: Iterable[Pair], ranked: Mapping[str, tuple[float, float]],
               blind: Mapping[str, tuple[float, float]], turned: frozenset[str], verdict_first: bool,
               gate: float, *, settling: bool = False) -> frozenset[Pair]:
    """The ``disagreeing`` in-round pairs (both real participants with verdicts, neither an own resubmission nor a
    constant report) that no other evidence settles: neither the verdicts without the public strata (``blind``,
    ``trajectory_settles``), nor one participant's lineage (``turned``), nor under ``verdict_first`` the ranked
    verdicts (``ranked``: (verdict, standard error), read under ``verdict_first`` only, ``verdict_settles``).
    ``settling`` (a waiting round scored again at a later horizon, pool rule 19): the trajectory settles nothing, so
    the rounds after the pair judge it first, and the trajectory ranks it only where they do not (there its verdicts
    without the strata read rounds on both sides of it, no longer the path that led to it)."""
    return frozenset(
        (c, p) for c, p in disagreeing
        if (c in turned) == (p in turned)
        and not (not settling and c in blind and p in blind and trajectory_settles(blind[c], blind[p], gate))
        and not (verdict_first and verdict_settles(ranked[c], ranked[p], gate)))


def next_round_ranks(pairs: Iterable[Pair], round_: int, rows: Sequence[PoolEntry], owner: Mapping[str, str],
                     task: np.ndarray, payment: Callable[[str, str], float], horizon: int
                     ) -> tuple[dict[Pair, tuple[float, float]], frozenset[Pair]]:
    """(open pair (scorer, peer) -> (the scorer's mean payment against its judges, the peer's), where the rounds after
    it settle it; the open pairs whose judges need a round later than ``horizon``): see the module docstring.
    ``rows``: the pool entries in reach, ``owner``: scorer -> its participant, ``task``: this round's task words,
    ``payment(x, y)``: KFCA's payment to scorer or entry ``x`` against ``y`` on this round's tasks (within its public
    strata, where it has them: a report the public trajectory predicts earns nothing there, so a free rider replaying
    the global's change is no judge and gains nothing from one)."""
    by_round: dict[int, list[PoolEntry]] = {}
    for entry in sorted(rows, key=lambda e: e.participant):
        by_round.setdefault(entry.round, []).append(entry)
    out, waiting = {}, set()
    for c, p in pairs:
        found = judges(round_ + 1, frozenset({owner[c], owner[p]}), by_round, task, payment, horizon)
        if found is WAITING:
            waiting.add((c, p))
        elif found is not None:
            means = (sum(payment(c, e) for e in found.names) / len(found.names),
                     sum(payment(p, e) for e in found.names) / len(found.names))
            higher = owner[c] if means[0] > means[1] else owner[p] if means[1] > means[0] else None
            if higher is not None and higher not in found.beside:
                out[(c, p)] = means
    return out, frozenset(waiting)


class Judges(NamedTuple):
    """Entries of one round that judge a pair of the round before it."""

    names: tuple[str, ...]
    beside: frozenset[str]
    """Participants of the pair judged (or of the pairs judged on the way) that sat in the judges' round and agreed
    with them: the judges ranking one of those higher is no evidence (a flipper's next update agrees with a flipping
    judge as an honest one's with an honest judge), so it ranks nothing."""


WAITING = Judges(("(waiting)",), frozenset())
"""``judges``' answer where the round it needs is not in the pool yet (the horizon is earlier)."""


def judges(round_: int, excluded: frozenset[str], by_round: Mapping[int, Sequence[PoolEntry]], task: np.ndarray,
           payment: Callable[[str, str], float], horizon: int) -> Judges | None:
    """The entries of ``round_`` that judge a pair of the round before it: where its entries not reporting one sign on
    every task are ``NEXT_ROUND_MIN`` or more and every two agree (KFCA's payment >= 0), those of participants not
    ``excluded`` (a participant's own later update is no judge of it); where they are two that disagree (one of them
    deviated), the one of them the round after ranks higher, alone, unless it is ``excluded`` or sat beside those
    judges (pool rule 18: an honest judge alone ranked 1,577 of 1,579 honest-flip pairs right, a flipping one 0 of
    135). None where nothing judges; ``WAITING`` where a round later than ``horizon`` would."""
    if round_ > horizon:
        return WAITING
    entries = [e for e in by_round.get(round_, ()) if not one_sign(e.signs, task)]
    names = [e.name for e in entries]
    if len(names) >= NEXT_ROUND_MIN and all(payment(x, y) >= 0.0 for k, x in enumerate(names) for y in names[k + 1:]):
        mine = tuple(e.name for e in entries if e.participant not in excluded)
        return Judges(mine, frozenset(e.participant for e in entries) & excluded) if mine else None
    if len(names) != 2:
        return None
    later = judges(round_ + 1, excluded | {e.participant for e in entries}, by_round, task, payment, horizon)
    if later is None or later is WAITING:
        return later
    mean = [sum(payment(x, j) for j in later.names) / len(later.names) for x in names]
    higher = None if mean[0] == mean[1] else entries[0] if mean[0] > mean[1] else entries[1]
    if higher is None or higher.participant in excluded or higher.participant in later.beside:
        return None
    return Judges((higher.name,), frozenset())


def one_sign(words: np.ndarray, task: np.ndarray) -> bool:
    """Whether packed sign words report the same sign on every task of ``task`` (all set or none)."""
    on = np.bitwise_and(words, task)
    return not on.any() or bool(np.array_equal(on, task))
