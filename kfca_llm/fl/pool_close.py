"""Closing a round: what the peer pool does once a round is scored, in one function that every caller reaches.

The live run (``fl.scoring.score_round``, ``flower.round_scoring.score_round``), ``verify`` and a resumed
``KFCAStrategy`` (both replay the ledger: ``flower.pool_replay.PoolTracker``) all call ``close_round``; each only
says what the round contributed, as a ``ClosingRound``: the live run from its report (``ClosingRound.scored``), the
replay from the ledger's rows. What the pool makes of it is decided here, once, from what the ledger records as well:

1. **join**: every participant outside a copy group (``copy_groups``: the ledger's ``duplicate_group``) joins the pool
   with its signs, its score and what it was paid (copies never become pool peers);
2. **charge back**: the own earlier entries a participant's copy group names alone (``resubmitted_entries``) are
   marked charged, unless the round's duplicate policy is ``flag`` (nothing is charged then), and so are the entries a
   short participant forfeited by turning against them (pool rule 8, ``fl.pool_reversal.round_forfeits``: judged on the
   pool as it stood when the round was scored, before the round joins it, as ``fl.pool_evidence`` judged them);
3. **keep pending**: the scorers paid 0 for want of peers (``PooledRound.unpaid``: the ledger's ``undetermined``),
   participants or scorers they own, wait as a ``PendingRound`` when the pool is on and at least two real
   participants' signs are kept (fewer: nothing to settle them against);
4. **settle**: the settlements due at this round are computed on the pool as it now stands (``pool_settle``) or, in a
   replay, the recorded ones taken, and then applied; at the run's last round (``closes_run``, the ledger's
   ``closes_run`` setting) every participant still waiting that the pool determines is settled, and nothing waits
   after it (pool rule 17).

A participant in two copy groups is read by the last one, as the ledger records it: the pool a replay rebuilds is the
live run's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from ..engine.duplicates import DuplicateRule
from ..packer import SignPacker
from ..report import RewardReport
from .peer_pool import PooledRound
from .pool_evidence import resubmitted_entries
from .pool_reversal import round_forfeits
from .pool_settle import PendingRound, Settlement, apply_settlements, due_settlements
from .pool_store import PeerPool, parse_pool_name
from .reference import REFERENCE


@dataclass(frozen=True)
class ClosingRound:
    """What a scored round contributes to the pool (see the module docstring for what ``close_round`` makes of it)."""

    round: int
    participants: tuple[str, ...]
    """The round's real participants, in the order they join the pool."""
    words: Mapping[str, np.ndarray]
    """Scorer -> its packed sign words (int32), copies and owned scorers included; a replay reads them on access."""
    groups: Mapping[str, tuple[str, ...]]
    """Scorer -> its copy group's members (``copy_groups``); missing: not a copy."""
    unadjusted_rewards: Mapping[str, float]
    rewards: Mapping[str, float]
    unpaid: tuple[str, ...]
    """The scorers paid 0 for want of peers."""
    peers: Mapping[str, Sequence[str]]
    """Scorer -> its peers (``RewardReport.peers``): a pending round's in-round pairs are the real ones among them."""
    duplicates: str
    """The round's duplicate policy."""
    pending: Callable[[], PendingRound]
    """The round as it would wait (seed, layout, task words, scoring settings, public planes; nobody waiting yet),
    called only when someone waits: a replay reads the task words and planes from the store then."""
    owners: Mapping[str, str] = dataclasses.field(default_factory=dict)
    """The attack analysis' scorers -> their participants (``score_with_pool``'s ``owners``)."""
    evidence: Mapping[str, float] = dataclasses.field(default_factory=dict)
    """``PooledRound.evidence`` (a ledger records none)."""
    settlements: Sequence[Settlement] | None = None
    """None: settle what is due (the live run); else the settlements the ledger recorded for this round (a replay)."""
    values: Mapping[str, np.ndarray] = dataclasses.field(default_factory=dict)
    """Scorer -> its value sketch (``fl.pool_values``; missing: none): joins the pool, and waits with a pending round."""
    closes_run: bool = False
    """The run's last round: every participant still waiting that the pool determines is settled (``pool_settle``)."""

    @classmethod
    def scored(cls, packer: SignPacker, round_: int, pooled: PooledRound, *, words: tuple[np.ndarray, np.ndarray],
               participants: Sequence[str], seed: int, penalty: str, bonus_fraction: float, duplicates: str,
               duplicate_rule: DuplicateRule, owners: Mapping[str, str] | None = None,
               values: Mapping[str, np.ndarray] | None = None, closes_run: bool = False) -> ClosingRound:
        """The live run's round: ``words`` is ``packer.words()`` (fetched once by the caller); ``owners`` and
        ``values`` as ``score_with_pool`` took them; ``closes_run``: the run's last round."""
        signs, task = words
        real, report, planes = set(participants), pooled.report, pooled.planes
        shapes = tuple((slot.name, tuple(slot.shape)) for slot in packer.layout.slots)

        def pending() -> PendingRound:
            return PendingRound(round_, seed, shapes, {}, np.ascontiguousarray(task, dtype=np.int32).copy(), (), (),
                                penalty, bonus_fraction, duplicates, duplicate_rule, planes=None if planes is None
                                else dataclasses.replace(planes, words=planes.host_words().copy()))

        return cls(round_, tuple(c for c in packer.clients if c in real),
                   {c: signs[k] for k, c in enumerate(packer.clients)}, copy_groups(report),
                   report.unadjusted_rewards, report.rewards, pooled.unpaid, report.peers, duplicates, pending,
                   dict(owners or {}), pooled.evidence, values=dict(values or {}), closes_run=closes_run)


