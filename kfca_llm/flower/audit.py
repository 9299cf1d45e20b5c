"""Auditing a reward ledger: the scoring settings a round records, its recomputation, the hash chain.

``verify_ledger(path)`` checks, for every committed round:

* the **chain**: each round's ``chain_hash`` is recomputed from its fields, rewards and failures and the
  previous round's hash, so an edited, deleted or reordered row is detected without any stored signs
  (deleting the newest rounds leaves a valid shorter chain: compare the head with one published earlier,
  ``expect_head``);
* the **rewards**, where the packed sign words were kept (``keep_signs``): each participant's words are read
  from the file named by its SHA-256, the round is scored again with the scoring engine (``SignPacker``)
  under the recorded seed and settings, and every row (reward, unadjusted reward, peers, duplicate group)
  must equal the recomputation exactly. A round is ``unverifiable`` when its signs were not kept or a file
  is missing, or when its settings name something this version cannot reproduce.

Sign words are turned back into updates that pack to the same words (-1 where the sign bit is set, +1 on
the other tasks, 0 off the task mask); the repacked words must hash to the stored names, so a change of the
packing convention shows as ``unverifiable``, never as a false match.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..engine.duplicates import DuplicateRule
from ..errors import InputError
from ..tensors import is_float
from .ledger import (GENESIS, SCORED, LedgerContents, RewardRow, RoundRow, chain_hash, read_ledger, sha256_hex,
                     signs_path)

MATCH, MISMATCH, UNVERIFIABLE = "match", "mismatch", "unverifiable"
SETTINGS_COMPARED_ON_RESUME = ("peers", "penalty", "bonus_fraction", "duplicates", "duplicate_rule", "aggregation",
                               "seed", "identity", "pool")


def scoring_settings(*, peers: int | None, penalty: str, bonus_fraction: float, duplicates: str,
                     duplicate_rule: DuplicateRule, aggregation: str, seed: int, identity: str,
                     pool: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """What decides a round's payments, as the ledger records it per run and per round (JSON); ``pool``: the
    peer pool's settings (``PoolSettings.to_dict``), left out where there is none."""
    out = {"peers": peers, "penalty": penalty, "bonus_fraction": float(bonus_fraction), "duplicates": duplicates,
           "duplicate_rule": dataclasses.asdict(duplicate_rule), "aggregation": aggregation, "seed": int(seed),
           "identity": identity}
    if pool is not None:
        out["pool"] = dict(pool)
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
    """``match``, ``mismatch`` or ``unverifiable`` (recomputation); chain problems are listed separately."""
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

    @property
    def ok(self) -> bool:
        return not self.chain_errors and all(r.status != MISMATCH for r in self.rounds)


def verify_ledger(path: str | os.PathLike, *, expect_head: str | None = None, backend: str = "auto") -> LedgerCheck:
    """Check the chain and recompute every round whose signs were kept (see the module docstring)."""
    contents = read_ledger(path)
    chain_errors, head = check_chain(contents)
    if expect_head is not None and head != expect_head:
        chain_errors.append(f"the chain ends at {head}, expected {expect_head} (rounds deleted or added after it)")
    by_round: dict[tuple[str, int], list[RewardRow]] = {}
    for row in contents.rewards:
        by_round.setdefault((row.run_id, row.round), []).append(row)
    checks = [recompute_round(path, r, by_round.get((r.run_id, r.round), []), backend, by_round)
              for r in contents.rounds]
    notes = [] if contents.schema_version >= 3 else [
        f"schema version {contents.schema_version}: no hash chain and no stored signs"]
    return LedgerCheck(checks, chain_errors, head, notes)


