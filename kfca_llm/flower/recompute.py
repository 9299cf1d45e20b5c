"""Recomputing a ledger round: the scoring settings a round records, and its rewards scored again from the
packed sign words it kept (``audit.verify_ledger`` runs it on every round).

Stored hashes name files: only names of 64 hex digits are opened, only regular files inside
``<ledger>.d/signs/`` (no link followed, no FIFO opened), only after their size matches the layout.

Sign words are turned back into updates that pack to the same words (-1 where the sign bit is set, +1 on
the other tasks, 0 off the task mask); the repacked words must hash to the stored names, so a change of the
packing convention shows as ``unverifiable``, never as a false match.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import re
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..engine.duplicates import DuplicateRule
from ..engine.layout import Layout
from ..errors import InputError
from ..report import printable
from .ledger import store_dir
from .ledger_rows import SCORED, RewardRow, RoundRow, SettlementRow, sha256_hex

MATCH, MISMATCH, UNVERIFIABLE, DAMAGED = "match", "mismatch", "unverifiable", "damaged"
STATUSES = (MATCH, MISMATCH, UNVERIFIABLE, DAMAGED)
_SHA256 = re.compile(r"[0-9a-f]{64}")


def scoring_settings(*, peers: int | None, penalty: str, bonus_fraction: float, duplicates: str,
                     duplicate_rule: DuplicateRule, aggregation: str, seed: int, identity: str,
                     pool: Mapping[str, Any] | None = None, reference_weight: float | None = None,
                     weak_verdict: str | None = None, public=None) -> dict[str, Any]:
    """What decides a round's payments, as the ledger records it per run and per round (JSON); ``pool``: the
    peer pool's settings (``PoolSettings.to_dict``), left out where there is none; ``reference_weight``: the
    trusted reference's weight (``fl.reference``), left out where there is no reference; ``weak_verdict``: the
    aggregation's weak-verdict rule (``fl.aggregate``), left out where the aggregation takes every reply; ``public``:
    the ``PublicConditioning`` of the public strata, left out where there is none."""
    out = {"peers": peers, "penalty": penalty, "bonus_fraction": float(bonus_fraction), "duplicates": duplicates,
           "duplicate_rule": dataclasses.asdict(duplicate_rule), "aggregation": aggregation, "seed": int(seed),
           "identity": identity}
    if pool is not None:
        out["pool"] = dict(pool)
    if reference_weight is not None:
        out["reference_weight"] = float(reference_weight)
    if weak_verdict is not None:
        out["weak_verdict"] = weak_verdict
    if public is not None:
        out["public"] = {"steps": int(public.steps), "magnitude_buckets": int(public.magnitude_buckets)}
    return out


def words_bytes(words: np.ndarray) -> bytes:
    """The stored form of packed words: little-endian int32 (what ``sign_sha256`` hashes)."""
    return np.ascontiguousarray(words, dtype="<i4").tobytes()


@dataclass(frozen=True)
class RoundCheck:
    run_id: str
    round: int
    status: str
    """``match``, ``mismatch``, ``unverifiable`` or ``damaged`` (recomputation); chain problems are listed
    separately."""
    detail: str = ""
    rows: tuple[str, ...] = ()
    """The mismatching rows, one line each."""


def recompute_round(ledger: str | os.PathLike, round_row: RoundRow, rows: Sequence[RewardRow],
                    backend: str = "auto", pools: PoolTracker | None = None) -> RoundCheck:
    """Score one round again from its stored signs and compare it with its rows; ``pools`` rebuilds the peer
    pool of rounds recorded with pool settings (None: such a round is unverifiable)."""
    check = RoundCheck(round_row.run_id, round_row.round, UNVERIFIABLE)
    if round_row.status != SCORED:
        return dataclasses.replace(check, detail="not scored (nothing paid)")
    if not round_row.signs_kept:
        return dataclasses.replace(check, detail="signs not kept (keep_signs=False)")
    try:
        if round_row.layout is None:
            raise _Damaged("no tensor layout recorded")
        try:
            n_bytes = 4 * Layout.from_shapes(dict(round_row.layout)).n_words
        except InputError as exc:
            raise _Damaged(f"the recorded tensor layout is not one any update has ({exc})") from None
        if len(rows) < 2:
            raise _Damaged(f"a scored round with {len(rows)} reward row(s); KFCA scores two or more")
        words = {row.participant: _read_words(ledger, row.sign_sha256, n_bytes) for row in rows}
        task = _read_words(ledger, round_row.task_sha256, n_bytes)
        reference = None
        if round_row.settings.get("reference_weight"):
            if round_row.reference_sha256 is None:
                raise _Unverifiable("a round scored against the server's reference, recorded without its signs")
            reference = _read_words(ledger, round_row.reference_sha256, n_bytes)
        if "pool" in round_row.settings and pools is None:
            raise _Unverifiable("a round scored with a peer pool needs the earlier rounds to rebuild it")
        def read(sha: str, rows: int = 1) -> np.ndarray:
            return _read_words(ledger, sha, rows * n_bytes)

        planes = recorded_planes(round_row, read)
        pool = None if pools is None else pools.before(round_row, read)
        try:
            report = _rescore(round_row, words, task, backend, pool, reference, planes)
        except (InputError, ValueError, TypeError, KeyError) as exc:  # hostile settings the chain still covers
            raise _Unverifiable(f"this version cannot score the round with its recorded settings "
                                f"({printable(str(exc))[:160]})") from None
        settled = [] if pools is None else pools.check_settlements(round_row, read)
    except _Damaged as exc:
        return dataclasses.replace(check, status=DAMAGED, detail=str(exc))
    except _Unverifiable as exc:
        return dataclasses.replace(check, detail=str(exc))
    mismatched = _compare(report, rows) + settled
    if mismatched:
        return dataclasses.replace(check, status=MISMATCH, detail=f"{len(mismatched)} row(s) differ",
                                   rows=tuple(mismatched))
    done = pools.settled_in(round_row) if pools is not None else 0
    return dataclasses.replace(check, status=MATCH, detail=f"{len(rows)} rewards recomputed"
                               + (f", {done} settlement(s) of earlier rounds" if done else ""))


class _Unverifiable(Exception):
    pass


class _Damaged(Exception):
    """The round says its signs were kept, and what the store holds cannot be them."""


def _real_folder(path: Path) -> None:
    try:
        info = os.lstat(path)
    except OSError:
        raise _Damaged(f"the store folder {path.name}/ is missing") from None
    if not stat.S_ISDIR(info.st_mode):
        raise _Damaged(f"the store folder {path.name}/ is not a directory (a link is not followed)")


def _read_words(ledger, sha: str | None, n_bytes: int) -> np.ndarray:
    """The words stored under ``sha``: a regular file of ``n_bytes`` inside ``<ledger>.d/signs/``, hashing to ``sha``."""
    if not isinstance(sha, str) or not _SHA256.fullmatch(sha):
        raise _Damaged(f"stored signs named {printable(str(sha))[:80]!r}, not a SHA-256 (64 hex digits); not opened")
    folder = store_dir(ledger) / "signs"
    _real_folder(folder.parent)
    _real_folder(folder)
    try:  # no link followed, a FIFO opened without waiting for a writer; fstat decides on the open file
        fd = os.open(folder / sha, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        why = "a link (not followed)" if exc.errno == errno.ELOOP else "missing"
        raise _Damaged(f"stored signs {sha[:16]}... {why}") from None
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise _Damaged(f"stored signs {sha[:16]}... are not a regular file; not read")
        if info.st_size != n_bytes:
            raise _Damaged(f"stored signs {sha[:16]}... hold {info.st_size} bytes, the round's layout "
                           f"implies {n_bytes}")
        data = handle.read(n_bytes)
    if sha256_hex(data) != sha:
        raise _Damaged(f"stored signs {sha[:16]}... do not hash to their name (file altered)")
    return np.frombuffer(data, dtype="<i4")


def updates_from_words(layout: Sequence[tuple[str, tuple[int, ...]]], words: np.ndarray, task: np.ndarray,
                       packer) -> dict[str, np.ndarray]:
    """Float arrays that pack to ``words`` under ``task`` (-1: sign bit set, +1: other tasks, 0: no task)."""
    shapes = dict(layout)
    out = {}
    for slot in packer.layout.slots:
        span = slice(slot.word_offset, slot.word_offset + slot.n_words)
        negative = np.unpackbits(words[span].view(np.uint8), bitorder="little")[:slot.numel].astype(bool)
        nonzero = np.unpackbits(task[span].view(np.uint8), bitorder="little")[:slot.numel].astype(bool)
        values = np.where(negative, -1.0, np.where(nonzero, 1.0, 0.0)).astype(np.float32)
        out[slot.name] = values.reshape(shapes[slot.name])
    return out


def recorded_planes(round_row: RoundRow, read_words) -> Any:
    """The public strata's planes (``engine.public.PublicPlanes``) a round was scored within, read from the store by
    ``read_words(sha, rows)`` (None: unconditioned); ``_Damaged`` / ``_Unverifiable`` when they cannot be."""
    from ..engine.public import PublicConditioning, PublicPlanes

    if round_row.public_sha256 is None:
        if round_row.public_steps is not None:
            raise _Damaged("the round records public steps without their planes")
        return None
    try:
        recorded = round_row.settings["public"]
        conditioning = PublicConditioning(int(recorded["steps"]), int(recorded["magnitude_buckets"]))
    except (KeyError, TypeError, ValueError) as exc:  # InputError among them
        raise _Unverifiable(f"the round's public strata were recorded without settings this version reads ({exc})"
                            ) from None
    steps = round_row.public_steps
    if steps is None or not 1 <= steps <= conditioning.steps:
        raise _Damaged(f"the round records {steps!r} public steps; its settings allow 1 to {conditioning.steps}")
    n_planes = steps + conditioning.magnitude_bits
    words = np.ascontiguousarray(read_words(round_row.public_sha256, n_planes), dtype=np.int32)
    return PublicPlanes(words.reshape(n_planes, -1), steps, conditioning.magnitude_bits)


def pending_from_rows(round_row: RoundRow, rows: Sequence[RewardRow], read_words) -> Any:
    """The ``fl.pool_settle.PendingRound`` a live run kept after ``round_row`` (undetermined participants waiting), from
    its rows and kept words (None: nobody waited)."""
    from ..fl.pool_settle import PendingRound

    settings = round_row.settings
    if round_row.status != SCORED or not round_row.undetermined or round_row.layout is None:
        return None
    words = {r.participant: np.ascontiguousarray(read_words(r.sign_sha256), dtype=np.int32)
             for r in sorted(rows, key=lambda r: r.participant)}
    pairs = tuple((r.participant, p) for r in sorted(rows, key=lambda r: r.participant) for p in r.peers if p in words)
    return PendingRound(round_row.round, round_row.seed, tuple(round_row.layout), words,
                        np.ascontiguousarray(read_words(round_row.task_sha256), dtype=np.int32), pairs,
                        tuple(round_row.undetermined), settings["penalty"], float(settings["bonus_fraction"]),
                        settings["duplicates"], DuplicateRule(**settings["duplicate_rule"]),
                        planes=recorded_planes(round_row, read_words))


def _settlement(row: SettlementRow):
    from ..fl.pool_settle import Settlement

    return Settlement(row.round, row.settled_in, row.participant, row.reward, row.unadjusted_reward, tuple(row.peers))


class PoolTracker:
    """Each run's peer pool as ``verify_ledger`` walks the rounds in commit order, and as a resumed ``KFCAStrategy``
    rebuilds it: built once, round by round, from the rounds' kept signs (as the live run built it: each round added,
    its undetermined participants kept pending, the settlements it recorded applied), so a run of T rounds reads each
    file once."""

    def __init__(self, by_round: Mapping[tuple[str, int], Sequence[RewardRow]],
                 rounds: Mapping[tuple[str, int], RoundRow] | None = None,
                 settlements: Mapping[tuple[str, int], Sequence[SettlementRow]] | None = None):
        self._by_round = by_round
        self._rounds = rounds or {}
        self._settled = settlements or {}
        self._pools: dict[str, tuple[Any, int]] = {}
        self._broken: dict[str, str] = {}

    @classmethod
    def of(cls, contents, run: str | None = None) -> PoolTracker:
        """The tracker of a ledger's rows (``read_ledger``'s ``LedgerContents``), of one run's alone when ``run`` is
        given."""
        def mine(row) -> bool:
            return run is None or row.run_id == run

        by_round: dict[tuple[str, int], list[RewardRow]] = {}
        for row in filter(mine, contents.rewards):
            by_round.setdefault((row.run_id, row.round), []).append(row)
        settled: dict[tuple[str, int], list[SettlementRow]] = {}
        for row in filter(mine, contents.settlements):
            settled.setdefault((row.run_id, row.settled_in), []).append(row)
        return cls(by_round, {(r.run_id, r.round): r for r in filter(mine, contents.rounds)}, settled)

    def rows(self, round_row: RoundRow) -> Sequence[RewardRow]:
        """The reward rows of ``round_row``'s round."""
        return self._by_round.get((round_row.run_id, round_row.round), [])

    def before(self, round_row: RoundRow, read_words) -> Any:
        """The pool ``round_row``'s run had before it (None: scored without one); ``_Unverifiable`` when an earlier
        round's signs cannot be read."""
        if "pool" not in round_row.settings:
            return None
        return self._advance(round_row.run_id, round_row.settings, round_row.round - 1, read_words)[0]

    def rebuilt(self, run: str, settings: Mapping[str, Any], last_round: int, read_words) -> Any:
        """The pool a run recorded with ``settings`` had after ``last_round`` (a resumed ``KFCAStrategy`` goes on with
        it); ``InputError`` when it cannot be rebuilt."""
        from ..fl.peer_pool import PeerPool, recorded_pool_settings

        if last_round < 1:
            return PeerPool(recorded_pool_settings(settings["pool"]))
        try:
            return self._advance(run, settings, last_round, read_words)[0]
        except _Unverifiable as exc:
            raise InputError(str(exc)) from None

    def settled_in(self, round_row: RoundRow) -> int:
        return len(self._settled.get((round_row.run_id, round_row.round), []))

    def check_settlements(self, round_row: RoundRow, read_words) -> list[str]:
        """The settlements ``round_row`` recorded, each scored again on the pool as it stood after the round was added
        (before any of them applied): one line per row that differs."""
        rows = self._settled.get((round_row.run_id, round_row.round), [])
        if not rows:
            return []
        if "pool" not in round_row.settings:
            return [f"{len(rows)} settlement(s) in a round scored without a peer pool"]
        self.before(round_row, read_words)
        return self._advance(round_row.run_id, round_row.settings, round_row.round, read_words, check=rows)[1]

    def _advance(self, run: str, settings: Mapping[str, Any], upto: int, read_words,
                 check: Sequence[SettlementRow] = ()) -> tuple[Any, list[str]]:
        """(the run's pool after round ``upto``, the mismatches of ``check``: round ``upto``'s settlements scored again
        on the pool as it stood after that round was added, before they applied)."""
        from ..fl.peer_pool import PeerPool, recorded_pool_settings, resubmitted_entries
        from ..fl.pool_settle import apply_settlements

        if run in self._broken:
            raise _Unverifiable(self._broken[run])
        try:
            pool, done = self._pools.get(run) or (PeerPool(recorded_pool_settings(settings["pool"])), 1)
        except (TypeError, AttributeError, InputError) as exc:
            raise _Unverifiable(f"this version cannot rebuild the round's peer pool ({exc})") from None
        if check and done > upto:
            raise _Unverifiable(f"round {upto}'s settlements were applied before the round was checked (its row comes "
                                "after a later round's: rows reordered)")
        mismatches: list[str] = []
        try:
            for t in range(done, upto + 1):
                rows = self._by_round.get((run, t), [])
                joined = [r for r in rows if r.duplicate_group is None]
                pool.add_round(t, {r.participant: read_words(r.sign_sha256) for r in joined},
                               {r.participant: r.unadjusted_reward for r in joined}, {r.participant: r.reward for r in joined})
                round_row = self._rounds.get((run, t))
                if round_row is not None and round_row.settings.get("duplicates") != "flag":
                    pool.mark_resubmitted([name for r in rows for name in resubmitted_entries(r.participant, r.duplicate_group)])
                pending = None if round_row is None or not pool.settings.enabled else pending_from_rows(
                    round_row, rows, read_words)
                if pending is not None:
                    pool.pending[t] = pending
                recorded = self._settled.get((run, t), [])
                if check and t == upto:
                    mismatches = _settlement_mismatches(pool, t, check)
                apply_settlements(pool, t, [_settlement(r) for r in recorded])
        except (_Damaged, _Unverifiable, InputError, KeyError, TypeError, ValueError) as exc:
            self._broken[run] = f"its peer pool cannot be rebuilt: an earlier round's signs or records ({exc})"
            raise _Unverifiable(self._broken[run]) from None
        self._pools[run] = (pool, max(done, upto + 1))
        return pool, mismatches


