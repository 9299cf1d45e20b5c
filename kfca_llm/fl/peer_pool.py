"""Peers beyond the round: scoring rounds with too few participants against earlier rounds' sign words.

Peer prediction with one peer is symmetric: at two participants per round (FlowerTune's 20 x 0.1) the
honest partner of a sign flipper is paid exactly what the flipper is. ``PeerPool`` keeps, for the last
``window`` rounds, each participant's packed sign words (1 bit per coordinate; never a float update).
A round in which some participant has fewer than ``min_peers`` in-round peers scores that participant
also against ``pool_peers`` pool entries:

* **which entries**: one per other participant (its most recent submission in the window: several
  entries of one participant are not independent peers), the most recent participants first; never the
  participant's own earlier submissions, never a participant of the current round, never an entry its round
  scored <= 0 (a deviator's entries stay for copy detection and lag weights only);
* **how**: on the current round's tasks (its task mask and seeded bonus / penalty partition), the pool
  entry's sign bits read as a report on those tasks; the expected penalty uses the entry's negative counts
  on this round's penalty sets;
* **weights**: an update agrees with updates of earlier rounds by an amount, and even a sign, that depends on
  the lag: the tiny recipe's honest updates *anti*-agree with the previous round's (the global overshoots and
  turns back; mean payment -0.049, 87% of such pairs negative) and agree with those two rounds back
  (``benchmarks/ROBUSTNESS.md``). So each lag k gets a signed weight ``m_k / max_j |m_j|``, where ``m_k`` is the
  median payment between pool entries k rounds apart (other participants, this round's partition): estimated
  from the pool alone, no ground truth, robust to a minority of deviators in it. The weighted mean of a
  participant's pool payments is the pool's verdict on it, which weighs ``weight`` against an in-round peer's 1;
  the in-round peer is read the way the verdicts say (``fl.pool_weights``: a disagreeing pair is the fault of the
  one ranked lower, its verdict plus its record, ``fl.pool_policy.record``: a Beta reputation of how often its
  run's submissions were scored > 0);
* **copies** (``fl.pool_copies``): a participant whose signs are identical or near-identical (``DuplicateRule.max_disagreement``)
  to any pool entry in the window, or, on a fixed 4,096-bit sketch of its signs, to any earlier submission of
  the run, is a copy and is not added to the pool. A copy of another participant's entry (or of several
  participants' entries, its own among them) is paid under the round's duplicate policy (at most 0 under
  ``zero`` and ``split``). An **own resubmission** (every entry it copies is its own participant's: ``stale``,
  ``lagged:K``) never meets the pool: its pool term is 0 at the pool's weight, so it is scored on its in-round
  agreement (and the trusted reference's, if any) on the footing of everyone else, never the pool's support. A real
  participant's is a copy under ``zero`` and ``split`` as well: paid at most 0, and what the resubmitted update was
  paid is **charged back**, once (``PeerPool.charge_of``; an update resubmitted while its round waits to be settled is
  settled at most 0): a group of one participant's own copies earns nothing, as ``zero`` pays any group. The attack
  analysis' replays are not charged: they answer what such an update earns in its round;
* **forfeits** (``fl.pool_reversal``, pool rule 8): a short participant whose update turned by reversing its own
  previous one (its lineage) is paid at most 0 and forfeits what its submissions since its last turned one were paid
  (``FORFEIT_SUBMISSIONS`` at most), charged back once as a resubmission's: a record earned before a turn is not the
  attacker's to spend;
* **undetermined**: a participant with fewer than ``min_peers`` distinct peers (in-round and pool) has no
  majority of independent peers that could outvote one deviator; the round is marked undetermined and its
  reward is not paid (0; the score stays in ``unadjusted_rewards``);
* **the round after** (``fl.pool_next``, pool rule 15): a disagreeing pair that neither the trajectory nor a lineage
  settles is undetermined as well, and settled once the round after it is in the pool, which ranks it where its other
  participants agree with each other (the one paid less against them deviated): late in training the verdicts
  stand within noise of each other, and the record that decided such a pair was the pool's own earlier decisions.
  Where those two disagree, the one of them the rounds after rank higher judges alone (pool rule 18), and the pair
  waits for those rounds. Settling a waiting round, the rounds after judge its disagreeing pairs before the trajectory
  does (pool rule 19).

A round in which every participant has ``min_peers`` in-round peers is scored exactly as without a pool
(``SignPacker.score``): same rewards, bit for bit.

What the aggregation may ask of a short participant's verdict (``PooledRound.verdicts``, ``fl.aggregate``'s
weak-verdict rules): its in-round reward (the round scored without the pool, which ``score_with_pool`` computes
first), and whether the pool is still *warming up* for it: undetermined, or fewer than ``pool_peers`` distinct
pool participants of non-zero lag weight behind its reward (the first rounds of a run, when the window holds few
participants and the lag weights rest on few pairs).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from ..engine.duplicates import DuplicateGroup, DuplicateRule
from ..engine.public import OFF, PublicConditioning, PublicPlanes
from ..errors import InputError
from ..packer import SignPacker
from ..report import RewardReport
from .aggregate import WeakVerdicts
from .pool_evidence import OWN_RESUBMISSION, PooledScoring, gather_evidence, resubmitted_entries
from .pool_reward import (cap_charged, cap_judged_lower, charge_back, hold_unsure, orient_weights, pair_report,
                          pay_weighted_means, rank_pairs, warming)
from .pool_store import (POOL_RULE, POOL_SEPARATOR, PeerPool, PoolEntry, PoolSettings, parse_pool_name, pool_name,
                         recorded_pool_settings)
from .pool_weights import cautious_means
from .reference import REFERENCE, check_reference_weight


@dataclass(frozen=True)
class PooledRound:
    """A round's report and what the pool did for it."""

    report: RewardReport
    pool_peers: dict[str, list[str]]
    """Participant -> the pool entries it was scored against (empty when the round had enough peers)."""
    undetermined: tuple[str, ...]
    """Participants with fewer than ``min_peers`` distinct peers: their reward cannot tell who deviated."""
    pool_copies: tuple[DuplicateGroup, ...] = ()
    """Groups of a participant and the pool entries it copies (also in ``report.duplicates``); an own
    resubmission's carry the note ``OWN_RESUBMISSION``."""
    lag_weights: dict[int, float] = dataclasses.field(default_factory=dict)
    """Lag (rounds back) -> the signed weight of a pool peer that old (see the module docstring)."""
    in_round_rewards: dict[str, float] = dataclasses.field(default_factory=dict)
    """Scorer -> its reward from its round's peers only (``SignPacker.score``'s report, before the pool)."""
    short: tuple[str, ...] = ()
    """Scorers with fewer than ``min_peers`` in-round peers (their reward was computed with the pool)."""
    cautious: dict[str, float] = dataclasses.field(default_factory=dict)
    """Short scorer -> its cautious reward (``fl.pool_weights.cautious_means``: its in-round payments as they are,
    beside its pool payments), for the scorers the pool has a verdict on: what the aggregation also asks of it."""
    warming: tuple[str, ...] = ()
    """Of ``short``, those the pool is still warming up for (see the module docstring)."""
    unpaid: tuple[str, ...] = ()
    """Every scorer paid 0 for want of ``min_peers`` distinct peers: ``undetermined`` and the attack analysis' owned
    scorers alike (``fl.pool_settle`` settles them later)."""
    resubmitted: dict[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    """Participant -> the pool entries of its own it resubmitted (a copy: paid at most 0; ``PeerPool.mark_charged``
    records them once the round is closed)."""
    charged_back: dict[str, float] = dataclasses.field(default_factory=dict)
    """Participant of ``resubmitted`` -> what those entries had been paid and its reward was charged (0: nothing to
    charge, or charged by an earlier resubmission)."""
    forfeited: dict[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    """Participant whose update turned against its own earlier ones -> the pool entries of its own it forfeits (pool
    rule 8, ``fl.pool_reversal``; paid at most 0, ``PeerPool.mark_charged`` records them once the round is closed)."""
    forfeit: dict[str, float] = dataclasses.field(default_factory=dict)
    """Participant of ``forfeited`` -> what those entries had been paid and its reward was charged (0: nothing to
    charge, or charged already)."""
    planes: PublicPlanes | None = None
    """The round's public strata every pair was scored within (None: unconditioned); a pending round keeps them."""
    evidence: dict[str, float] = dataclasses.field(default_factory=dict)
    """Real participant the pool has a verdict on -> what the verdict tells of it (``fl.pool_weights.evidence_of``):
    what its reputation is built from (``fl.pool_policy.reputation``); kept under ``rank_by="reputation"`` only (a
    ledger does not record it: a pool rebuilt from one has none)."""

    @property
    def used_pool(self) -> bool:
        return any(self.pool_peers.values())

    @property
    def verdicts(self) -> WeakVerdicts:
        """What ``fl.aggregate.aggregation_weights`` needs to apply a weak-verdict rule."""
        return WeakVerdicts({c: self.in_round_rewards[c] for c in self.short}, frozenset(self.short),
                            frozenset(self.warming), frozenset(self.undetermined), dict(self.cautious))

    @property
    def own_resubmissions(self) -> tuple[str, ...]:
        """Scorers that copied only their own earlier submissions: scored without the pool."""
        return tuple(sorted({c for g in self.pool_copies if g.note == OWN_RESUBMISSION for c in g.clients
                             if c in self.report.rewards}))


def score_with_pool(packer: SignPacker, pool: PeerPool | None, round_: int, *, peers: int | None = None,
                    pairs: Sequence[tuple[str, str]] | None = None, seed: int, penalty: str = "expected",
                    bonus_fraction: float = 0.5, duplicates: str = "zero",
                    duplicate_rule: DuplicateRule = DuplicateRule(),
                    copy_candidates: Sequence[str] | None = None,
                    owners: Mapping[str, str] | None = None, reference: np.ndarray | None = None,
                    reference_weight: float = 1.0, horizon: int | None = None, public=None,
                    conditioning: PublicConditioning = OFF,
                    values: Mapping[str, np.ndarray] | None = None) -> PooledRound:
    """Score a packed round, borrowing pool peers for participants with fewer than ``min_peers`` peers.

    ``pairs`` / ``peers``: the in-round pairs, as ``SignPacker.score`` takes them. Scorers are the clients
    of ``pairs`` (all clients with ``peers``); ``copy_candidates`` (None: all) are the real participants.
    ``owners`` maps a scorer that is not a participant (the attack analysis' side-by-side submissions) to the
    participant whose pool peers it gets; such a scorer is checked against the pool for copies and paid as a
    real submission would be (a ``lagged:K`` replay of its owner's pool entry is an own resubmission, as a real
    lagged node's is), but never joins the pool nor decides an undetermined round. Scorers neither real nor owned
    are scored on their in-round pairs only. A scorer whose every pool copy is its owner's own earlier
    submission (a real ``stale`` node; the analysis client's ``stale`` and ``lagged:K`` replays) is scored as
    ``score_with_pool`` with no pool scores it (see the module docstring). ``reference``: the packed sign words
    of a trusted reference update (``fl.reference``), a peer of every scorer with weight ``reference_weight``
    (0: ignored). ``horizon``: a later round settling this one (``fl.pool_settle``): pool peers, lag weights and
    records come from the window on both sides of ``round_`` up to the horizon, copies from the rounds before it.
    ``public`` / ``conditioning``: the round's public trajectory (``SignPacker.score``: steps, or their packed
    ``PublicPlanes``); every pair of the round, pool pairs included, is scored within its strata (a pool entry is
    read as a report on this round's tasks, so on this round's public information too). ``values``: scorer -> the
    value sketch of its update (``fl.pool_values.value_sketch``), which an own match on every sign must repeat to be a
    replay (pool rule 11); a scorer without one is judged on its signs alone.
    """
    planes = packer.public_planes(public, conditioning)
    report = packer.score(peers=peers, pairs=pairs, seed=seed, penalty=penalty, bonus_fraction=bonus_fraction,
                          duplicates=duplicates, duplicate_rule=duplicate_rule, copy_candidates=copy_candidates,
                          public=planes)
    reference_weight = check_reference_weight(reference_weight)
    if reference is not None and reference_weight > 0:
        reference = np.asarray(reference)
        if reference.dtype != np.int32 or reference.shape != (packer.words()[0].shape[1],):
            raise InputError(f"the reference's sign words have shape {reference.shape} ({reference.dtype}); this "
                             f"round's are ({packer.words()[0].shape[1]},) int32", client=REFERENCE)
    else:
        reference = None
    in_round_rewards = dict(report.rewards)
    pool_on = pool is not None and pool.settings.enabled
    if not pool_on and reference is None:
        return PooledRound(report, {c: [] for c in report.rewards}, (), in_round_rewards=in_round_rewards,
                           planes=planes)
    real = set(packer.clients if copy_candidates is None else map(str, copy_candidates))
    in_round = report.peers
    owner = {c: c for c in real} | dict(owners or {})
    short = [c for c in sorted(report.rewards)
             if pool_on and c in owner and len(set(in_round[c])) < pool.settings.min_peers]
    if not short and reference is None:
        return PooledRound(report, {c: [] for c in report.rewards}, (), in_round_rewards=in_round_rewards,
                           planes=planes)
    chosen = {c: pool.candidates(round_, owner[c], exclude=sorted(real), horizon=horizon) for c in short}
    # Every entry of the window and the round before it (earlier rounds first: copy detection covers them all), and
    # the rounds after it up to a settling horizon: lag weights need them all.
    rows = {e.name: e for e in sorted(pool.entries(round_, extra=1, horizon=horizon), key=lambda e: e.round > round_)
            } if short else {}
    if not rows and reference is None:
        undetermined = tuple(c for c in short if c in real)
        report = dataclasses.replace(report, rewards={c: 0.0 if c in short else r for c, r in report.rewards.items()})
        return PooledRound(report, {c: [] for c in report.rewards}, undetermined, in_round_rewards=in_round_rewards,
                           short=tuple(short), warming=warming(short, {}, undetermined, pool.settings),
                           unpaid=tuple(short), planes=planes)
    return _score_pooled(packer, pool, round_, report, rows, chosen, real, owner, PooledScoring(
        seed, penalty, bonus_fraction, duplicates, duplicate_rule, reference, reference_weight, horizon, planes,
        dict(values or {})))


def _score_pooled(packer: SignPacker, pool: PeerPool | None, round_: int, round_report: RewardReport,
                  rows: Mapping[str, PoolEntry], chosen: Mapping[str, list[PoolEntry]], real: set[str],
                  owner: Mapping[str, str], scoring: PooledScoring) -> PooledRound:
    """The round paid in ``fl.pool_reward``'s steps, in their order (the numbers are that module docstring's)."""
    evidence = gather_evidence(packer, pool, round_, round_report, rows, chosen, real, owner, scoring)  # 1
    rank_of, kept_evidence = rank_pairs(evidence, pool, scoring.horizon)  # 2
    weights = orient_weights(evidence, rank_of, pool, scoring.reference_weight)  # 3
    unadjusted, paid = pay_weighted_means(evidence, weights, scoring.duplicates)  # 4
    paid, unsure = hold_unsure(evidence, weights, paid, pool, scoring)  # 5
    paid, charged_back, forfeit = charge_back(evidence, paid, pool)  # 6
    paid = cap_charged(evidence, paid, pool)  # 7
    paid = cap_judged_lower(evidence, paid)  # 8
    undetermined = tuple(sorted(c for c in unsure if c in real))
    # 9; a trusted reference tells an honest participant from a deviator at any round size: nothing warms up.
    # A held pair whose judges come later (pool rule 18) waits for them like an undetermined one.
    later = {c for pair in evidence.judges_later for c in pair}
    warm = () if scoring.reference is not None else warming(list(chosen), evidence.support, (*undetermined, *later),
                                                              pool.settings)
    report = dataclasses.replace(pair_report(evidence, scoring), unadjusted_rewards=unadjusted, rewards=paid)
    own = evidence.own
    return PooledRound(report, {c: [] if c in own else [e.name for e in chosen.get(c, [])] for c in report.rewards},
                       undetermined, evidence.pool_copies, evidence.lag_weights,
                       in_round_rewards=dict(round_report.rewards), short=tuple(chosen), warming=warm,
                       cautious=cautious_means(evidence.keys, evidence.payment, evidence.in_round_keys,
                                               evidence.lag_of, scoring.reference_weight, evidence.verdict),
                       unpaid=tuple(sorted(unsure)), resubmitted=evidence.resubmitted, charged_back=charged_back,
                       forfeited=evidence.forfeited, forfeit=forfeit,
                       planes=scoring.planes, evidence=kept_evidence)


__all__ = ["OWN_RESUBMISSION", "POOL_RULE", "POOL_SEPARATOR", "PeerPool", "PoolEntry", "PoolSettings", "PooledRound",
           "parse_pool_name", "pool_name", "recorded_pool_settings", "resubmitted_entries", "score_with_pool"]
