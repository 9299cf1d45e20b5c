"""Step 1 of the cross-round reward (``fl.pool_reward``): what a short round's reward is computed from, gathered
once before any rule pays. The pair counts of the round's scorers, the pool rows and the trusted reference on this
round's task mask and partition; the copies of pool entries, who resubmitted only its own and which entries (none
under the duplicate policy ``flag``); the pairs scored (in round, pool, reference) and their payments; the lag
weights; the pool's verdicts with their standard errors, and the verdicts without the public strata
(``fl.pool_weights``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from ..engine import get_backend
from ..engine.duplicates import DuplicateGroup, DuplicateRule
from ..engine.public import PublicPlanes
from ..engine.stats import RoundCounts, pair_payments
from ..errors import InputError
from ..packer import SignPacker
from ..report import Pair, RewardReport
from .pool_copies import pool_copies_of, sketch, sketch_copies_of
from .pool_next import next_round_ranks, one_sign, open_pairs
from .pool_reversal import has_turned, round_forfeits
from .pool_store import VERDICT_GATE, PeerPool, PoolEntry, parse_pool_name
from .pool_values import replays_values
from .pool_weights import lower_verdicts, pool_lag_weights, pool_scores, public_blind_verdicts, verdict_errors
from .reference import REFERENCE

OWN_RESUBMISSION = "own resubmission: scored without the pool"
"""The note of a copy group whose scorer resubmitted only its own earlier updates (``DuplicateGroup.note``)."""


@dataclass(frozen=True)
class PooledScoring:
    """How a round is scored, as ``fl.peer_pool.score_with_pool`` took it (``reference``: checked; None when
    ignored)."""

    seed: int
    penalty: str
    bonus_fraction: float
    duplicates: str
    duplicate_rule: DuplicateRule
    reference: np.ndarray | None
    reference_weight: float
    horizon: int | None
    planes: PublicPlanes | None
    values: Mapping[str, np.ndarray] = dataclasses.field(default_factory=dict)
    """Scorer -> its value sketch (``fl.pool_values``; missing: none, its own matches decided by the signs alone)."""


@dataclass(frozen=True)
class PoolEvidence:
    """What a short round's reward is computed from (see the module docstring)."""

    round: int
    round_report: RewardReport
    """The round scored on its own peers (``SignPacker.score``)."""
    chosen: Mapping[str, list[PoolEntry]]
    """Short scorer -> its pool peers."""
    real: frozenset[str]
    counts: RoundCounts
    """The pair counts, within the public strata when the round has them."""
    pool_copies: tuple[DuplicateGroup, ...]
    """The groups of a scorer and the pool entries it copies, an own resubmitter's as one (``OWN_RESUBMISSION``)."""
    own: frozenset[str]
    """Scorers that copied only their own participant's earlier submissions."""
    lag_weights: dict[int, float]
    lag_of: dict[str, float]
    """Pool entry -> its lag's weight."""
    in_round_keys: list[Pair]
    pool_keys: list[Pair]
    """(short scorer, pool entry) pairs; none for an own resubmitter."""
    reference_keys: list[Pair]
    index_pairs: np.ndarray
    """The row indices of every pair of ``keys``."""
    payment: np.ndarray
    bonus: np.ndarray
    penalty_agreement: np.ndarray
    verdict: dict[str, tuple[float, float]]
    """Scorer -> (the pool's verdict, the sum of its peers' absolute lag weights); missing: no verdict."""
    errors: dict[str, float]
    """Scorer -> its verdict's standard error."""
    blind: dict[str, tuple[float, float]]
    """Scorer -> (verdict, standard error) without the public strata (none without strata)."""
    own_pool: dict[str, float]
    """Own resubmitter the pool could have judged -> its pool term's weight (a term of payment 0)."""
    resubmitted: dict[str, tuple[str, ...]]
    """Real own resubmitter -> the entries of its own it resubmitted (none under the duplicate policy ``flag``)."""
    turned: frozenset[str]
    """Real participants the pool has a verdict on whose update has turned by their own lineage (pool rule 7,
    ``fl.pool_reversal``), judged for the participants of a disagreeing pair and for the peer of an agreeing pair
    whose scorer ran against the trajectory (``against_trajectory``, pool rule 9)."""
    forfeited: dict[str, tuple[str, ...]]
    """Short real participant, not a copy, whose update turned by reversing its previous one -> the pool entries of
    its own it forfeits (pool rule 8, ``fl.pool_reversal.forfeited``); none when settling a round."""
    constant: frozenset[str]
    """The round's submissions that report one sign on every task (a zero update): no in-round peer's agreement with
    them is evidence (pool rule 10)."""
    held: frozenset[Pair] = frozenset()
    """The disagreeing in-round pairs nothing else settles (``fl.pool_next.open_pairs``, pool rule 15): their
    participants are held undetermined as the round is scored, and settled by the round after it."""
    next_round: dict[Pair, tuple[float, float]] = dataclasses.field(default_factory=dict)
    """Held pair -> its two ranks by the round after it (``fl.pool_next.next_round_ranks``), where a settlement
    reaches a round after it that settles the pair."""
    judges_later: frozenset[Pair] = frozenset()
    """Held pairs whose judges need a round after the settling horizon (pool rule 18): not settled before it comes,
    but at the last chance, ranked as any settled pair."""

    @property
    def keys(self) -> list[Pair]:
        return [*self.in_round_keys, *self.pool_keys, *self.reference_keys]

    @property
    def pay(self) -> dict[Pair, float]:
        return dict(zip(self.keys, self.payment.tolist()))

    @property
    def support(self) -> dict[str, int]:
        """Short scorer -> the distinct pool participants of non-zero lag weight behind its reward (an own
        resubmission never meets the pool: none)."""
        return {c: 0 if c in self.own else len({e.participant for e in entries
                                                if self.lag_weights.get(abs(self.round - e.round), 0.0)})
                for c, entries in self.chosen.items()}


