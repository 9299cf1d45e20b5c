"""Auditing a reward ledger: the scoring settings a round records, its recomputation, the hash chain.

``verify_ledger(path)`` checks, for every committed round:

* the **chain**: each round's ``chain_hash`` is recomputed from its fields, rewards, failures, its run's
  row and the participants first seen in it, and the previous round's hash. The chain is unkeyed: it
  detects an edit made by someone who did not recompute the hashes after it, and, against a head published
  earlier (``expect_head``), any change to the rounds up to it. It proves nothing against whoever rewrote
  the whole ledger after the last published head; **receipts** do (``receipts.py``: each participant
  holds, per round, its reward and the round's chain hash signed by the server's key);
* the **rewards**, where the packed sign words were kept (``keep_signs``): each participant's words are read
  from the file named by its SHA-256, the round is scored again with the scoring engine (``SignPacker``)
  under the recorded seed and settings, and every row (reward, unadjusted reward, peers, duplicate group)
  must equal the recomputation exactly. A round is ``unverifiable`` when its signs were not kept, or when its
  settings name something this version cannot reproduce; ``damaged`` when it says its signs were kept and
  a file is missing, altered, of another size than its layout implies, or not a regular file in the store.

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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..engine.duplicates import DuplicateRule
from ..engine.layout import Layout
from ..errors import InputError
from ..report import printable
from ..tensors import is_float
from .ledger import (FULL_CHAIN_VERSION, GENESIS, SCORED, LedgerContents, RewardRow, RoundRow, chain_hasher,
                     read_ledger, sha256_hex, store_dir)

MATCH, MISMATCH, UNVERIFIABLE, DAMAGED = "match", "mismatch", "unverifiable", "damaged"
STATUSES = (MATCH, MISMATCH, UNVERIFIABLE, DAMAGED)
_SHA256 = re.compile(r"[0-9a-f]{64}")
SETTINGS_COMPARED_ON_RESUME = ("peers", "penalty", "bonus_fraction", "duplicates", "duplicate_rule", "aggregation",
                               "seed", "identity", "pool")


def scoring_settings(*, peers: int | None, penalty: str, bonus_fraction: float, duplicates: str,
                     duplicate_rule: DuplicateRule, aggregation: str, seed: int, identity: str,
                     pool: Mapping[str, Any] | None = None, reference_weight: float | None = None) -> dict[str, Any]:
    """What decides a round's payments, as the ledger records it per run and per round (JSON); ``pool``: the
    peer pool's settings (``PoolSettings.to_dict``), left out where there is none; ``reference_weight``: the
    trusted reference's weight (``fl.reference``), left out where there is no reference."""
    out = {"peers": peers, "penalty": penalty, "bonus_fraction": float(bonus_fraction), "duplicates": duplicates,
           "duplicate_rule": dataclasses.asdict(duplicate_rule), "aggregation": aggregation, "seed": int(seed),
           "identity": identity}
    if pool is not None:
        out["pool"] = dict(pool)
    if reference_weight is not None:
        out["reference_weight"] = float(reference_weight)
    return out


def words_bytes(words: np.ndarray) -> bytes:
    """The stored form of packed words: little-endian int32 (what ``sign_sha256`` hashes)."""
    return np.ascontiguousarray(words, dtype="<i4").tobytes()


def sign_report_sha256(signs: np.ndarray) -> str:
    """SHA-256 of one participant's packed sign words (its row of ``SignPacker.words()[0]``)."""
    return sha256_hex(words_bytes(signs))


def update_sha256(update: Mapping[str, np.ndarray]) -> str:
    """The ledger's digest of an update (its floating-point arrays), recomputed from the update itself."""
    from ..packer import SignPacker

    scored = {name: np.asarray(a) for name, a in update.items() if is_float(np.asarray(a))}
    if not scored:
        raise InputError("the update holds no floating-point array")
    packer = SignPacker({name: a.shape for name, a in scored.items()}, ["audited", "unused"])
    packer.add_many("audited", scored)
    return sign_report_sha256(packer.words()[0][packer.clients.index("audited")])


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


@dataclass(frozen=True)
class LedgerCheck:
    rounds: list[RoundCheck]
    chain_errors: list[str]
    head: str | None
    """The last round's chain hash (publish it: a later truncation cannot reproduce it)."""
    notes: list[str] = field(default_factory=list)
    bad_rows: list[str] = field(default_factory=list)
    """Rows that could not be read as their type (left out of everything else)."""
    receipt_errors: list[str] = field(default_factory=list)
    receipts_checked: int | None = None
    """Receipts whose signature verified (None: no receipts given)."""

    @property
    def ok(self) -> bool:
        return (not self.chain_errors and not self.bad_rows and not self.receipt_errors
                and all(r.status not in (MISMATCH, DAMAGED) for r in self.rounds))


