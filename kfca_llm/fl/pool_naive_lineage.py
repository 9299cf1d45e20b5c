"""The naive reference's lineage (``fl.pool_naive``; pool rules 7, 13, 14 and 20, as ``fl.pool_reversal`` computes
them): how a submission relates to its participant's previous one, what the rounds credited it with, and whether it
has turned, from plain lists.

Pool rule 7: how an update relates to its participant's previous submission, on the round's sketched tasks, against
the pairs of two other participants' earlier submissions as many rounds apart (rule 13: at least 2, starting in 4
rounds); rule 14: where the previous one was alike the one before it, against both; rule 20: 3 rounds apart at least,
signs correlated with it more than 4 standard errors below 0 and below the median of others' pairs as far apart (2 at
least); and a reversal by the margins needs its signs correlated 3 errors below 0.
"""

from __future__ import annotations

from statistics import median, pstdev
from typing import Protocol


class Entry(Protocol):
    """A submission that joined the pool (``fl.pool_naive_round.Entry``), as the lineage reads it."""

    round: int
    client: str
    negative: list[bool]
    score: float


class Lineage:
    """The submissions of the pool so far (``history``) read on a round's sketched tasks (``sketch``)."""

    def __init__(self, history: list[Entry], sketch: list[int]):
        self.history, self.sketch = history, sketch

    def relation(self, c: str, r: int, mine: list[bool]) -> tuple[Entry, bool] | None:
        earlier = [e for e in self.history if e.round < r]
        mine_before = sorted((e for e in earlier if e.client == c), key=lambda e: -e.round)
        if not mine_before or not self.sketch:
            return None

        def agree(x: list[bool], y: list[bool]) -> float:
            return sum(x[k] == y[k] for k in self.sketch) / len(self.sketch)

        def standing(x: list[bool], y: Entry, lag: int) -> tuple[float, float] | None:  # (spreads, share) above others
            pairs = [(u, v) for u in earlier for v in earlier
                     if v.round - u.round == lag and c not in (u.client, v.client) and u.client != v.client]
            baseline = [agree(u.negative, v.negative) for u, v in pairs]
            if len(baseline) < 2 or len({u.round for u, _ in pairs}) < 4:
                return None
            excess = agree(x, y.negative) - median(baseline)
            return excess / max(pstdev(baseline), 1e-3), excess

        def tilt(x: list[bool]) -> float:  # the share of negative signs, from -1 to 1
            return 2 * sum(x[k] for k in self.sketch) / len(self.sketch) - 1

        def correlation(x: list[bool], y: list[bool]) -> float:  # in standard errors of unrelated signs
            spread = (1 - tilt(x) ** 2) * (1 - tilt(y) ** 2)
            if spread <= 0:
                return 0.0
            return (2 * agree(x, y) - 1 - tilt(x) * tilt(y)) / (spread / len(self.sketch)) ** 0.5

        previous = mine_before[0]
        first = standing(mine, previous, r - previous.round)
        # rule 20: 3 rounds apart at least, signs correlated with it 4 errors below 0 and below the median of others'
        # pairs as far apart (2 at least)
        usual = [correlation(u.negative, v.negative) for u in earlier for v in earlier
                 if v.round - u.round == r - previous.round and c not in (u.client, v.client) and u.client != v.client
                 and abs(tilt(u.negative)) < 1 and abs(tilt(v.negative)) < 1]
        anti = r - previous.round >= 3 and len(usual) >= 2 and correlation(mine, previous.negative) < min(
            0.0, median(usual)) - 4.0
        if first is None:
            return (previous, True) if anti else None
        if first[0] > 2.5:
            return previous, False  # follows it
        if anti:
            return previous, True
        if correlation(mine, previous.negative) >= -3.0:
            return None  # rule 20: a reversal by the margins below runs against it, 3 errors below 0 at least
        found = [first]
        if len(mine_before) > 1:
            older = mine_before[1]
            alike = standing(previous.negative, older, previous.round - older.round)
            second = standing(mine, older, r - older.round) if alike is not None and alike[1] > 0 else None
            if second is not None:
                found.append(second)
        both = (sum(z for z, _ in found) / len(found) ** 0.5, sum(e for _, e in found) / len(found))
        if (first[0] < -2.5 and first[1] < -0.03) or (both[0] < -2.5 and both[1] < -0.03):
            return previous, True  # reverses it, alone or with the one before it (where alike)
        return None  # neither

    def credit(self, e: Entry) -> float:  # its round's score and those of the updates it follows, back along its
        found = self.relation(e.client, e.round, e.negative)  # lineage
        return e.score + (self.credit(found[0]) if found is not None and not found[1] else 0.0)

    def turned(self, c: str, r: int, mine: list[bool]) -> bool:  # by its lineage: reversing an honest-judged one,
        found = self.relation(c, r, mine)                             # or following a turned one
        if found is None:
            return False
        previous, reverses = found
        before = self.turned(c, previous.round, previous.negative)
        return (not before and self.credit(previous) > 0) if reverses else before
