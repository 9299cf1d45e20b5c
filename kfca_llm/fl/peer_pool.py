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
  one ranked lower, its verdict plus its record, ``PeerPool.record``: the lower of its window's and its run's);
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
* **undetermined**: a participant with fewer than ``min_peers`` distinct peers (in-round and pool) has no
  majority of independent peers that could outvote one deviator; the round is marked undetermined and its
  reward is not paid (0; the score stays in ``unadjusted_rewards``).

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

from ..engine import get_backend
from ..engine.duplicates import DuplicateGroup, DuplicateRule
from ..engine.public import OFF, PublicConditioning, PublicPlanes
from ..engine.stats import PairPayment, joint_tables, pair_payments
from ..errors import InputError
from ..packer import SIGN_LABELS, SignPacker
from ..report import RewardReport
from .aggregate import WeakVerdicts
from .pool_copies import apply_pool_policy, pool_copies_of, sketch, sketch_copies_of
from .pool_reversal import has_turned
from .pool_store import (POOL_RULE, POOL_SEPARATOR, VERDICT_GATE, PeerPool, PoolEntry, PoolSettings, parse_pool_name,
                         pool_name, recorded_pool_settings)
from .pool_weights import (cautious_means, evidence_of, lower_verdicts, orientation, pool_lag_weights, pool_scores,
                           public_blind_verdicts, trajectory_settles, verdict_errors, verdict_settles,
                           weighted_means)
from .reference import REFERENCE, check_reference_weight

OWN_RESUBMISSION = "own resubmission: scored without the pool"
"""The note of a copy group whose scorer resubmitted only its own earlier updates (``DuplicateGroup.note``)."""


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
    """Participant -> the pool entries of its own it resubmitted (a copy: paid at most 0; ``PeerPool.mark_resubmitted``
    records them once the round is closed)."""
    charged_back: dict[str, float] = dataclasses.field(default_factory=dict)
    """Participant of ``resubmitted`` -> what those entries had been paid and its reward was charged (0: nothing to
    charge, or charged by an earlier resubmission)."""
    planes: PublicPlanes | None = None
    """The round's public strata every pair was scored within (None: unconditioned); a pending round keeps them."""
    evidence: dict[str, float] = dataclasses.field(default_factory=dict)
    """Real participant the pool has a verdict on -> what the verdict tells of it (``fl.pool_weights.evidence_of``):
    what its reputation is built from (``PeerPool.reputation``); kept under ``rank_by="reputation"`` only (a ledger does
    not record it: a pool rebuilt from one has none)."""

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
                    conditioning: PublicConditioning = OFF) -> PooledRound:
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
    read as a report on this round's tasks, so on this round's public information too).
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
                           short=tuple(short), warming=_warming(short, {}, undetermined, pool.settings),
                           unpaid=tuple(short), planes=planes)
    return _score_pooled(packer, pool, round_, report, rows, chosen, real, owner, seed=seed, penalty=penalty,
                         bonus_fraction=bonus_fraction, duplicates=duplicates, duplicate_rule=duplicate_rule,
                         reference=reference, reference_weight=reference_weight, horizon=horizon, planes=planes)