def copy_groups(report: RewardReport) -> dict[str, tuple[str, ...]]:
    """Scorer -> the members of its copy group (the last one naming it): what the ledger records as a participant's
    ``duplicate_group`` and what ``close_round`` reads."""
    return {c: g.clients for g in report.duplicates for c in g.clients}


def close_round(pool: PeerPool, closing: ClosingRound,
                on_settling: Callable[[PeerPool], None] | None = None) -> list[Settlement]:
    """Close ``closing``'s round on ``pool`` (the module docstring's steps, in that order); returns the settlements
    applied. ``on_settling``: called on the pool as the round's settlements are computed, before any applies (a
    verifier scores the recorded ones again there)."""
    t = closing.round
    forfeits = _forfeits(pool, closing)
    joining = [c for c in closing.participants if c not in closing.groups]
    pool.add_round(t, {c: closing.words[c] for c in joining}, closing.unadjusted_rewards, closing.rewards,
                   closing.evidence, closing.values)
    if closing.duplicates != "flag":
        pool.mark_charged([name for c in closing.participants
                           for name in resubmitted_entries(c, closing.groups.get(c))])
    pool.mark_charged([name for names in forfeits.values() for name in names])
    _keep_pending(pool, closing)
    if on_settling is not None:
        on_settling(pool)
    settlements = (due_settlements(pool, t, closing.closes_run) if closing.settlements is None
                   else list(closing.settlements))
    apply_settlements(pool, t, settlements, closing.closes_run)
    return settlements


def _forfeits(pool: PeerPool, closing: ClosingRound) -> dict[str, tuple[str, ...]]:
    """What the round's short participants forfeited (step 2): those ``fl.pool_evidence`` judged, the real participants
    outside a copy group with fewer than ``min_peers`` distinct in-round peers, where the pool held entries of the
    window (and the round before it) when the round was scored."""
    if not pool.settings.enabled or not pool.entries(closing.round, extra=1):
        return {}

    def in_round(c: str) -> set[str]:
        return {p for p in closing.peers.get(c, ()) if p != REFERENCE and parse_pool_name(p) is None}

    short = [(c, closing.words[c]) for c in closing.participants
             if c not in closing.groups and len(in_round(c)) < pool.settings.min_peers]
    return round_forfeits(pool, closing.round, short, closing.pending().task) if short else {}


def _keep_pending(pool: PeerPool, closing: ClosingRound) -> None:
    """Keep the round as bits where scorers went unpaid for want of peers, to settle it later (step 3)."""
    real = set(closing.participants)
    owners = {scorer: owner for scorer, owner in closing.owners.items() if scorer not in real}
    kept = real | set(owners)
    waiting = tuple(c for c in closing.unpaid if c in kept)
    if not waiting or not pool.settings.enabled:
        return
    words = {c: np.ascontiguousarray(w, dtype=np.int32).copy() for c, w in closing.words.items() if c in kept}
    if len(words) - len(owners) < 2:
        return
    pairs = tuple((c, p) for c, peers in sorted(closing.peers.items()) if c in words for p in peers
                  if p in words and p != REFERENCE and parse_pool_name(p) is None)
    pool.pending[closing.round] = dataclasses.replace(closing.pending(), words=words, pairs=pairs, waiting=waiting,
                                                      owners=owners, values={c: v for c, v in closing.values.items()
                                                                             if c in words})