def gather_evidence(packer: SignPacker, pool: PeerPool | None, round_: int, round_report: RewardReport,
                    rows: Mapping[str, PoolEntry], chosen: Mapping[str, list[PoolEntry]], real: set[str],
                    owner: Mapping[str, str], scoring: PooledScoring) -> PoolEvidence:
    """The evidence of a round whose scorers ``chosen`` borrow pool peers among ``rows`` (the window, earlier rounds
    first) or meet a trusted reference; ``owner``: scorer -> the participant whose pool peers it gets."""
    reference, seed, bonus_fraction = scoring.reference, scoring.seed, scoring.bonus_fraction
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
    if scoring.planes is not None:
        negatives, sizes = cpu.stratum_counts(buffers, seed, bonus_fraction, scoring.planes.host_words())
        counts = dataclasses.replace(counts, strata_negatives=negatives, strata_sizes=sizes)

    pool_copies, lag_weights = (), {}
    if rows:
        rule = scoring.duplicate_rule
        # A settled round's copies are judged as they were then: a later submission matching it copied it.
        pool_names = names[:len(packer.clients) + sum(e.round < round_ for e in rows.values())]
        pool_copies = pool_copies_of(counts, pool_names, len(packer.clients), set(owner), rule)
        pool_copies += sketch_copies_of(signs, names[:len(packer.clients)], set(owner),
                                        lambda words: pool.sketch_copies(words, task, round_, rule.max_disagreement))
        lag_weights = pool_lag_weights(counts, list(rows.values()), len(packer.clients), pool.settings.window)
        pool_copies = own_replays_only(pool_copies, owner, pool.settings.own_replay_limit, lambda scorer, entry:
                                       replays_values(scoring.values.get(scorer), pool.values_of(entry)))
    own = own_resubmitters(pool_copies, owner)
    pool_copies = one_group_each(pool_copies, own)
    in_round_keys = list(round_report.pairwise)
    pool_keys = [(client, e.name) for client, entries in chosen.items() if client not in own for e in entries]
    lag_of = {e.name: lag_weights.get(abs(round_ - e.round), 0.0) for e in rows.values()}
    reference_keys = [(client, REFERENCE) for client in sorted(round_report.rewards)] if reference is not None else []
    keys = [*in_round_keys, *pool_keys, *reference_keys]
    index_pairs = np.array([(index[c], index[p]) for c, p in keys], dtype=np.int64)
    matches = cpu.sampled_matches(buffers, seed, bonus_fraction, index_pairs) if scoring.penalty == "sampled" else None
    payment, bonus, penalty_agreement = pair_payments(counts, index_pairs, matches)
    pay = dict(zip(keys, payment.tolist()))
    terms_of: dict[str, list[tuple[float, float]]] = {}
    for key in pool_keys:
        terms_of.setdefault(key[0], []).append((lag_of[key[1]], pay[key]))
    verdict = pool_scores(terms_of)
    # No pool entries, no verdicts without the strata either (and maybe no pool: a trusted reference alone).
    blind = {} if scoring.planes is None or not rows else public_blind_verdicts(
        plain_counts, rows, len(packer.clients), pool.settings.window, round_, pool_keys, index)
    # An own resubmission's pool term: 0 at the pool's weight, where the pool could have judged it.
    own_pool = {c: pool.settings.weight for c in own
                if c in chosen and any(lag_of.get(e.name, 0.0) for e in chosen[c])}
    # A participant's resubmission of its own earlier submission is a copy of it (never an analysis scorer's replay:
    # that answers what such an update earns in its round).
    resubmitted = {} if scoring.duplicates == "flag" else {
        c: resubmitted_entries(c, next(g.clients for g in pool_copies if c in g.clients)) for c in sorted(own & real)}
    # Pool rule 7 ranks disagreeing pairs (a lineage is judged for theirs); pool rule 9 reads back the peer of an
    # agreeing pair whose scorer ran against the trajectory where that peer has turned (a lineage judged for it too).
    disagreeing = {x for c, p in in_round_keys if pay[(c, p)] < 0 for x in (c, p)}
    agreeing = {p for c, p in in_round_keys if pay[(c, p)] >= 0 and against_trajectory(blind.get(c))}
    judged = (disagreeing | agreeing) & real & set(verdict)
    sketches, mask = (pool.sketches(), sketch(task)) if judged else ([], None)
    turned = frozenset(c for k, c in enumerate(packer.clients) if c in judged and has_turned(
        sketches, pool.score_of, c, round_, sketch(signs[k]), mask))
    # Pool rule 8: forfeits are judged as the round is scored (a settlement pays only its waiting scorers, and a
    # forfeiting one never waits); fl.pool_close marks the same ones, computed alike.
    copied = {m for g in (*round_report.duplicates, *pool_copies) for m in g.clients}
    forfeits = {} if scoring.horizon is not None or not rows or pool is None else round_forfeits(
        pool, round_, [(c, signs[k]) for k, c in enumerate(packer.clients)
                       if c in chosen and c in real and c not in copied], task)
    constant = frozenset(c for k, c in enumerate(packer.clients) if one_sign(signs[k], task))
    errors = verdict_errors(terms_of, verdict)
    # Pool rule 15: a disagreeing pair of real participants nothing else settles is held, and settled by the round
    # after it (never with a trusted reference: it tells who deviated).
    judged_pairs = (real & set(verdict)) - own - constant
    candidates = [(c, p) for c, p in in_round_keys if pay[(c, p)] < 0 and {c, p} <= judged_pairs]
    verdict_first = pool is not None and pool.settings.rank_by == "verdict-first"
    held = frozenset() if reference is not None or pool is None or not pool.settings.next_round else open_pairs(
        candidates, lower_verdicts({c: (z, errors[c]) for c, (z, _) in verdict.items()}, blind) if verdict_first
        else {}, blind, turned, verdict_first, VERDICT_GATE, settling=scoring.horizon is not None)
    next_round, judges_later = ({}, frozenset()) if scoring.horizon is None or not held else next_round_ranks(
        held, round_, list(rows.values()), owner, task,
        lambda x, y: float(pair_payments(counts, np.array([(index[x], index[y])], dtype=np.int64))[0][0]),
        scoring.horizon)
    return PoolEvidence(round_, round_report, chosen, frozenset(real), counts, pool_copies, frozenset(own),
                        lag_weights, lag_of, in_round_keys, pool_keys, reference_keys, index_pairs, payment, bonus,
                        penalty_agreement, verdict, errors, blind, own_pool, resubmitted, turned, forfeits, constant,
                        held, next_round, judges_later)


