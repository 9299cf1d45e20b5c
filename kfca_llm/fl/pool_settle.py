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
determined at all; a participant still undetermined then is never paid for that round. The run's last round is the
last chance of every round still waiting, its own included (``closes_run``, pool rule 17): no later round will come to
settle them, so whoever its pool determines is settled there, warm or not (a pair held for the round after it,
``fl.pool_next``, is ranked on the verdicts and records as any settled pair without one), and nothing waits after it. A
settled participant's entry is vetted by its settled score from then on (``PeerPool.rescore``), as if its round had
been judged in time.

All settlements of a round are computed on the pool as it stands after that round was added, before any of them
rescores an entry: the order in which pending rounds are settled changes nothing, and a verifier recomputes each from
the same pool (``flower.pool_replay``). ``fl.pool_close.close_round`` keeps a round pending and settles and applies
what is due.
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
from .pool_store import PeerPool, pool_name


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
    values: Mapping[str, np.ndarray] = dataclasses.field(default_factory=dict)
    """Scorer -> its value sketch (``fl.pool_values``; missing: none): its own replays are judged as they were then."""

    def packer(self) -> SignPacker:
        return SignPacker.from_words(dict(self.shapes), self.words, self.task)

    def metadata(self) -> dict:
        """The JSON-able fields (``words`` and ``task`` travel as arrays: ``pending_to_arrays``)."""
        return {"round": self.round, "seed": self.seed, "shapes": [[n, list(s)] for n, s in self.shapes],
                "clients": sorted(self.words), "pairs": [list(p) for p in self.pairs], "waiting": list(self.waiting),
                "penalty": self.penalty, "bonus_fraction": self.bonus_fraction, "duplicates": self.duplicates,
                "duplicate_rule": dataclasses.asdict(self.duplicate_rule), "owners": dict(self.owners),
                "values": sorted(self.values),
                **({} if self.planes is None else {"public_steps": self.planes.steps,
                                                   "public_magnitude_bits": self.planes.magnitude_bits})}

    @classmethod
    def from_metadata(cls, meta: Mapping, words: Mapping[str, np.ndarray], task: np.ndarray,
                      planes: np.ndarray | None = None, values: np.ndarray | None = None) -> PendingRound:
        """The round ``metadata`` describes; ``values``: the sketches of its ``"values"`` scorers, stacked in order."""
        try:
            public = None if planes is None else PublicPlanes(np.asarray(planes, dtype=np.int32),
                                                              int(meta["public_steps"]),
                                                              int(meta["public_magnitude_bits"]))
            return cls(int(meta["round"]), int(meta["seed"]), tuple((str(n), tuple(map(int, s))) for n, s in meta["shapes"]),
                       dict(words), np.asarray(task, dtype=np.int32), tuple((str(a), str(b)) for a, b in meta["pairs"]),
                       tuple(map(str, meta["waiting"])), str(meta["penalty"]), float(meta["bonus_fraction"]),
                       str(meta["duplicates"]), DuplicateRule(**meta["duplicate_rule"]),
                       {str(k): str(v) for k, v in meta.get("owners", {}).items()}, public,
                       {str(c): np.asarray(v, dtype=np.float64)
                        for c, v in zip(meta.get("values", []), [] if values is None else values, strict=True)})
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


def score_pending(pool: PeerPool, pending: PendingRound, horizon: int) -> PooledRound:
    """The pending round scored on the pool as it stands at ``horizon``, both sides of it."""
    return score_with_pool(pending.packer(), pool, pending.round, pairs=pending.pairs, seed=pending.seed,
                           penalty=pending.penalty, bonus_fraction=pending.bonus_fraction,
                           duplicates=pending.duplicates, duplicate_rule=pending.duplicate_rule,
                           copy_candidates=sorted(c for c in pending.words if c not in pending.owners),
                           owners=pending.owners, horizon=horizon, public=pending.planes, values=pending.values)


def due_settlements(pool: PeerPool, horizon: int, closes_run: bool = False) -> list[Settlement]:
    """What the pool at ``horizon`` (its round just added) can settle: see the module docstring; where ``horizon`` is
    the run's last round (``closes_run``), every waiting participant it determines, of that round too. Changes nothing
    (``fl.pool_close.close_round`` applies them: ``apply_settlements``)."""
    out: list[Settlement] = []
    for t in sorted(pool.pending):
        if t > horizon or t == horizon and not closes_run:
            continue
        pending = pool.pending[t]
        pooled = score_pending(pool, pending, horizon)
        report = pooled.report
        out += [Settlement(t, horizon, c, float(report.rewards[c]), float(report.unadjusted_rewards[c]),
                           tuple(report.peers[c])) for c in settles(pool, pending, pooled, horizon, closes_run)]
    return out


def settles(pool: PeerPool, pending: PendingRound, pooled: PooledRound, horizon: int,
            closes_run: bool = False) -> list[str]:
    """The waiting participants ``pooled`` (the pending round scored at ``horizon``) settles: determined, and the pool
    no longer warming up for them or the last chance (the window's, or the run's: ``closes_run``)."""
    last = closes_run or horizon - pending.round >= pool.settings.window
    return [c for c in pending.waiting if c not in pooled.unpaid and (last or c not in pooled.warming)]


def apply_settlements(pool: PeerPool, horizon: int, settlements: Sequence[Settlement],
                      closes_run: bool = False) -> None:
    """What settling does to the pool at ``horizon``: settled participants stop waiting, a pending round the window no
    longer covers (or with nobody left waiting, or any at the run's last round: ``closes_run``) is dropped, settled
    entries are vetted by their settled scores."""
    done = {(s.round, s.participant) for s in settlements}
    for t in sorted(pool.pending):
        if t >= horizon and not closes_run:
            continue
        pending = pool.pending[t]
        waiting = tuple(c for c in pending.waiting if (t, c) not in done)
        if waiting and horizon - t < pool.settings.window and not closes_run:
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
        if pending.values:
            arrays[f"pending.{k}.@values"] = np.stack([pending.values[c] for c in sorted(pending.values)])
        records.append(pending.metadata())
    return arrays, json.dumps(records)


def pending_from_arrays(arrays: Mapping[str, np.ndarray], records: str) -> dict[int, PendingRound]:
    out = {}
    for k, meta in enumerate(json.loads(records)):
        words = {c: np.asarray(arrays[f"pending.{k}.{c}"], dtype=np.int32) for c in meta["clients"]}
        pending = PendingRound.from_metadata(meta, words, arrays[f"pending.{k}.task"], arrays.get(f"pending.{k}.@public"),
                                             arrays.get(f"pending.{k}.@values"))
        Layout.from_shapes(dict(pending.shapes))  # a misshapen record fails here, not at settling time
        out[pending.round] = pending
    return out
