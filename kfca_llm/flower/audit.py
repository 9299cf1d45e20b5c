"""Auditing a reward ledger: the hash chain and the rounds recomputed (``recompute.py``); a participant's own check of
its update is ``node_check.py``.

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
  a file is missing, altered, of another size than its layout implies, or not a regular file in the store
  (``recompute.py``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from ..errors import InputError
from ..tensors import is_float
from .ledger import read_ledger
from .ledger_rows import FULL_CHAIN_VERSION, GENESIS, SCORED, LedgerContents, chain_hasher, sha256_hex
from .pool_replay import CLOSES_RUN, PoolTracker
from .recompute import DAMAGED, MISMATCH, RoundCheck, recompute_round, words_bytes


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
    pools = PoolTracker.of(contents)
    checks = [recompute_round(path, r, pools.rows(r), backend, pools) for r in contents.rounds]
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
    paid_rows = {(x.run_id, x.round, x.participant) for x in contents.rewards}
    scored = {(r.run_id, r.round): r.status for r in contents.rounds}
    # A round settles only earlier ones, but the run's last settles itself too (pool rule 17, fl.pool_settle).
    closing = {(r.run_id, r.round) for r in contents.rounds
               if isinstance(r.settings, dict) and r.settings.get(CLOSES_RUN) is True}
    for x in contents.settlements:
        where = f"run {x.run_id[:8]} round {x.round}"
        if scored.get((x.run_id, x.settled_in)) != SCORED:  # only a scored round's pool settles
            why = "was not scored" if (x.run_id, x.settled_in) in keys else "the ledger does not list (added, or deleted)"
            problems.append(f"{where}: {x.participant[:40]} settled in round {x.settled_in}, which {why}")
        elif (x.run_id, x.round, x.participant) not in paid_rows or x.settled_in < x.round or (
                x.settled_in == x.round and (x.run_id, x.round) not in closing):
            problems.append(f"{where}: {x.participant[:40]} settled in round {x.settled_in}, but has no reward row "
                            "in that earlier round (or, the run's last, its own) to settle (added)")
    listed = {p.participant for p in contents.participants}
    if contents.schema_version >= FULL_CHAIN_VERSION:
        unlisted = sorted({r.participant for r in contents.rewards} - listed)
        problems += [f"participant {who[:40]} is paid but not in the participants table (deleted)" for who in unlisted]
        problems += [f"participant {p.participant[:40]}: first seen in run {p.first_run[:8]} round {p.first_round}, "
                     "which the ledger does not list (added)" for p in contents.participants
                     if (p.first_run, p.first_round) not in keys]
    return problems, (contents.rounds[-1].chain_hash if contents.rounds else GENESIS)
