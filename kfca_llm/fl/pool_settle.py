"""Settling undetermined rounds later: a round the pool could not judge is scored again once rounds after it exist.

At two participants per round nothing tells, in the round itself, which of a disagreeing pair deviated; in the first
rounds of a run (or when the other recent participants all deviated) the pool cannot tell either, and the round is
*undetermined*: its participants are not paid then (``fl.peer_pool``). Their submissions stay useful evidence, and so
do the submissions that come after them: an update agrees with those of later rounds as with earlier ones (the lag
weights are estimated on pairs of pool entries, whichever of the two came first). So the round is kept as bits
(``PendingRound``: every participant's packed sign words, the task words, its seed and in-round pairs) and, at the end
of each later round, scored again with ``score_with_pool(..., horizon=)``: pool peers, lag weights and records from
the window on both sides of it, copies judged as they were then. A waiting participant is **settled** (paid that
reward, a ``Settlement``) once it is determined and the pool is no longer warming up for it (``pool_peers`` distinct
pool participants of non-zero lag weight behind it), or, at the last round the window still covers it, once it is
determined at all; a participant still undetermined then is never paid for that round. A settled participant's entry
is vetted by its settled score from then on (``PeerPool.rescore``), as if its round had been judged in time.

All settlements of a round are computed on the pool as it stands after that round was added, before any of them
rescores an entry: the order in which pending rounds are settled changes nothing, and a verifier recomputes each from
the same pool (``flower.recompute``).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from ..engine.duplicates import DuplicateRule
from ..engine.layout import Layout
from ..engine.public import PublicPlanes
from ..errors import InputError
from ..packer import SignPacker
from .peer_pool import PooledRound, score_with_pool
from .pool_store import PeerPool, parse_pool_name, pool_name
from .reference import REFERENCE


@dataclass(frozen=True)
class PendingRound:
    """An undetermined round kept as bits until it can be settled."""

    round: int
    seed: int
    shapes: tuple[tuple[str, tuple[int, ...]], ...]
    """(tensor name, shape) of the round's layout."""
    words: Mapping[str, np.ndarray]
    """Every real participant's packed sign words (int32), copies included: they are its participants' peers."""
    task: np.ndarray
    pairs: tuple[tuple[str, str], ...]
    """The round's in-round (scorer, peer) pairs."""
    waiting: tuple[str, ...]
    """The participants not paid yet."""
    penalty: str = "expected"
    bonus_fraction: float = 0.5
    duplicates: str = "zero"
    duplicate_rule: DuplicateRule = DuplicateRule()
    owners: Mapping[str, str] = dataclasses.field(default_factory=dict)
    """Scorer -> its participant, for the attack analysis' side-by-side submissions (``score_with_pool``'s ``owners``):
    settled as their owner's pool would pay them, never pool entries."""
    planes: PublicPlanes | None = None
    """The round's public strata (host words), as it was scored: settling scores it within them again."""

    def packer(self) -> SignPacker:
        return SignPacker.from_words(dict(self.shapes), self.words, self.task)

    def metadata(self) -> dict:
        """The JSON-able fields (``words`` and ``task`` travel as arrays: ``pending_to_arrays``)."""
        return {"round": self.round, "seed": self.seed, "shapes": [[n, list(s)] for n, s in self.shapes],
                "clients": sorted(self.words), "pairs": [list(p) for p in self.pairs], "waiting": list(self.waiting),
                "penalty": self.penalty, "bonus_fraction": self.bonus_fraction, "duplicates": self.duplicates,
                "duplicate_rule": dataclasses.asdict(self.duplicate_rule), "owners": dict(self.owners),
                **({} if self.planes is None else {"public_steps": self.planes.steps,
                                                   "public_magnitude_bits": self.planes.magnitude_bits})}

    @classmethod
    def from_metadata(cls, meta: Mapping, words: Mapping[str, np.ndarray], task: np.ndarray,
                      planes: np.ndarray | None = None) -> PendingRound:
        try:
            public = None if planes is None else PublicPlanes(np.asarray(planes, dtype=np.int32),
                                                              int(meta["public_steps"]),
                                                              int(meta["public_magnitude_bits"]))
            return cls(int(meta["round"]), int(meta["seed"]), tuple((str(n), tuple(map(int, s))) for n, s in meta["shapes"]),
                       dict(words), np.asarray(task, dtype=np.int32), tuple((str(a), str(b)) for a, b in meta["pairs"]),
                       tuple(map(str, meta["waiting"])), str(meta["penalty"]), float(meta["bonus_fraction"]),
                       str(meta["duplicates"]), DuplicateRule(**meta["duplicate_rule"]),
                       {str(k): str(v) for k, v in meta.get("owners", {}).items()}, public)
        except (KeyError, TypeError, ValueError) as exc:
            raise InputError(f"a pending round's record is not one this version reads ({exc})") from None


