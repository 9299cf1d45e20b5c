"""Own reversals (pool rule 7): an update that runs against its participant's previous one.

A client trains on its own data at every participation, so an honest update agrees with the same participant's
previous update more than the updates of two other participants as many rounds apart agree with each other. A
flipped update of a participant that was honest before (a sleeper's turn, an on-off attacker's every other update)
agrees with its previous one far *less* than they do: of two consecutive submissions of one participant that reverse
each other, one is flipped. Measured on 24 captured Flower runs at 20 x 0.1 (benchmarks/ROBUSTNESS.md, "Own
reversals"): an honest update's agreement with its own previous one never fell more than 2.1 spreads below the other
participants' at that lag (1,250 updates, both data orders, whole updates), a reversal mostly 3-40 below; on the
4,096-bit sketches three honest ones at long lags fell further, by at most 1.4% of the signs (hence the margin).

Which of the two is flipped, the participant's **lineage** says: an update that reverses its previous one has turned
when that previous one had not turned and its round scored it > 0 (judged honest by its round); an update that
follows its previous one (agrees with it more than ``REVERSAL_Z`` spreads above the others) has turned when that one
had; an update related to neither way, or the first of its participant, has not. So a sleeper's turn is caught where
its round's verdicts cannot tell, and so is every flip of its lineage after it; an on-off attacker's honest updates
reverse a turned one and are not held against it. A turned participant is ranked below its partner in a disagreeing
pair (``fl.pool_reward.rank_pairs``), unless the trajectory settles the pair (``fl.pool_weights.trajectory_settles``).

Everything is computed from the pool's sketches and scores, which the ledger rebuilds (``fl.pool_close``): a
verifier and a resumed run rank as the live run did.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from .pool_copies import set_bits
from .pool_store import parse_pool_name

REVERSAL_Z = 2.5
"""Spreads (the population standard deviation of the other participants' agreements at the lag) by which an update's
agreement with its own previous one must fall below their median to reverse it, or rise above it to follow it."""
REVERSAL_MARGIN = 0.03
"""And by how much of the signs at least, to reverse it: a spread of a handful of pairs can be tiny."""
MIN_BASELINE_PAIRS = 2
"""Pairs of other participants' submissions at the lag needed to judge a relation at all."""
SPREAD_FLOOR = 1e-3


@dataclass(frozen=True)
class OwnRelation:
    previous: str
    """The pool name of the participant's previous submission."""
    reverses: bool
    """True: the update runs against it; False: it follows it."""


def agreement(a: np.ndarray, b: np.ndarray, mask: np.ndarray, bits: int) -> float:
    """The fraction of the ``bits`` task bits of ``mask`` on which sign words ``a`` and ``b`` agree."""
    return set_bits(~(a ^ b) & mask) / bits


def own_relation(sketches: Sequence[tuple[str, np.ndarray]], participant: str, round_: int, mine: np.ndarray,
                 mask: np.ndarray) -> OwnRelation | None:
    """How ``mine`` (the sketch of ``participant``'s submission in ``round_``) relates to the participant's previous
    submission among ``sketches`` (pool name -> sketch words), on the task bits of ``mask`` (this round's sketched
    task words): judged against every pair of two other participants' earlier submissions as many rounds apart."""
    bits = set_bits(mask)
    earlier = [(entry, words) for name, words in sketches
               if (entry := parse_pool_name(name)) is not None and entry[1] < round_]
    own = [(entry[1], words) for entry, words in earlier if entry[0] == participant]
    if not own or bits == 0:
        return None
    previous, theirs = max(own, key=lambda found: found[0])
    lag = round_ - previous
    others: dict[int, list[tuple[str, np.ndarray]]] = {}
    for (who, r), words in earlier:
        if who != participant:
            others.setdefault(r, []).append((who, words))
    baseline = [agreement(u, v, mask, bits) for r, older in others.items() for a, u in older
                for b, v in others.get(r + lag, ()) if a != b]
    if len(baseline) < MIN_BASELINE_PAIRS:
        return None
    centre, spread = statistics.median(baseline), max(statistics.pstdev(baseline), SPREAD_FLOOR)
    excess = agreement(mine, theirs, mask, bits) - centre
    name = f"{participant}@{previous}"
    if excess < -REVERSAL_Z * spread and excess < -REVERSAL_MARGIN:
        return OwnRelation(name, True)
    if excess > REVERSAL_Z * spread:
        return OwnRelation(name, False)
    return None


def has_turned(sketches: Sequence[tuple[str, np.ndarray]], score_of: Callable[[str], float | None], participant: str,
               round_: int, mine: np.ndarray, mask: np.ndarray) -> bool:
    """Whether ``participant``'s submission in ``round_`` has turned by its lineage (the module docstring);
    ``score_of``: pool name -> its round's score of it (None: not recorded)."""
    relation = own_relation(sketches, participant, round_, mine, mask)
    if relation is None:
        return False
    words = dict(sketches)[relation.previous]
    previous_turned = has_turned(sketches, score_of, participant, parse_pool_name(relation.previous)[1], words, mask)
    if not relation.reverses:
        return previous_turned
    score = score_of(relation.previous)
    return not previous_turned and score is not None and score > 0


__all__ = ["MIN_BASELINE_PAIRS", "REVERSAL_MARGIN", "REVERSAL_Z", "OwnRelation", "agreement", "has_turned",
           "own_relation"]