def check_chain(contents: LedgerContents) -> tuple[list[str], str | None]:
    """(problems, head): every round's hash recomputed, in commit order, against its stored one."""
    if contents.schema_version < 3:
        return [], None
    failures: dict[tuple[str, int], list] = {}
    for f in contents.failures:
        failures.setdefault((f.run_id, f.round), []).append(f)
    rewards: dict[tuple[str, int], list] = {}
    for r in contents.rewards:
        rewards.setdefault((r.run_id, r.round), []).append(r)
    problems, prev = [], GENESIS
    known = {r.chain_hash for r in contents.rounds}
    for r in contents.rounds:
        where = f"run {r.run_id[:8]} round {r.round}"
        if r.prev_hash != prev:
            problems.append(f"{where}: follows {str(r.prev_hash)[:16]}..., but the round before it in the ledger "
                            f"ends at {prev[:16]}... ({'rows reordered' if r.prev_hash in known else 'a round deleted'})")
        key = (r.run_id, r.round)
        if chain_hash(r.prev_hash, r, rewards.get(key, []), failures.get(key, [])) != r.chain_hash:
            problems.append(f"{where}: its rows do not hash to its chain hash (edited)")
        prev = r.chain_hash
    keys = {(r.run_id, r.round) for r in contents.rounds}
    orphans = sorted({k for k in (*rewards, *failures) if k not in keys})
    problems += [f"run {run[:8]} round {t}: rows of a round the ledger does not list (its round row was deleted)"
                 for run, t in orphans]
    return problems, (contents.rounds[-1].chain_hash if contents.rounds else GENESIS)


def recompute_round(ledger: str | os.PathLike, round_row: RoundRow, rows: Sequence[RewardRow],
                    backend: str = "auto",
                    earlier: Mapping[tuple[str, int], Sequence[RewardRow]] | None = None) -> RoundCheck:
    """Score one round again from its stored signs and compare it with its rows; ``earlier`` (run, round) ->
    rows holds the rounds a peer pool draws from (rounds recorded with pool settings)."""
    check = RoundCheck(round_row.run_id, round_row.round, UNVERIFIABLE)
    if round_row.status != SCORED:
        return dataclasses.replace(check, detail="not scored (nothing paid)")
    if not round_row.signs_kept:
        return dataclasses.replace(check, detail="signs not kept (keep_signs=False)")
    try:
        words = {row.participant: _read_words(ledger, row.sign_sha256) for row in rows}
        task = _read_words(ledger, round_row.task_sha256)
        pool = _rebuilt_pool(ledger, round_row, earlier or {})
        report = _rescore(round_row, words, task, backend, pool)
    except _Unverifiable as exc:
        return dataclasses.replace(check, detail=str(exc))
    mismatched = _compare(report, rows)
    if mismatched:
        return dataclasses.replace(check, status=MISMATCH, detail=f"{len(mismatched)} row(s) differ",
                                   rows=tuple(mismatched))
    return dataclasses.replace(check, status=MATCH, detail=f"{len(rows)} rewards recomputed")


class _Unverifiable(Exception):
    pass


def _read_words(ledger, sha: str | None) -> np.ndarray:
    if not sha:
        raise _Unverifiable("no SHA-256 recorded")
    path = signs_path(ledger, sha)
    try:
        data = path.read_bytes()
    except OSError:
        raise _Unverifiable(f"stored signs {path.name[:16]}... missing") from None
    if sha256_hex(data) != sha:
        raise _Unverifiable(f"stored signs {path.name[:16]}... do not hash to their name (file altered)")
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
    """The peer pool a run had at ``round_``: its rounds of the window, each participant not in a group of
    copies, with the words ``read_words(sha256)`` gives (None: a round recorded without a pool)."""
    from ..fl.peer_pool import PeerPool, PoolSettings

    if "pool" not in settings:
        return None
    pool = PeerPool(PoolSettings(**settings["pool"]))
    for t in range(max(1, round_ - pool.settings.window), round_):
        rows = [r for r in earlier.get((run_id, t), []) if r.duplicate_group is None]
        pool.add_round(t, {r.participant: read_words(r.sign_sha256) for r in rows})
    return pool


def _rebuilt_pool(ledger, round_row: RoundRow, earlier: Mapping[tuple[str, int], Sequence[RewardRow]]):
    try:
        return pool_from_rows(round_row.settings, round_row.run_id, round_row.round, earlier,
                              lambda sha: _read_words(ledger, sha))
    except (TypeError, InputError) as exc:
        raise _Unverifiable(f"this version cannot rebuild the round's peer pool ({exc})") from None


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
    if round_row.layout is None:
        raise _Unverifiable("no tensor layout recorded")
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