def against_trajectory(blind: tuple[float, float] | None) -> bool:
    """Whether a verdict without the public strata (verdict, standard error; None: none) ran against the way the pool
    moved: more than ``VERDICT_GATE`` standard errors below 0 (an honest update's was in 7 of 767, a flipped update's
    in 24 of 63: ``benchmarks/ROBUSTNESS.md``, pool rule 6)."""
    return blind is not None and blind[0] < -VERDICT_GATE * blind[1]


def own_replays_only(groups: Sequence[DuplicateGroup], owner: Mapping[str, str], limit: float,
                     same_values: Callable[[str, str], bool] = lambda scorer, entry: True
                     ) -> tuple[DuplicateGroup, ...]:
    """The pool copy groups with every match of a scorer to an earlier submission of its own participant (``owner``)
    that differs in more than ``limit`` of the signs left out, and under a limit of 0 one whose values differ too
    (``same_values(scorer, entry name)``, pool rule 11): a retrain on the same samples, not a replay (see
    ``fl.pool_copies``); groups left with no match drop."""
    out = []
    for group in groups:
        scorer = next(c for c in group.clients if c in owner)

        def kept(pair) -> bool:
            entry = parse_pool_name(pair.peer if pair.client == scorer else pair.client)
            # agreement is 1 - (differing / tasks) rounded: 1 - agreement can exceed the rate it came from (5 of 250
            # signs: 0.020000000000000018), 1 - limit rounds the same way as the agreement did.
            if entry is None or entry[0] != owner[scorer]:
                return True
            name = pair.peer if pair.client == scorer else pair.client
            return pair.agreement >= 1.0 - limit and (limit > 0 or same_values(scorer, name))

        pairs = tuple(filter(kept, group.pairs))
        if pairs:
            members = {scorer, *(p.peer if p.client == scorer else p.client for p in pairs)}
            out.append(dataclasses.replace(group, clients=tuple(sorted(members)), pairs=pairs))
    return tuple(out)


def own_resubmitters(pool_copies: Sequence[DuplicateGroup], owner: Mapping[str, str]) -> set[str]:
    """Scorers every pool copy of which is an earlier submission of their owner (a group of a scorer and entries
    of another participant, or of several, is not: it is paid under the duplicate policy)."""
    own, other = set(), set()
    for group in pool_copies:
        for client in (c for c in group.clients if c in owner):
            entries = [parse_pool_name(m) for m in group.clients if m != client]
            (own if all(e is not None and e[0] == owner[client] for e in entries) else other).add(client)
    return own - other


def one_group_each(pool_copies: Sequence[DuplicateGroup], own: set[str]) -> tuple[DuplicateGroup, ...]:
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