def _settlement_mismatches(pool, horizon: int, rows: Sequence[SettlementRow]) -> list[str]:
    from ..fl.pool_settle import score_pending, settles

    out = []
    for row in rows:
        pending = pool.pending.get(row.round)
        if pending is None or row.participant not in pending.waiting:
            out.append(f"{row.participant}: settlement of round {row.round} at round {horizon}, which was not waiting "
                       f"to be settled then")
            continue
        pooled = score_pending(pool, pending, horizon)
        if row.participant not in settles(pool, pending, pooled, horizon):
            out.append(f"{row.participant}: round {row.round} settled at round {horizon}, where the pool could not "
                       f"settle it yet")
            continue
        report = pooled.report
        expected = (report.rewards[row.participant], report.unadjusted_rewards[row.participant],
                    tuple(report.peers[row.participant]))
        stored = (row.reward, row.unadjusted_reward, tuple(row.peers))
        if expected != stored:
            names = ("reward", "unadjusted_reward", "peers")
            out.append(f"{row.participant} (round {row.round}, settled): " + ", ".join(
                f"{n} {s!r} (recomputed {e!r})" for n, s, e in zip(names, stored, expected) if s != e))
    return out


def _rescore(round_row: RoundRow, words: Mapping[str, np.ndarray], task: np.ndarray, backend: str, pool=None,
             reference: np.ndarray | None = None, planes=None):
    from ..fl.peer_pool import POOL_RULE, score_with_pool
    from ..packer import SignPacker

    settings = round_row.settings
    try:
        # A rule recorded without one of today's fields was applied by a version whose copy rule differed (before
        # copy_fit_sigma the copy fit was taken 3 standard errors up): today's defaults would not reproduce it.
        missing = sorted({f.name for f in dataclasses.fields(DuplicateRule)} - set(settings["duplicate_rule"]))
        if missing:
            raise _Unverifiable(f"the round's duplicate rule was recorded by a version without {', '.join(missing)}; "
                                f"this version's copy rule differs from the one applied then")
        rule = DuplicateRule(**settings["duplicate_rule"])
        penalty, bonus_fraction, policy = settings["penalty"], settings["bonus_fraction"], settings["duplicates"]
        peers = settings["peers"]
    except (KeyError, TypeError, InputError) as exc:
        raise _Unverifiable(f"this version cannot apply the round's scoring settings ({exc})") from None
    packer = SignPacker(dict(round_row.layout), list(words), backend=backend)
    for participant, row_words in words.items():
        packer.add_many(participant, updates_from_words(round_row.layout, row_words, task, packer))
    signs, repacked_task = packer.words()
    for k, participant in enumerate(packer.clients):
        if sha256_hex(words_bytes(signs[k])) != sha256_hex(words_bytes(words[participant])):
            raise _Unverifiable("the stored words do not repack to themselves with this version's packing")
    if sha256_hex(words_bytes(repacked_task)) != round_row.task_sha256:
        raise _Unverifiable("the task words do not repack to themselves with this version's packing")
    peers = None if peers is None else min(int(peers), len(words) - 1)
    pooled = score_with_pool(packer, pool, round_row.round, peers=peers, seed=round_row.seed, penalty=penalty,
                             bonus_fraction=bonus_fraction, duplicates=policy, duplicate_rule=rule,
                             reference=None if reference is None else np.ascontiguousarray(reference, dtype=np.int32),
                             reference_weight=settings.get("reference_weight") or 0.0, public=planes)
    recorded_rule = settings["pool"].get("rule", 1) if isinstance(settings.get("pool"), dict) else POOL_RULE
    if pooled.short and pool is not None and recorded_rule != POOL_RULE:
        raise _Unverifiable(f"the round's short participants were paid under peer-pool rule {recorded_rule!r}; this "
                            f"version computes rule {POOL_RULE}")
    return pooled.report


def _compare(report, rows: Sequence[RewardRow]) -> list[str]:
    groups = {c: g.clients for g in report.duplicates for c in g.clients}
    peers = report.peers
    out = []
    if sorted(r.participant for r in rows) != sorted(report.rewards):
        out.append(f"participants {sorted(r.participant for r in rows)} differ from the stored signs' "
                   f"{sorted(report.rewards)}")
    for row in rows:
        who = row.participant
        if who not in report.rewards:
            continue
        expected = (report.rewards[who], report.unadjusted_rewards[who], tuple(peers[who]), groups.get(who))
        stored = (row.reward, row.unadjusted_reward, row.peers, row.duplicate_group)
        if expected != stored:
            names = ("reward", "unadjusted_reward", "peers", "duplicate_group")
            diffs = [f"{n} {s!r} (recomputed {e!r})" for n, s, e in zip(names, stored, expected) if s != e]
            out.append(f"{who}: " + ", ".join(diffs))
    return out