def _score_pooled(packer: SignPacker, pool: PeerPool, round_: int, round_report: RewardReport,
                  rows: Mapping[str, PoolEntry], chosen: Mapping[str, list[PoolEntry]], real: set[str],
                  owner: Mapping[str, str], *,
                  seed: int, penalty: str, bonus_fraction: float, duplicates: str, duplicate_rule: DuplicateRule,
                  reference: np.ndarray | None, reference_weight: float, horizon: int | None,
                  planes: PublicPlanes | None) -> PooledRound:
    signs, task = packer.words()
    names = [*packer.clients, *rows, *([REFERENCE] if reference is not None else [])]
    index = {name: k for k, name in enumerate(names)}
    # The pooled rows on the CPU backend (host words; the bits are what they are on any backend, and every
    # backend counts them to the same integers), on this round's task mask and partition.
    cpu = get_backend("cpu")
    buffers = cpu.allocate(len(names), packer.layout)
    n_words = signs.shape[1]
    buffers.signs[:len(packer.clients), :n_words] = signs
    for k, entry in enumerate(rows.values(), start=len(packer.clients)):
        if entry.signs.shape != (n_words,):
            raise InputError(f"pool entry {entry.name} has {entry.signs.shape[-1]} sign words, this round {n_words}")
        buffers.signs[k, :n_words] = entry.signs
    if reference is not None:
        buffers.signs[index[REFERENCE], :n_words] = reference
    buffers.task[:n_words] = task
    counts = plain_counts = cpu.round_counts(buffers, seed, bonus_fraction)
    if planes is not None:
        negatives, sizes = cpu.stratum_counts(buffers, seed, bonus_fraction, planes.host_words())
        counts = dataclasses.replace(counts, strata_negatives=negatives, strata_sizes=sizes)

    pool_copies, lag_weights = (), {}
    if rows:
        # A settled round's copies are judged as they were then: a later submission matching it copied it.
        pool_names = names[:len(packer.clients) + sum(e.round < round_ for e in rows.values())]
        pool_copies = pool_copies_of(counts, pool_names, len(packer.clients), set(owner), duplicate_rule)
        pool_copies += sketch_copies_of(signs, names[:len(packer.clients)], set(owner), lambda words: pool.sketch_copies(
            words, task, round_, duplicate_rule.max_disagreement))
        lag_weights = pool_lag_weights(counts, list(rows.values()), len(packer.clients), pool.settings.window)
        pool_copies = own_replays_only(pool_copies, owner, pool.settings.own_replay_limit)
    own = _own_resubmissions(pool_copies, owner)
    pool_copies = _one_group_each(pool_copies, own)
    in_round_keys = list(round_report.pairwise)
    pool_keys = [(client, e.name) for client, entries in chosen.items() if client not in own for e in entries]
    lag_of = {e.name: lag_weights.get(abs(round_ - e.round), 0.0) for e in rows.values()}
    reference_keys = [(client, REFERENCE) for client in sorted(round_report.rewards)] if reference is not None else []
    keys = [*in_round_keys, *pool_keys, *reference_keys]
    index_pairs = np.array([(index[c], index[p]) for c, p in keys], dtype=np.int64)
    matches = cpu.sampled_matches(buffers, seed, bonus_fraction, index_pairs) if penalty == "sampled" else None
    payment, bonus, penalty_agreement = pair_payments(counts, index_pairs, matches)
    pay = dict(zip(keys, payment.tolist()))
    terms_of: dict[str, list[tuple[float, float]]] = {}
    for key in pool_keys:
        terms_of.setdefault(key[0], []).append((lag_of[key[1]], pay[key]))
    verdict = pool_scores(terms_of)
    # An own resubmission's pool term: 0 at the pool's weight, where the pool could have judged it.
    own_pool = {c: pool.settings.weight for c in own
                if c in chosen and any(lag_of.get(e.name, 0.0) for e in chosen[c])}

    # Who the pool ranks lower in a disagreeing pair: this round's verdict plus, for a real participant, its recent
    # record (an analysis scorer's owner's record is an honest submission's, not the strategy's). Within public strata
    # the verdict ranked is the lower of the one within them and the one without them, each with its error: neither
    # following the trajectory (a free rider) nor running against it (a flip) then ranks high.
    errors = verdict_errors(terms_of, verdict)
    ranked = {c: (z, errors[c]) for c, (z, _) in verdict.items()}
    blind = {} if planes is None else public_blind_verdicts(plain_counts, rows, len(packer.clients),
                                                            pool.settings.window, round_, pool_keys, index)
    ranked = lower_verdicts(ranked, blind)  # without strata: no blind verdicts, the verdicts as they are
    evidence = {c: evidence_of(*ranked[c]) for c in verdict}
    rank_by = pool.settings.rank_by if pool is not None else "record"  # (no pool: a reference alone, no verdicts)
    if rank_by == "reputation":  # the verdicts' evidence, this round's and the participant's earlier ones
        rank = {c: pool.reputation(c, round_, t, horizon) if c in real else t for c, t in evidence.items()}
    elif rank_by == "verdict":  # no record a sleeper could spend
        rank = {c: z for c, (z, _) in ranked.items()}
    else:
        rank = {c: z + ((pool.record(c, round_, horizon) if c in real else None) or 0.0) for c, (z, _) in ranked.items()}
    if rank_by == "verdict-first":  # a clear difference of verdicts settles alone
        clear = {(c, p) for c, p in in_round_keys if c in verdict and p in verdict and p not in own and verdict_settles(
            ranked[c], ranked[p], VERDICT_GATE)}
        rank_of = {(c, p): ((ranked[c][0], ranked[p][0]) if (c, p) in clear else (rank[c], rank.get(p)))
                   for c, p in in_round_keys if c in verdict}
    else:
        rank_of = {(c, p): (rank[c], rank.get(p)) for c, p in in_round_keys if c in verdict}
    # A participant whose update has turned by its own lineage (pool rule 7) is ranked below a partner that has not.
    mask = sketch(task)
    turned = {c for k, c in enumerate(packer.clients) if c in real and c in verdict and has_turned(
        pool.sketches(), pool.scores(), c, round_, sketch(signs[k]), mask)}
    rank_of |= {(c, p): (-1.0, 0.0) if c in turned else (0.0, -1.0) for c, p in rank_of
                if p in verdict and p not in own and (c in turned) != (p in turned)}
    # Within public strata, a pair the trajectory settles is ranked on the verdicts without the strata alone, whatever
    # the records: one of them clearly ran against the way the pool moved (a flip; a sleeper's or an on-off
    # attacker's record cannot buy it back).
    rank_of |= {(c, p): (blind[c][0], blind[p][0]) for c, p in rank_of
                if c in blind and p in blind and p not in own and trajectory_settles(blind[c], blind[p], VERDICT_GATE)}
    weights = [1.0 if c not in verdict or (p not in chosen and p not in own)
               else orientation(pay[(c, p)], rank_of[(c, p)][0], None if p in own else rank_of[(c, p)][1])
               for c, p in in_round_keys]
    weights += [lag_of[p] * pool.settings.weight / verdict[c][1] if c in verdict else 0.0 for c, p in pool_keys]
    weights += [reference_weight] * len(reference_keys)
    terms = dict(zip(keys, map(PairPayment, payment.tolist(), bonus.tolist(), penalty_agreement.tolist())))
    joints = dict(zip(keys, joint_tables(counts, index_pairs)))
    groups = (*round_report.duplicates, *pool_copies)
    report = RewardReport.from_pairs(terms, joints, seed=seed, penalty=penalty, bonus_fraction=bonus_fraction,
                                     backend=round_report.backend, labels=SIGN_LABELS, tasks=round_report.tasks,
                                     duplicates=groups, duplicate_policy=duplicates)
    unadjusted = weighted_means(keys, payment, weights, own_pool)
    paid = apply_pool_policy(unadjusted, round_report.duplicates, [g for g in pool_copies if g.note is None], duplicates)
    weighted: dict[str, set[str]] = {c: {"(pool)"} for c in own_pool}
    for (client, peer), weight in zip(keys, weights):
        if weight != 0.0:
            named = parse_pool_name(peer)
            weighted.setdefault(client, set()).add(named[0] if named else peer)
    # Fewer distinct peers than min_peers: no majority that could outvote a deviator, so the reward is not paid.
    # A trusted reference tells an honest participant from a deviator at any round size.
    # A participant's resubmission of its own earlier submission is a copy of it (never an analysis scorer's replay:
    # that answers what such an update earns in its round): paid at most 0, and what the copied submission was paid is
    # charged back, once. Its reward is then known, never undetermined.
    resubmitted = {} if duplicates == "flag" else {
        c: resubmitted_entries(c, next(g.clients for g in pool_copies if c in g.clients)) for c in sorted(own & real)}
    # Within public strata, nor where the pool's verdict alone would pay it (no in-round peer counted) and stands within
    # VERDICT_GATE standard errors of 0: there an honest update's verdict across rounds can be as weak as noise, and a
    # payment of noise is no evidence (the in-round peer an own resubmission or a constant report, say).
    counted = {c for (c, _), weight in zip(in_round_keys, weights) if weight != 0.0}
    unsure = set() if reference is not None else {
        c for c in chosen if c not in resubmitted and (len(weighted.get(c, ())) < pool.settings.min_peers or (
            planes is not None and c in verdict and c not in counted
            and not abs(verdict[c][0]) > VERDICT_GATE * errors[c]))}
    paid |= {c: 0.0 for c in unsure}
    charged_back = {c: pool.charge_of(names) for c, names in resubmitted.items()}
    paid |= {c: min(paid[c], 0.0) - charged_back[c] for c in resubmitted}
    # A submission its participant resubmitted since (settled late, ``fl.pool_settle``) is paid at most 0 too.
    paid |= {c: min(paid[c], 0.0) for c in paid
             if pool is not None and c in real and pool.resubmitted(pool_name(c, round_))}
    report = dataclasses.replace(report, unadjusted_rewards=unadjusted, rewards=paid)
    undetermined = tuple(sorted(c for c in unsure if c in real))
    # An own resubmission never meets the pool: nothing stands behind its reward but its round.
    support = {c: 0 if c in own else len({e.participant for e in entries if lag_weights.get(abs(round_ - e.round), 0.0)})
               for c, entries in chosen.items()}
    # A trusted reference tells an honest participant from a deviator at any round size: nothing warms up.
    warming = () if reference is not None else _warming(list(chosen), support, undetermined, pool.settings)
    return PooledRound(report, {c: [] if c in own else [e.name for e in chosen.get(c, [])] for c in report.rewards},
                       undetermined, pool_copies, lag_weights, in_round_rewards=dict(round_report.rewards),
                       short=tuple(chosen), warming=warming,
                       cautious=cautious_means(keys, payment, in_round_keys, lag_of, reference_weight, verdict),
                       unpaid=tuple(sorted(unsure)), resubmitted=resubmitted, charged_back=charged_back,
                       planes=planes,
                       evidence={c: t for c, t in evidence.items() if c in real and rank_by == "reputation"})