def verify_ledger(path: str | os.PathLike, *, expect_head: str | None = None, receipts: str | os.PathLike | None = None,
                  server_key=None, backend: str = "auto") -> LedgerCheck:
    """Check the chain, the receipts in ``receipts`` (signed by ``server_key``, an Ed25519 public key or its
    file; ``receipts.read_public_key``), and recompute every round whose signs were kept (module docstring)."""
    contents = read_ledger(path)
    chain_errors, head = check_chain(contents)
    chained = contents.schema_version >= 3
    if expect_head is not None and not chained:
        chain_errors.append(f"schema version {contents.schema_version} has no hash chain: no head to compare with "
                            f"{expect_head}")
    elif expect_head is not None and head != expect_head:
        chain_errors.append(f"the chain ends at {head}, expected {expect_head} (rounds deleted, added or rewritten)")
    receipt_errors, receipts_checked = [], None
    if receipts is not None:
        from .receipts import check_receipts, read_public_key

        if server_key is None:
            raise InputError("receipts are checked against the server's published public key: give --server-key")
        key = read_public_key(server_key) if isinstance(server_key, (str, os.PathLike)) else server_key
        receipt_errors, receipts_checked = check_receipts(contents, receipts, key)
    by_round: dict[tuple[str, int], list[RewardRow]] = {}
    for row in contents.rewards:
        by_round.setdefault((row.run_id, row.round), []).append(row)
    pools = PoolTracker(by_round)
    checks = [recompute_round(path, r, by_round.get((r.run_id, r.round), []), backend, pools)
              for r in contents.rounds]
    notes = schema_notes(contents.schema_version)
    if chained and receipts is None and expect_head is None:
        notes.append("no receipts and no published head given: an intact chain shows only that no row was edited "
                     "without recomputing the hashes after it (whoever can write the ledger can do that)")
    return LedgerCheck(checks, chain_errors, head, notes, contents.bad_rows, receipt_errors, receipts_checked)


def schema_notes(version: int) -> list[str]:
    """What verify cannot check on a ledger of an older schema."""
    if version < 3:
        return [f"schema version {version}: no hash chain, no stored signs, no receipts: nothing of this ledger "
                "can be checked; an edited row passes"]
    if version < FULL_CHAIN_VERSION:
        return [f"schema version {version}: the chain leaves out the runs and participants tables (the labels "
                "`kfca-llm ledger` shows, a run's keep_signs flag and settings row) and the ledger has no receipts"]
    return []


def check_chain(contents: LedgerContents) -> tuple[list[str], str | None]:
    """(problems, head): every round's hash recomputed, in commit order, against its stored one; rows of no
    round, participants paid but never listed, and rounds that say a signs-keeping run kept no signs."""
    if contents.schema_version < 3:
        return [], None
    hash_round = chain_hasher(contents)
    problems, prev = [], GENESIS
    known = {r.chain_hash for r in contents.rounds}
    runs = {r.run_id: r for r in contents.runs}
    for r in contents.rounds:
        where = f"run {r.run_id[:8]} round {r.round}"
        if r.prev_hash != prev:
            problems.append(f"{where}: follows {str(r.prev_hash)[:16]}..., but the round before it in the ledger "
                            f"ends at {prev[:16]}... ({'rows reordered' if r.prev_hash in known else 'a round deleted'})")
        if hash_round(r, r.prev_hash) != r.chain_hash:
            problems.append(f"{where}: its rows do not hash to its chain hash (edited)")
        run = runs.get(r.run_id)
        if contents.schema_version >= FULL_CHAIN_VERSION and run is None:
            problems.append(f"{where}: its run's row is missing from the runs table (deleted)")
        elif run is not None and run.keep_signs and r.status == SCORED and not r.signs_kept:
            problems.append(f"{where}: says its signs were not kept, but its run keeps signs (a flag set to hide "
                            "the round from the recomputation)")
        prev = r.chain_hash
    keys = {(r.run_id, r.round) for r in contents.rounds}
    orphans = sorted({(x.run_id, x.round) for x in (*contents.rewards, *contents.failures)} - keys)
    problems += [f"run {run[:8]} round {t}: rows of a round the ledger does not list (its round row was deleted)"
                 for run, t in orphans]
    listed = {p.participant for p in contents.participants}
    if contents.schema_version >= FULL_CHAIN_VERSION:
        unlisted = sorted({r.participant for r in contents.rewards} - listed)
        problems += [f"participant {who[:40]} is paid but not in the participants table (deleted)" for who in unlisted]
        problems += [f"participant {p.participant[:40]}: first seen in run {p.first_run[:8]} round {p.first_round}, "
                     "which the ledger does not list (added)" for p in contents.participants
                     if (p.first_run, p.first_round) not in keys]
    return problems, (contents.rounds[-1].chain_hash if contents.rounds else GENESIS)


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
        if round_row.settings.get("reference_weight"):
            raise _Unverifiable("a round scored against the server's reference: the ledger does not keep its signs")
        if "pool" in round_row.settings and pools is None:
            raise _Unverifiable("a round scored with a peer pool needs the earlier rounds to rebuild it")
        pool = None if pools is None else pools.before(round_row, lambda sha: _read_words(ledger, sha, n_bytes))
        try:
            report = _rescore(round_row, words, task, backend, pool)
        except (InputError, ValueError, TypeError, KeyError) as exc:  # hostile settings the chain still covers
            raise _Unverifiable(f"this version cannot score the round with its recorded settings "
                                f"({printable(str(exc))[:160]})") from None
    except _Damaged as exc:
        return dataclasses.replace(check, status=DAMAGED, detail=str(exc))
    except _Unverifiable as exc:
        return dataclasses.replace(check, detail=str(exc))
    mismatched = _compare(report, rows)
    if mismatched:
        return dataclasses.replace(check, status=MISMATCH, detail=f"{len(mismatched)} row(s) differ",
                                   rows=tuple(mismatched))
    return dataclasses.replace(check, status=MATCH, detail=f"{len(rows)} rewards recomputed")


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


