"""Own reversals (pool rules 7, 8, 20): an update against its participant's previous one; what a turn forfeits.

A client trains on its own data at every participation, so an honest update agrees with the same participant's previous
update more than the updates of two other participants as many rounds apart agree with each other. A flipped update of a
participant that was honest before (a sleeper's turn, an on-off attacker's every other update) agrees with its previous
one far *less* than they do: of two consecutive submissions of one participant that reverse each other, one is flipped.
Measured on 24 captured Flower runs at 20 x 0.1 (benchmarks/ROBUSTNESS.md, "Own reversals"): an honest update's
agreement with its own previous one never fell more than 2.1 spreads below the other participants' at that lag (1,250
updates, both data orders, whole updates), a reversal mostly 3-40 below; on the 4,096-bit sketches three honest ones at
long lags fell further, by at most 1.4% of the signs (hence the margin). On 72 runs, three more honest updates early in
a per-round run fell 4.4-30 spreads (3.5-4.3% of the signs) below pairs of others starting in one to three rounds, whose
spread understates how far two updates differ (hence ``MIN_BASELINE_ROUNDS``). Pool rule 20 reads the signs' correlation
itself (``sign_correlation_z``): a flip of an honest update runs against it (medians -4.0 to -14.5 standard errors by
lag on 32 captures, down to -48), where an honest update 3 or more rounds later never fell below -2.9 with pairs of
others to compare (one, 6 rounds after its first-round update, ran against it by 5.2 errors where none were: early
training turns); so a turn is caught where too few rounds hold pairs of others for the margins or they are not reached
(many rounds later), and a reversal by the margins must run against the previous update too (an honest one that merely
agreed with it less than others' pairs did had been taken for one).

Which of the two is flipped, the participant's **lineage** says: an update that reverses its previous one has turned
when that previous one had not turned and is credited > 0 (``credit``: its round's score plus those of the updates it
follows, back along its lineage: judged honest by its rounds); an update that follows its previous one (agrees with it
more than ``REVERSAL_Z`` spreads above the others) has turned when that one had; an update related to neither way, or
the first of its participant, has not. So a sleeper's turn is caught where its round's verdicts cannot tell, and so is
every flip of its lineage after it; an on-off attacker's honest updates reverse a turned one and are not held against
it. A turned participant is ranked below its partner in a disagreeing pair (``fl.pool_reward.rank_pairs``), unless the
trajectory settles the pair (``fl.pool_weights.trajectory_settles``).

**Forfeits** (pool rule 8): an update that has turned by reversing its previous one, in a round that needs the pool,
forfeits what its participant's submissions since its last turned one were paid (at most ``FORFEIT_SUBMISSIONS`` of
them, newest first; ``forfeited``): an honest record earned before a turn is not the attacker's to spend, the payments
are charged back once (``fl.pool_reward.charge_back``) and a forfeited submission settled later is paid at most 0. A
sleeper's honest rounds, paid five to ten times what its flipped update is fined at two per round, otherwise keep its
mean above an honest node's; an on-off attacker forfeits its honest update at every flip.

Everything is computed from the pool's sketches and scores, which the ledger rebuilds (``fl.pool_close``): a
verifier and a resumed run rank as the live run did.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from .pool_copies import set_bits, sketch
from .pool_store import PeerPool, parse_pool_name

REVERSAL_Z = 2.5
"""Spreads (the population standard deviation of the other participants' agreements at the lag) by which an update's
agreement with its own previous one must fall below their median to reverse it, or rise above it to follow it."""
REVERSAL_MARGIN = 0.03
"""And by how much of the signs at least, to reverse it: a spread of a handful of pairs can be tiny."""
MIN_BASELINE_PAIRS = 2
"""Pairs of other participants' submissions at the lag needed to judge a relation at all."""
MIN_BASELINE_ROUNDS = 4
"""And the rounds those pairs must start in, at least: pairs of a handful of rounds share their submissions, so their
spread understates how far two updates that far apart differ. Early in a run with the per-round data order three
honest updates fell 4.4 to 30 spreads below such a baseline, of pairs starting in 1 or 3 rounds, and forfeited what
their previous submissions were paid (benchmarks/ROBUSTNESS.md, "Pool rules 13 and 14")."""
SPREAD_FLOOR = 1e-3
ANTI_ROUNDS = 3
"""Rounds at least between the two updates for rule 20 to judge them: a client retraining on the same samples
(FlowerTune's static data order) right after its update moved the global toward them can turn back, as the global
overshot on them (two honest updates of 12 static captures correlated -5.6 and -4.8 with their own of 1 and 2 rounds
before; none of 3 rounds or more below -1.7, nor of the per-round order's at any lag below -2.9)."""
RUNS_AGAINST_Z = 3.0
"""Standard errors below 0 by which the correlation of an update's signs with its participant's previous update's
must fall for the margins above to reverse it (pool rule 20): a reversal runs against the previous update, not merely
agrees with it less than others' as far apart do. On 20 per-round captures every reversal of a flip or by a flip
correlated -3.8 or below; an honest update early in a run that the margins reversed, -2.5, and forfeited what its
three earlier submissions were paid (benchmarks/ROBUSTNESS.md, "Pool rule 20")."""
ANTI_Z = 4.0
"""Standard errors by which the correlation of an update's signs with its participant's previous update's must fall
below 0, and below the median of two other participants' submissions as many rounds apart (``MIN_BASELINE_PAIRS`` of
them at least, whatever rounds they start in), to reverse it without the margins above (pool rule 20). An honest
update's signs correlate with its own previous one's, as a client trains on its own data; those of two other
participants' updates need not (the global overshoots and turns back: down to -15 standard errors, median about 0, on
the Flower benchmark's captures), hence the others' median where the rounds turn back; and where no pairs of others show
how updates that far apart relate, nothing is read (early in a static run an honest update ran against its own first-
round one, 6 rounds before, by 5.2 errors). Measured on the Flower benchmark's captures (benchmarks/ROBUSTNESS.md, "Pool
rule 20")."""
FORFEIT_SUBMISSIONS = 3
"""Submissions at most a turned update forfeits (a vesting period: an older payment is its participant's to keep).
Runs of 12 whose every deviator ended below every honest node (benchmarks/ROBUSTNESS.md, "Forfeits"), static / per-round
data order: 1 submission 9 / 8, 2: 10 / 9, 3 and the whole run since the last turn: 11 / 10."""


@dataclass(frozen=True)
class OwnRelation:
    previous: str
    """The pool name of the participant's previous submission."""
    reverses: bool
    """True: the update runs against it; False: it follows it."""


def agreement(a: np.ndarray, b: np.ndarray, mask: np.ndarray, bits: int) -> float:
    """The fraction of the ``bits`` task bits of ``mask`` on which sign words ``a`` and ``b`` agree."""
    return set_bits(~(a ^ b) & mask) / bits


def sign_correlation_z(a: np.ndarray, b: np.ndarray, mask: np.ndarray, bits: int) -> float:
    """The correlation (phi) of sign words ``a`` and ``b`` on the ``bits`` task bits of ``mask``, in standard errors
    of unrelated signs with the same shares of each sign (phi times the square root of ``bits``); 0 where either
    reports one sign on every task bit (no correlation to measure)."""
    share_a, share_b = set_bits(a & mask) / bits, set_bits(b & mask) / bits
    tilt_a, tilt_b = 2 * share_a - 1, 2 * share_b - 1
    spread = (1 - tilt_a ** 2) * (1 - tilt_b ** 2)
    if spread <= 0:
        return 0.0
    return (2 * agreement(a, b, mask, bits) - 1 - tilt_a * tilt_b) / (spread / bits) ** 0.5


def own_relation(sketches: Sequence[tuple[str, np.ndarray]], participant: str, round_: int, mine: np.ndarray,
                 mask: np.ndarray) -> OwnRelation | None:
    """How ``mine`` (the sketch of ``participant``'s submission in ``round_``) relates to the participant's previous
    submission among ``sketches`` (pool name -> sketch words), on the task bits of ``mask`` (this round's sketched task
    words): judged against every pair of two other participants' earlier submissions as many rounds apart. It follows
    the previous one when more than ``REVERSAL_Z`` spreads above those pairs. It reverses it when more than
    ``REVERSAL_Z`` spreads and ``REVERSAL_MARGIN`` below, their signs correlating more than ``RUNS_AGAINST_Z`` standard
    errors below 0 (``sign_correlation_z``); when their signs correlate more than ``ANTI_Z`` standard errors below 0 and
    below the median of pairs of others as far apart (two at least, starting in any rounds; pool rule 20: a turn many
    rounds after an honest update, or where few rounds hold pairs to judge rule 7 by); or, where the previous one was
    alike the one before it (agreed with it above the median of pairs as far apart), when the evidence against both
    combined is (pool rule 14: their spreads summed over the square root of two, their shares of the signs averaged; its
    signs correlating with the previous one's as above): a turn runs against the participant's recent updates, not only
    its last one."""
    bits = set_bits(mask)
    earlier = [(entry, words) for name, words in sketches
               if (entry := parse_pool_name(name)) is not None and entry[1] < round_]
    own = sorted(((entry[1], words) for entry, words in earlier if entry[0] == participant),
                 key=lambda found: -found[0])
    if not own or bits == 0:
        return None
    others: dict[int, list[tuple[str, np.ndarray]]] = {}
    for (who, r), words in earlier:
        if who != participant:
            others.setdefault(r, []).append((who, words))
    previous, theirs = own[0]
    first = _standing(others, round_ - previous, mine, theirs, mask, bits)
    name = f"{participant}@{previous}"
    correlation = sign_correlation_z(mine, theirs, mask, bits)
    # the others' pairs are read only for an update already running against its previous one by ANTI_Z
    anticorrelated = (correlation < -ANTI_Z and round_ - previous >= ANTI_ROUNDS
                      and (usual := _others_correlation(others, round_ - previous, mask, bits)) is not None
                      and correlation < min(0.0, usual) - ANTI_Z)
    if first is None:
        return OwnRelation(name, True) if anticorrelated else None
    if first[0] > REVERSAL_Z:
        return OwnRelation(name, False)
    if anticorrelated:
        return OwnRelation(name, True)
    if correlation >= -RUNS_AGAINST_Z:
        return None
    found = [first]
    if len(own) > 1:
        older, words = own[1]
        alike = _standing(others, previous - older, theirs, words, mask, bits)
        second = _standing(others, round_ - older, mine, words, mask, bits) if alike and alike[1] > 0 else None
        found += [second] if second is not None else []
    combined = (sum(z for z, _ in found) / len(found) ** 0.5, sum(share for _, share in found) / len(found))
    if any(z < -REVERSAL_Z and share < -REVERSAL_MARGIN for z, share in (first, combined)):
        return OwnRelation(name, True)
    return None


def _others_correlation(others: dict[int, list[tuple[str, np.ndarray]]], lag: int, mask: np.ndarray,
                        bits: int) -> float | None:
    """The median ``sign_correlation_z`` of two different participants' submissions of ``others`` (round ->
    (participant, words)) ``lag`` rounds apart, neither reporting one sign only; None: fewer than
    ``MIN_BASELINE_PAIRS`` such pairs."""
    found = [sign_correlation_z(u, v, mask, bits) for _, u, v in _pairs_apart(others, lag)
             if not _one_sign(u, mask, bits) and not _one_sign(v, mask, bits)]
    return statistics.median(found) if len(found) >= MIN_BASELINE_PAIRS else None


def _pairs_apart(others: dict[int, list[tuple[str, np.ndarray]]], lag: int):
    """(round, words, words ``lag`` rounds later) of every two different participants' submissions of ``others``."""
    for r, older in others.items():
        for a, u in older:
            for b, v in others.get(r + lag, ()):
                if a != b:
                    yield r, u, v


def _one_sign(words: np.ndarray, mask: np.ndarray, bits: int) -> bool:
    return set_bits(words & mask) in (0, bits)


def _standing(others: dict[int, list[tuple[str, np.ndarray]]], lag: int, mine: np.ndarray, theirs: np.ndarray,
              mask: np.ndarray, bits: int) -> tuple[float, float] | None:
    """(spreads, share of the signs) by which ``mine``'s agreement with ``theirs``, ``lag`` rounds older, stands above
    the median agreement of two different participants' submissions of ``others`` (round -> (participant, words))
    ``lag`` rounds apart; None: too few such pairs, or pairs starting in too few rounds, to judge by."""
    pairs = list(_pairs_apart(others, lag))
    baseline = [agreement(u, v, mask, bits) for _, u, v in pairs]
    if len(baseline) < MIN_BASELINE_PAIRS or len({r for r, _, _ in pairs}) < MIN_BASELINE_ROUNDS:
        return None
    centre, spread = statistics.median(baseline), max(statistics.pstdev(baseline), SPREAD_FLOOR)
    excess = agreement(mine, theirs, mask, bits) - centre
    return excess / spread, excess


class _Lineage:
    """One participant's lineage on one round's task mask: each stored submission's relation, turn and credit judged
    once (a lineage walked back, or a forfeit's submissions before it, meet the same ones again)."""

    def __init__(self, sketches: Sequence[tuple[str, np.ndarray]], score_of: Callable[[str], float | None],
                 participant: str, mask: np.ndarray):
        self._sketches, self._score_of, self._participant, self._mask = sketches, score_of, participant, mask
        self.words = dict(sketches)
        self._relations: dict[str, OwnRelation | None] = {}
        self._turned: dict[str, bool] = {}
        self._credits: dict[str, float] = {}

    def relation(self, round_: int, mine: np.ndarray) -> OwnRelation | None:
        return own_relation(self._sketches, self._participant, round_, mine, self._mask)

    def turned(self, relation: OwnRelation | None) -> bool:
        """Whether a submission so related to its previous one has turned (the module docstring)."""
        if relation is None:
            return False
        previous_turned = self.stored_turned(relation.previous)
        if not relation.reverses:
            return previous_turned
        return not previous_turned and self.credit(relation.previous) > 0

    def stored_relation(self, name: str) -> OwnRelation | None:
        if name not in self._relations:
            self._relations[name] = self.relation(parse_pool_name(name)[1], self.words[name])
        return self._relations[name]

    def stored_turned(self, name: str) -> bool:
        if name not in self._turned:
            self._turned[name] = self.turned(self.stored_relation(name))
        return self._turned[name]

    def credit(self, name: str) -> float:
        """Its round's score (not recorded: 0) plus the credit of the submission it follows, if it follows one."""
        if name not in self._credits:
            relation, score = self.stored_relation(name), self._score_of(name) or 0.0
            self._credits[name] = score if relation is None or relation.reverses else score + self.credit(
                relation.previous)
        return self._credits[name]


def has_turned(sketches: Sequence[tuple[str, np.ndarray]], score_of: Callable[[str], float | None], participant: str,
               round_: int, mine: np.ndarray, mask: np.ndarray) -> bool:
    """Whether ``participant``'s submission in ``round_`` has turned by its lineage (the module docstring);
    ``score_of``: pool name -> its round's score of it (None: not recorded)."""
    lineage = _Lineage(sketches, score_of, participant, mask)
    return lineage.turned(lineage.relation(round_, mine))


def credit(sketches: Sequence[tuple[str, np.ndarray]], score_of: Callable[[str], float | None], participant: str,
           name: str, mask: np.ndarray) -> float:
    """What the rounds judged of submission ``name`` and the ones it follows: the sum of their scores (a score not
    recorded counts 0) back along its lineage while each follows the one before it. One update judged about 0 in its
    round (an undetermined round, a zero partner) is judged with the updates it repeats."""
    return _Lineage(sketches, score_of, participant, mask).credit(name)


def forfeited(sketches: Sequence[tuple[str, np.ndarray]], score_of: Callable[[str], float | None], participant: str,
              round_: int, mine: np.ndarray, mask: np.ndarray) -> tuple[str, ...]:
    """The pool names of ``participant``'s submissions its submission in ``round_`` forfeits (the module docstring):
    none unless it has turned by reversing its previous one; else that one and those before it, newest first, up to
    one that had turned, ``FORFEIT_SUBMISSIONS`` at most."""
    lineage = _Lineage(sketches, score_of, participant, mask)
    relation = lineage.relation(round_, mine)
    if relation is None or not relation.reverses or not lineage.turned(relation):
        return ()
    own = sorted((entry[1], name) for name in lineage.words
                 if (entry := parse_pool_name(name)) is not None and entry[0] == participant and entry[1] < round_)
    names: list[str] = []
    for _, name in reversed(own):
        if len(names) == FORFEIT_SUBMISSIONS or lineage.stored_turned(name):
            break
        names.append(name)
    return tuple(names)


def round_forfeits(pool: PeerPool, round_: int, candidates: Iterable[tuple[str, np.ndarray]], task: np.ndarray
                   ) -> dict[str, tuple[str, ...]]:
    """Participant -> what its submission in ``round_`` forfeits (``forfeited``; only those forfeiting something), for
    each (participant, packed sign words) of ``candidates``, on the pool as it stands before the round joins it and the
    round's task words: what ``fl.pool_evidence`` charges and ``fl.pool_close`` marks, computed alike."""
    candidates = list(candidates)
    if not candidates:
        return {}
    sketches, mask = pool.sketches(), sketch(task)
    found = {c: forfeited(sketches, pool.score_of, c, round_, sketch(words), mask) for c, words in candidates}
    return {c: names for c, names in found.items() if names}


__all__ = ["ANTI_ROUNDS", "ANTI_Z", "FORFEIT_SUBMISSIONS", "MIN_BASELINE_PAIRS", "MIN_BASELINE_ROUNDS",
           "REVERSAL_MARGIN", "REVERSAL_Z", "RUNS_AGAINST_Z", "OwnRelation", "agreement", "credit", "forfeited",
           "has_turned", "own_relation", "round_forfeits", "sign_correlation_z"]