def _warming(short: Sequence[str], support: Mapping[str, int], undetermined: Sequence[str],
             settings: PoolSettings) -> tuple[str, ...]:
    """The short scorers the pool is still warming up for: undetermined, or fewer than ``pool_peers`` distinct
    pool participants of non-zero weight (``support``) behind the reward."""
    return tuple(c for c in short if c in undetermined or support.get(c, 0) < settings.pool_peers)


def _one_group_each(pool_copies: Sequence[DuplicateGroup], own: set[str]) -> tuple[DuplicateGroup, ...]:
    """The pool copies with each own resubmitter's groups (window and sketch) as one, noted ``OWN_RESUBMISSION``: the
    ledger keeps one group a participant (``resubmitted_entries`` reads it back)."""
    out = [g for g in pool_copies if not own & set(g.clients)]
    for client in sorted(own):
        mine = [g for g in pool_copies if client in g.clients]
        out.append(DuplicateGroup(tuple(sorted({m for g in mine for m in g.clients})),
                                  tuple(p for g in mine for p in g.pairs), OWN_RESUBMISSION))
    return tuple(out)


def resubmitted_entries(participant: str, group: Sequence[str] | None) -> tuple[str, ...]:
    """The pool entries of a participant's own that its copy group (a ledger row's ``duplicate_group``) names, when it
    names nothing else: an own resubmission's (else ())."""
    others = sorted(set(group or ()) - {participant})
    named = [parse_pool_name(m) for m in others]
    return tuple(others) if others and all(n is not None and n[0] == participant for n in named) else ()