@dataclass(frozen=True)
class Settlement:
    """A participant of an undetermined round, paid at the end of a later round."""

    round: int
    """The round whose submission is paid."""
    settled_in: int
    """The round at whose end it was settled (its pool decided)."""
    participant: str
    reward: float
    """Paid, after the round's duplicate policy (as ``RewardReport.rewards``)."""
    unadjusted_reward: float
    peers: tuple[str, ...]
    """The in-round peers and pool entries (``<participant>@<round>``) it was scored against."""

    def to_dict(self) -> dict:
        return {**dataclasses.asdict(self), "peers": list(self.peers)}


def close_round(pool: PeerPool, packer: SignPacker, round_: int, pooled: PooledRound, *,
                words: tuple[np.ndarray, np.ndarray], participants: Sequence[str], seed: int, penalty: str,
                bonus_fraction: float, duplicates: str, duplicate_rule: DuplicateRule,
                owners: Mapping[str, str] | None = None) -> list[Settlement]:
    """What the pool does once a round is scored: its participants join it (copies left out) with what they were paid,
    the own submissions its participants resubmitted are marked (charged back), the round is kept pending where
    scorers went unpaid for want of peers, and what the pool can now settle is settled (returned).
    ``words``: the round's ``packer.words()`` (fetched once by the caller); ``owners``: the attack analysis' scorers and
    their participants, as ``score_with_pool`` took them."""
    signs, task = words
    joining = set(participants) - {c for g in pooled.report.duplicates for c in g.clients}
    pool.add_round(round_, {c: signs[k] for k, c in enumerate(packer.clients) if c in joining},
                   pooled.report.unadjusted_rewards, pooled.report.rewards, pooled.evidence)
    pool.mark_resubmitted([name for names in pooled.resubmitted.values() for name in names])
    _keep_pending(pool, packer, signs, task, round_, pooled, seed=seed, participants=participants, penalty=penalty,
                  bonus_fraction=bonus_fraction, duplicates=duplicates, duplicate_rule=duplicate_rule, owners=owners)
    return settle_due(pool, round_)


def _keep_pending(pool: PeerPool, packer: SignPacker, signs: np.ndarray, task: np.ndarray, round_: int,
                  pooled: PooledRound, *, seed: int, participants: Sequence[str], penalty: str, bonus_fraction: float,
                  duplicates: str, duplicate_rule: DuplicateRule, owners: Mapping[str, str] | None) -> None:
    """Keep a scored round whose scorers went unpaid for want of peers, to settle it later (nothing when none did)."""
    real = set(participants)
    owners = {scorer: owner for scorer, owner in (owners or {}).items() if scorer not in real}
    kept = real | set(owners)
    waiting = tuple(c for c in pooled.unpaid if c in kept)
    if not waiting or not pool.settings.enabled:
        return
    words = {c: np.ascontiguousarray(signs[k], dtype=np.int32).copy() for k, c in enumerate(packer.clients) if c in kept}
    if len(words) - len(owners) < 2:
        return
    pairs = tuple((c, p) for c, peers in sorted(pooled.report.peers.items()) if c in words for p in peers
                  if p in words and p != REFERENCE and parse_pool_name(p) is None)
    shapes = tuple((slot.name, tuple(slot.shape)) for slot in packer.layout.slots)
    planes = None if pooled.planes is None else dataclasses.replace(pooled.planes, words=pooled.planes.host_words().copy())
    pool.pending[round_] = PendingRound(round_, seed, shapes, words, np.ascontiguousarray(task, dtype=np.int32).copy(),
                                        pairs, waiting, penalty, bonus_fraction, duplicates, duplicate_rule, owners,
                                        planes)


