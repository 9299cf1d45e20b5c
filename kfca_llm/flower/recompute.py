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
from .ledger_rows import SCORED, RewardRow, RoundRow, sha256_hex
from .pool_replay import Damaged, PoolTracker, Unverifiable, recorded_planes, recorded_values

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
            raise Damaged("no tensor layout recorded")
        try:
            n_bytes = 4 * Layout.from_shapes(dict(round_row.layout)).n_words
        except InputError as exc:
            raise Damaged(f"the recorded tensor layout is not one any update has ({exc})") from None
        if len(rows) < 2:
            raise Damaged(f"a scored round with {len(rows)} reward row(s); KFCA scores two or more")
        words = {row.participant: read_stored(ledger, row.sign_sha256, n_bytes) for row in rows}
        task = read_stored(ledger, round_row.task_sha256, n_bytes)
        reference = None
        if round_row.settings.get("reference_weight"):
            if round_row.reference_sha256 is None:
                raise Unverifiable("a round scored against the server's reference, recorded without its signs")
            reference = read_stored(ledger, round_row.reference_sha256, n_bytes)
        if "pool" in round_row.settings and pools is None:
            raise Unverifiable("a round scored with a peer pool needs the earlier rounds to rebuild it")
        def read(sha: str, rows: int = 1, size: int | None = None) -> np.ndarray:
            return read_stored(ledger, sha, rows * n_bytes if size is None else size)

        planes = recorded_planes(round_row, read)
        pool = None if pools is None else pools.before(round_row, read)
        try:
            report = _rescore(round_row, words, task, backend, pool, reference, planes,
                              recorded_values(round_row, list(words), read))
        except (InputError, ValueError, TypeError, KeyError) as exc:  # hostile settings the chain still covers
            raise Unverifiable(f"this version cannot score the round with its recorded settings "
                                f"({printable(str(exc))[:160]})") from None
        settled = [] if pools is None else pools.check_settlements(round_row, read)
    except Damaged as exc:
        return dataclasses.replace(check, status=DAMAGED, detail=str(exc))
    except Unverifiable as exc:
        return dataclasses.replace(check, detail=str(exc))
    mismatched = _compare(report, rows) + settled
    if mismatched:
        return dataclasses.replace(check, status=MISMATCH, detail=f"{len(mismatched)} row(s) differ",
                                   rows=tuple(mismatched))
    done = pools.settled_in(round_row) if pools is not None else 0
    return dataclasses.replace(check, status=MATCH, detail=f"{len(rows)} rewards recomputed"
                               + (f", {done} settlement(s) of earlier rounds" if done else ""))


def _real_folder(path: Path) -> None:
    try:
        info = os.lstat(path)
    except OSError:
        raise Damaged(f"the store folder {path.name}/ is missing") from None
    if not stat.S_ISDIR(info.st_mode):
        raise Damaged(f"the store folder {path.name}/ is not a directory (a link is not followed)")


def read_stored(ledger, sha: str | None, n_bytes: int) -> np.ndarray:
    """The words stored under ``sha``: a regular file of ``n_bytes`` inside ``<ledger>.d/signs/``, hashing to ``sha``."""
    if not isinstance(sha, str) or not _SHA256.fullmatch(sha):
        raise Damaged(f"stored signs named {printable(str(sha))[:80]!r}, not a SHA-256 (64 hex digits); not opened")
    folder = store_dir(ledger) / "signs"
    _real_folder(folder.parent)
    _real_folder(folder)
    try:  # no link followed, a FIFO opened without waiting for a writer; fstat decides on the open file
        fd = os.open(folder / sha, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        why = "a link (not followed)" if exc.errno == errno.ELOOP else "missing"
        raise Damaged(f"stored signs {sha[:16]}... {why}") from None
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise Damaged(f"stored signs {sha[:16]}... are not a regular file; not read")
        if info.st_size != n_bytes:
            raise Damaged(f"stored signs {sha[:16]}... hold {info.st_size} bytes, the round's layout "
                           f"implies {n_bytes}")
        data = handle.read(n_bytes)
    if sha256_hex(data) != sha:
        raise Damaged(f"stored signs {sha[:16]}... do not hash to their name (file altered)")
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


def _rescore(round_row: RoundRow, words: Mapping[str, np.ndarray], task: np.ndarray, backend: str, pool=None,
             reference: np.ndarray | None = None, planes=None, values: Mapping[str, np.ndarray] | None = None):
    from ..fl.peer_pool import score_with_pool
    from ..fl.pool_settings import POOL_RULE, check_pool_rule
    from ..packer import SignPacker

    settings = round_row.settings
    try:
        # A rule recorded without one of today's fields was applied by a version whose copy rule differed (before
        # copy_fit_sigma the copy fit was taken 3 standard errors up): today's defaults would not reproduce it.
        missing = sorted({f.name for f in dataclasses.fields(DuplicateRule)} - set(settings["duplicate_rule"]))
        if missing:
            raise Unverifiable(f"the round's duplicate rule was recorded by a version without {', '.join(missing)}; "
                                f"this version's copy rule differs from the one applied then")
        rule = DuplicateRule(**settings["duplicate_rule"])
        penalty, bonus_fraction, policy = settings["penalty"], settings["bonus_fraction"], settings["duplicates"]
        peers = settings["peers"]
    except (KeyError, TypeError, InputError) as exc:
        raise Unverifiable(f"this version cannot apply the round's scoring settings ({exc})") from None
    packer = SignPacker(dict(round_row.layout), list(words), backend=backend)
    for participant, row_words in words.items():
        packer.add_many(participant, updates_from_words(round_row.layout, row_words, task, packer))
    signs, repacked_task = packer.words()
    for k, participant in enumerate(packer.clients):
        if sha256_hex(words_bytes(signs[k])) != sha256_hex(words_bytes(words[participant])):
            raise Unverifiable("the stored words do not repack to themselves with this version's packing")
    if sha256_hex(words_bytes(repacked_task)) != round_row.task_sha256:
        raise Unverifiable("the task words do not repack to themselves with this version's packing")
    peers = None if peers is None else min(int(peers), len(words) - 1)
    pooled = score_with_pool(packer, pool, round_row.round, peers=peers, seed=round_row.seed, penalty=penalty,
                             bonus_fraction=bonus_fraction, duplicates=policy, duplicate_rule=rule,
                             reference=None if reference is None else np.ascontiguousarray(reference, dtype=np.int32),
                             reference_weight=settings.get("reference_weight") or 0.0, public=planes, values=values)
    recorded_rule = settings["pool"].get("rule", 1) if isinstance(settings.get("pool"), dict) else POOL_RULE
    if pooled.short and pool is not None:
        try:
            check_pool_rule(recorded_rule)
        except InputError as exc:
            raise Unverifiable(f"the round's short participants were paid under another rule: {exc}") from None
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