def own_replays_only(groups: Sequence[DuplicateGroup], owner: Mapping[str, str], limit: float
                     ) -> tuple[DuplicateGroup, ...]:
    """The pool copy groups with every match of a scorer to an earlier submission of its own participant (``owner``)
    that differs in more than ``limit`` of the signs left out (a retrain on the same samples, not a replay: see
    ``fl.pool_copies``); groups left with no match drop."""
    out = []
    for group in groups:
        scorer = next(c for c in group.clients if c in owner)

        def kept(pair) -> bool:
            entry = parse_pool_name(pair.peer if pair.client == scorer else pair.client)
            # agreement is 1 - (differing / tasks) rounded: 1 - agreement can exceed the rate it came from (5 of 250
            # signs: 0.020000000000000018), 1 - limit rounds the same way as the agreement did.
            return pair.agreement >= 1.0 - limit or entry is None or entry[0] != owner[scorer]

        pairs = tuple(filter(kept, group.pairs))
        if pairs:
            members = {scorer, *(p.peer if p.client == scorer else p.client for p in pairs)}
            out.append(dataclasses.replace(group, clients=tuple(sorted(members)), pairs=pairs))
    return tuple(out)


def _own_resubmissions(pool_copies: Sequence[DuplicateGroup], owner: Mapping[str, str]) -> set[str]:
    """Scorers every pool copy of which is an earlier submission of their owner (a group of a scorer and entries
    of another participant, or of several, is not: it is paid under the duplicate policy)."""
    own, other = set(), set()
    for group in pool_copies:
        for client in (c for c in group.clients if c in owner):
            entries = [parse_pool_name(m) for m in group.clients if m != client]
            (own if all(e is not None and e[0] == owner[client] for e in entries) else other).add(client)
    return own - other


__all__ = ["OWN_RESUBMISSION", "POOL_RULE", "POOL_SEPARATOR", "PeerPool", "PoolEntry", "PoolSettings", "PooledRound",
           "parse_pool_name", "pool_name", "recorded_pool_settings", "resubmitted_entries", "score_with_pool"]
