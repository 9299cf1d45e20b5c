"""A round of ``KFCAStrategy`` between the replies and the ledger: the packed updates scored (peer pool, trusted
reference), their sign words hashed (and kept) for the ledger, the round's train metrics; and what a resumed run
reads back from the ledger (the peer pool, the global arrays the last round produced, stored as safetensors bytes,
no pickle).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from logging import INFO, WARNING
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, MetricRecord
from flwr.common import log

from ..engine.duplicates import DuplicateRule
from ..engine.public import OFF, PublicConditioning, receptions_kept
from ..errors import InputError
from ..fl.peer_pool import PeerPool, PooledRound, PoolSettings, score_with_pool
from ..fl.pool_store import VERDICT_GATE
from ..fl.pool_close import ClosingRound, close_round
from ..fl.pool_settle import Settlement
from ..fl.pool_values import sketches_bytes
from ..packer import SignPacker
from ..report import RewardReport
from ..tensors import is_float
from .ledger import global_path, read_ledger, signs_path
from .ledger_rows import sha256_hex
from .pool_replay import PoolTracker
from .recompute import words_bytes

REWARD_METRIC_PREFIX = "kfca.reward."


@dataclass
class ScoredRound:
    pooled: PooledRound
    digests: dict[str, str]
    """Participant -> SHA-256 of its packed sign words (the ledger's ``sign_sha256``)."""
    layout: list[tuple[str, tuple[int, ...]]]
    task_sha256: str
    signs: dict[str, bytes]
    """The words to keep beside the ledger, by SHA-256 (empty: not kept)."""
    reference_sha256: str | None = None
    """SHA-256 of the reference's sign words the round was scored against (None: none); kept in ``signs``."""
    settlements: list[Settlement] = field(default_factory=list)
    """Participants of earlier undetermined rounds this round's pool settled (``fl.pool_settle``)."""
    public: tuple[str, int, tuple[int, ...]] | None = None
    """(SHA-256, sign planes, their spans) of the public strata's planes the round was scored within (kept in
    ``signs``); None: none."""
    values_sha256: str | None = None
    """SHA-256 of the participants' value sketches (``fl.pool_values.sketches_bytes``; kept in ``signs``); None: none
    given."""

    @property
    def report(self) -> RewardReport:
        return self.pooled.report


def round_metrics(metrics: MetricRecord | None, scored: ScoredRound | None,
                  failures: list[tuple[str | None, str]]) -> MetricRecord:
    """The round's aggregated train metrics (the wrapped strategy's, if any) with KFCA's: scored, undetermined,
    pool peers, failed replies, copies (own resubmissions among them), settlements, the sum charged back for
    resubmitted updates, the sum forfeited by participants that turned (pool rule 8), and ``kfca.reward.<participant>``
    per paid participant."""
    report = None if scored is None else scored.report
    out = MetricRecord(dict(metrics.items())) if metrics is not None else MetricRecord()
    out["kfca.scored"] = int(report is not None)
    out["kfca.undetermined"] = 0 if scored is None else len(scored.pooled.undetermined)
    out["kfca.pool-peers"] = 0 if scored is None else sum(map(len, scored.pooled.pool_peers.values()))
    out["kfca.failed-replies"] = sum(node is not None for node, _ in failures)
    out["kfca.copies"] = 0 if report is None else sum(len(g.clients) for g in report.duplicates)
    out["kfca.own-resubmissions"] = 0 if scored is None else len(scored.pooled.own_resubmissions)
    out["kfca.settled"] = 0 if scored is None else len(scored.settlements)
    out["kfca.charged-back"] = 0.0 if scored is None else float(sum(scored.pooled.charged_back.values()))
    out["kfca.forfeited"] = 0.0 if scored is None else float(sum(scored.pooled.forfeit.values()))
    if report is not None:
        for node, reward in report.rewards.items():
            out[REWARD_METRIC_PREFIX + node] = float(reward)
    return out


class PublicTrajectory:
    """The globals the server sent (float arrays only): the newest ``history + 1``, whose consecutive differences are
    the steps the strata read; a global whose float tensors differ in names or shapes from the one before starts
    them again. And which node was sent which global: a node's *reception gap* is how many steps the global took
    between the global it was sent before and this round's (what a free rider replays;
    ``engine.public.public_spans``). The global a node was last sent stays kept after it leaves the newest ones, until
    the node is sent another (the newest ``history`` such globals; an older one is dropped and its nodes' gaps are
    clipped to the steps): a gap longer than the steps is then the change since that global (``changes``). Host
    memory: at most ``2 * history + 1`` copies of the adapter's float tensors."""

    def __init__(self, conditioning: PublicConditioning):
        self.conditioning = conditioning
        self._globals: dict[int, dict[str, np.ndarray]] = {}
        """Sent count -> the global sent then: the newest ``history + 1`` and those nodes were last sent."""
        self._sent = 0
        """How many globals were sent (this one included); the steps start again at ``_start``."""
        self._start = 0
        self._received: dict[int, int] = {}
        """Node -> the global (``_sent`` count) it was last sent."""
        self._before: dict[int, int] = {}
        """Node -> the global it was sent before this round's (this round's nodes sent one since ``_start``)."""

    def sent(self, arrays: ArrayRecord, nodes: Iterable[int] = ()) -> None:
        """Remember the global of a round (``configure_train``'s arrays) and the nodes it was sent to."""
        if not self.conditioning.enabled:
            return
        floats = {name: array.numpy() for name, array in arrays.items()}
        floats = {name: np.array(a, copy=True) for name, a in floats.items() if is_float(a)}
        self._sent += 1
        last = self._globals.get(self._sent - 1)
        if last is None or _shapes(last) != _shapes(floats):
            self._globals, self._received = {}, {}
            self._start = self._sent
        self._globals[self._sent] = floats
        self._before = {}
        for node in nodes:
            if node in self._received:
                self._before[node] = self._received[node]
            self._received[node] = self._sent
        newest = self._sent - self.conditioning.history
        kept = receptions_kept([*self._received.values(), *self._before.values()], newest, self.conditioning.history)
        self._globals = {i: g for i, g in self._globals.items() if i >= newest or i in kept}

    def steps(self, shapes: Mapping[str, tuple[int, ...]]) -> list[Mapping[str, np.ndarray]]:
        """The global's steps (oldest first, each computed when read) over the scored tensors ``shapes``; none where
        the globals sent are not of that layout (a wrapped strategy that sends other arrays than the global it was
        given)."""
        last = self._globals.get(self._sent)
        if last is None or _shapes(last) != dict(shapes):
            return []
        first = max(self._start, self._sent - self.conditioning.history)
        return [_Change(self._globals[i + 1], self._globals[i]) for i in range(first, self._sent)]

    def gaps(self, nodes: Iterable[int]) -> list[int]:
        """The reception gaps of ``nodes`` in this round (sorted; a node first sent a global now has none)."""
        return sorted(self._sent - self._before[node] for node in nodes if node in self._before)

    def changes(self, nodes: Iterable[int]) -> dict[int, Mapping[str, np.ndarray]]:
        """Gap -> the global's change over it, for the gaps of ``nodes`` longer than the steps whose earlier global
        is kept (``engine.public.public_planes``' ``changes``)."""
        newest, out = self._sent - self.conditioning.history, {}
        for node in nodes:
            before = self._before.get(node)
            if before is not None and before < newest and before in self._globals:
                out[self._sent - before] = _Change(self._globals[self._sent], self._globals[before])
        return out


class _Change(Mapping):
    """``new - old`` by tensor name (in the arrays' dtype: its sign is the exact difference's), computed on each
    read: the steps are read once to check them and once to pack the planes, never all held at once."""

    def __init__(self, new: Mapping[str, np.ndarray], old: Mapping[str, np.ndarray]):
        self._new, self._old = new, old

    def __getitem__(self, name: str) -> np.ndarray:
        return self._new[name] - self._old[name]

    def __iter__(self):
        return iter(self._new)

    def __len__(self) -> int:
        return len(self._new)


def _shapes(arrays: Mapping[str, np.ndarray]) -> dict[str, tuple[int, ...]]:
    return {name: tuple(a.shape) for name, a in arrays.items()}


def score_round(packer: SignPacker, pool: PeerPool, server_round: int, *, peers: int | None, seed: int,
                penalty: str, bonus_fraction: float, duplicates: str, duplicate_rule: DuplicateRule,
                reference: np.ndarray | None, reference_weight: float, keep_signs: bool,
                public: list[Mapping[str, np.ndarray]] = (), conditioning: PublicConditioning = OFF,
                gaps: list[int] = (), changes: Mapping[int, Mapping[str, np.ndarray]] | None = None,
                values: Mapping[str, np.ndarray] | None = None, closes_run: bool = False) -> ScoredRound:
    """Score the packed round against its peers and ``pool`` (then add its participants, copies left out, to the
    pool); ``reference``: the server's packed signs, or None; ``public``: the global's recent steps (oldest first),
    the strata every pair is scored within under ``conditioning`` (``engine.public``), with ``gaps`` the
    participants' reception gaps (``PublicTrajectory.gaps``) and the global's change over the longer ones
    (``PublicTrajectory.changes``); ``values``: each participant's value sketch
    (``fl.pool_values``: what tells its own replay from a retrain), kept beside the signs for a verifier;
    ``closes_run``: the run's last round (every participant still waiting that the pool determines is settled)."""
    planes = packer.public_planes(list(public), conditioning, gaps, changes) if public else None
    pooled = score_with_pool(packer, pool, server_round, peers=peers, seed=seed, penalty=penalty,
                             bonus_fraction=bonus_fraction, duplicates=duplicates, duplicate_rule=duplicate_rule,
                             reference=reference, reference_weight=reference_weight, public=planes, values=values)
    signs, task = packer.words()
    settlements = close_round(pool, ClosingRound.scored(
        packer, server_round, pooled, words=(signs, task), participants=packer.clients, seed=seed, penalty=penalty,
        bonus_fraction=bonus_fraction, duplicates=duplicates, duplicate_rule=duplicate_rule, values=values,
        closes_run=closes_run))
    for settled in settlements:
        log(INFO, "KFCA: round %s settles %s's undetermined round %s: paid %+.4f (%s)", server_round,
            settled.participant, settled.round, settled.reward,
            "the run's last round: what its pool tells now" if closes_run
            else "the pool on both sides of it tells who deviated now")
    if pooled.undetermined:
        log(WARNING, "KFCA: round %s is undetermined for %s: fewer than min_peers=%s distinct peers (in this "
            "round and the pool of the last %s rounds), so a deviator among them cannot be outvoted, or the pool's "
            "verdict alone stands behind the reward and is within %s standard errors of 0: their rewards cannot tell "
            "who deviated yet: not paid now, settled by a later round once the pool on both sides of it can tell "
            "(within the window). Raise the clients per round (fraction_train / min_train_nodes), lower min_peers, or "
            "widen pool_window", server_round, ", ".join(pooled.undetermined), pool.settings.min_peers,
            pool.settings.window, VERDICT_GATE)
    for who in pooled.own_resubmissions:
        if who in pooled.resubmitted:
            charged = pooled.charged_back[who]
            log(WARNING, "KFCA: round %s: %s resubmitted an earlier update of their own (%s): a copy, scored on this "
                "round's peers without the pool and paid at most 0 (%+.4f); %s", server_round, who,
                ", ".join(pooled.resubmitted[who]), pooled.report.rewards[who] + charged,
                f"charged back {charged:.4f}, what that update was paid" if charged else
                "nothing to charge back (charged already, or not paid)")
        else:
            log(WARNING, "KFCA: round %s: %s resubmitted an earlier update of their own (own resubmission: scored "
                "without the pool, on this round's peers, the pool's term counted as 0%s)", server_round, who,
                "; undetermined: no lag the pool can weigh yet, so not paid" if who in pooled.undetermined else "")
    for who, names in pooled.forfeited.items():
        log(WARNING, "KFCA: round %s: %s's update turned against its own earlier ones (it reverses %s, which its rounds "
            "judged honest): paid at most 0 (%+.4f); forfeited %.4f, what %s had been paid (pool rule 8)", server_round,
            who, names[0], pooled.report.rewards[who] + pooled.forfeit[who], pooled.forfeit[who], ", ".join(names))
    stored = {participant: words_bytes(signs[k]) for k, participant in enumerate(packer.clients)}
    digests = {participant: sha256_hex(data) for participant, data in stored.items()}
    task_bytes = words_bytes(task)
    task_sha = sha256_hex(task_bytes)
    kept = {**{digests[p]: data for p, data in stored.items()}, task_sha: task_bytes} if keep_signs else {}
    # The reference's words too (never paid): a verifier scores the round against them again.
    reference_sha = None
    if reference is not None and reference_weight > 0:
        reference_bytes = words_bytes(reference)
        reference_sha = sha256_hex(reference_bytes)
        if keep_signs:
            kept[reference_sha] = reference_bytes
    public_record = None
    if planes is not None:  # a verifier scores the round within the same strata again
        planes_bytes = words_bytes(planes.host_words())
        public_record = (sha256_hex(planes_bytes), planes.steps, planes.spans)
        if keep_signs:
            kept[public_record[0]] = planes_bytes
    values_sha = None
    if values:  # a verifier judges the round's own replays on the same values
        sketches = sketches_bytes(values)
        values_sha = sha256_hex(sketches)
        if keep_signs:
            kept[values_sha] = sketches
    layout = [(slot.name, slot.shape) for slot in packer.layout.slots]
    return ScoredRound(pooled, digests, layout, task_sha, kept, reference_sha, settlements, public_record, values_sha)


def resumed_pool(ledger: str | os.PathLike, settings: Mapping[str, Any], run_id: str, round_offset: int,
                 pool_settings: PoolSettings) -> PeerPool:
    """The pool the interrupted run had (its undetermined rounds still waiting included), from the ledger's kept signs
    (an empty one, with a warning, when the signs were not kept: the next rounds then borrow fewer peers, and settle
    nothing of the rounds before the resume)."""
    tracker = PoolTracker.of(read_ledger(ledger), run_id)

    def read(sha: str, rows: int = 1, size: int | None = None) -> np.ndarray:  # any size: words, planes, values alike
        path = signs_path(ledger, sha)
        data = path.read_bytes() if path.is_file() else b""
        if sha256_hex(data) != sha:
            raise InputError(f"the kept signs {path} are missing or altered")
        return np.frombuffer(data, dtype="<i4")

    try:
        return tracker.rebuilt(run_id, settings, round_offset, read)
    except ValueError as exc:  # InputError among them
        log(WARNING, "KFCA: the peer pool restarts empty after the resume (%s)", exc)
        return PeerPool(pool_settings)


def arrays_to_bytes(arrays: ArrayRecord) -> bytes:
    """An ArrayRecord as safetensors bytes (names in order in the metadata); no pickle."""
    from safetensors.numpy import save

    tensors = {name: np.ascontiguousarray(array.numpy()) for name, array in arrays.items()}
    return save(tensors, metadata={"order": json.dumps(list(tensors))})


def arrays_from_bytes(data: bytes) -> ArrayRecord:
    """The ArrayRecord ``arrays_to_bytes`` wrote, in its original order."""
    from safetensors.numpy import load

    header = json.loads(data[8:8 + int.from_bytes(data[:8], "little")])
    tensors = load(data)
    order = json.loads(header.get("__metadata__", {}).get("order", "[]")) or sorted(tensors)
    return ArrayRecord({name: Array(tensors[name]) for name in order})


def stored_global_arrays(ledger: str | os.PathLike, sha: str) -> ArrayRecord:
    """The global arrays stored beside the ledger under ``sha``; InputError when missing or altered."""
    path = global_path(ledger, sha)
    data = path.read_bytes() if path.is_file() else b""
    if sha256_hex(data) != sha:
        raise InputError(f"cannot resume: the arrays of the last committed round ({path}) are missing or altered")
    return arrays_from_bytes(data)