def pool_from_rows(settings: Mapping[str, Any], run_id: str, round_: int,
                   earlier: Mapping[tuple[str, int], Sequence[RewardRow]], read_words) -> Any:
    """The peer pool a run had at ``round_``, from its rounds 1 to ``round_ - 1``: each participant not in a group
    of copies, with the words ``read_words(sha256)`` gives (None: a round recorded without a pool)."""
    from ..fl.peer_pool import PeerPool, PoolSettings

    if "pool" not in settings:
        return None
    pool = PeerPool(PoolSettings(**settings["pool"]))
    for t in range(1, round_):
        rows = [r for r in earlier.get((run_id, t), []) if r.duplicate_group is None]
        pool.add_round(t, {r.participant: read_words(r.sign_sha256) for r in rows})
    return pool


class PoolTracker:
    """Each run's peer pool as ``verify_ledger`` walks the rounds in commit order: built once, round by round, from
    the earlier rounds' kept signs (as ``KFCAStrategy`` built it), so a run of T rounds reads each file once."""

    def __init__(self, by_round: Mapping[tuple[str, int], Sequence[RewardRow]]):
        self._by_round = by_round
        self._pools: dict[str, tuple[Any, int]] = {}
        self._broken: dict[str, str] = {}

    def before(self, round_row: RoundRow, read_words) -> Any:
        """The pool ``round_row``'s run had before it (None: scored without one); ``_Unverifiable`` when an earlier
        round's signs cannot be read."""
        from ..fl.peer_pool import PeerPool, PoolSettings

        settings, run = round_row.settings, round_row.run_id
        if "pool" not in settings:
            return None
        if run in self._broken:
            raise _Unverifiable(self._broken[run])
        try:
            pool, done = self._pools.get(run) or (PeerPool(PoolSettings(**settings["pool"])), 1)
        except (TypeError, InputError) as exc:
            raise _Unverifiable(f"this version cannot rebuild the round's peer pool ({exc})") from None
        try:
            for t in range(done, round_row.round):
                rows = [r for r in self._by_round.get((run, t), []) if r.duplicate_group is None]
                pool.add_round(t, {r.participant: read_words(r.sign_sha256) for r in rows})
        except (_Damaged, _Unverifiable, InputError) as exc:
            self._broken[run] = f"its peer pool cannot be rebuilt: an earlier round's signs ({exc})"
            raise _Unverifiable(self._broken[run]) from None
        self._pools[run] = (pool, round_row.round)
        return pool


def _rescore(round_row: RoundRow, words: Mapping[str, np.ndarray], task: np.ndarray, backend: str, pool=None):
    from ..fl.peer_pool import score_with_pool
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
    return score_with_pool(packer, pool, round_row.round, peers=peers, seed=round_row.seed, penalty=penalty,
                           bonus_fraction=bonus_fraction, duplicates=policy, duplicate_rule=rule).report


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


def check_node_update(path: str | os.PathLike, update: Mapping[str, np.ndarray], server_round: int,
                      run_id: str | None = None) -> list[RewardRow]:
    """The ledger rows of ``server_round`` whose sign hash is the one of ``update`` (a participant's own check)."""
    contents = read_ledger(path)
    rows = [r for r in contents.rewards if r.round == server_round and (run_id is None or r.run_id.startswith(run_id))]
    if not rows:
        raise InputError(f"the ledger has no scored round {server_round}" + (f" in run {run_id}" if run_id else ""))
    digest = update_sha256(update)
    return [r for r in rows if r.sign_sha256 == digest]


def load_update_file(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """A participant's update (update = what it sent minus what it was sent) from a .safetensors or .npz file."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"no update file at {str(path)!r}")
    try:
        if path.suffix == ".npz":
            with np.load(path, allow_pickle=False) as data:
                return {k: data[k] for k in data.files}
        from safetensors.numpy import load_file

        return load_file(str(path))
    except (OSError, ValueError) as exc:
        raise InputError(f"cannot read the update {str(path)!r}: {exc}") from exc
    except Exception as exc:  # safetensors raises its own error type on a malformed header
        raise InputError(f"cannot read the update {str(path)!r}: {exc}") from exc