def score_pending(pool: PeerPool, pending: PendingRound, horizon: int) -> PooledRound:
    """The pending round scored on the pool as it stands at ``horizon``, both sides of it."""
    return score_with_pool(pending.packer(), pool, pending.round, pairs=pending.pairs, seed=pending.seed,
                           penalty=pending.penalty, bonus_fraction=pending.bonus_fraction,
                           duplicates=pending.duplicates, duplicate_rule=pending.duplicate_rule,
                           copy_candidates=sorted(c for c in pending.words if c not in pending.owners),
                           owners=pending.owners, horizon=horizon, public=pending.planes)


def settle_due(pool: PeerPool, horizon: int) -> list[Settlement]:
    """Settle what the pool at ``horizon`` (its round just added) can: see the module docstring. Updates
    ``pool.pending`` and rescores the settled entries (``apply_settlements``)."""
    out: list[Settlement] = []
    for t in sorted(pool.pending):
        if t >= horizon:
            continue
        pending = pool.pending[t]
        pooled = score_pending(pool, pending, horizon)
        report = pooled.report
        out += [Settlement(t, horizon, c, float(report.rewards[c]), float(report.unadjusted_rewards[c]),
                           tuple(report.peers[c])) for c in settles(pool, pending, pooled, horizon)]
    apply_settlements(pool, horizon, out)
    return out


def settles(pool: PeerPool, pending: PendingRound, pooled: PooledRound, horizon: int) -> list[str]:
    """The waiting participants ``pooled`` (the pending round scored at ``horizon``) settles: determined, and the pool
    no longer warming up for them or the window's last chance."""
    last = horizon - pending.round >= pool.settings.window
    return [c for c in pending.waiting if c not in pooled.unpaid and (last or c not in pooled.warming)]


def apply_settlements(pool: PeerPool, horizon: int, settlements: Sequence[Settlement]) -> None:
    """What settling does to the pool at ``horizon``: settled participants stop waiting, a pending round the window no
    longer covers (or with nobody left waiting) is dropped, settled entries are vetted by their settled scores."""
    done = {(s.round, s.participant) for s in settlements}
    for t in sorted(pool.pending):
        if t >= horizon:
            continue
        pending = pool.pending[t]
        waiting = tuple(c for c in pending.waiting if (t, c) not in done)
        if waiting and horizon - t < pool.settings.window:
            pool.pending[t] = dataclasses.replace(pending, waiting=waiting)
        else:
            del pool.pending[t]
    for settled in settlements:
        pool.rescore(pool_name(settled.participant, settled.round), settled.unadjusted_reward)
        pool.settle_paid(pool_name(settled.participant, settled.round), settled.reward)


def pending_to_arrays(pool: PeerPool) -> tuple[dict[str, np.ndarray], str]:
    """The pool's pending rounds as arrays and one JSON string (``fl.state.save_pool`` stores them beside the pool's
    own ``to_arrays``)."""
    arrays, records = {}, []
    for k, pending in enumerate(pool.pending[t] for t in sorted(pool.pending)):
        arrays[f"pending.{k}.task"] = pending.task
        if pending.planes is not None:
            arrays[f"pending.{k}.@public"] = pending.planes.host_words()
        for client, words in sorted(pending.words.items()):
            arrays[f"pending.{k}.{client}"] = words
        records.append(pending.metadata())
    return arrays, json.dumps(records)


def pending_from_arrays(arrays: Mapping[str, np.ndarray], records: str) -> dict[int, PendingRound]:
    out = {}
    for k, meta in enumerate(json.loads(records)):
        words = {c: np.asarray(arrays[f"pending.{k}.{c}"], dtype=np.int32) for c in meta["clients"]}
        pending = PendingRound.from_metadata(meta, words, arrays[f"pending.{k}.task"], arrays.get(f"pending.{k}.@public"))
        Layout.from_shapes(dict(pending.shapes))  # a misshapen record fails here, not at settling time
        out[pending.round] = pending
    return out
