"""The reward ledger: what KFCA paid, per run, round and participant, in one SQLite file (WAL mode).

Money is paid on these rows, so a round is written in one transaction: a server killed in the middle
of a round leaves no row of it. Standard library only: no Flower (nor numpy) needed to read a ledger.

Tables (schema version 4):

* ``runs``: one row per strategy run, with the package version, the scoring settings (JSON), whether signs
  are kept, and the public half of the server key that signs its receipts (``receipts.py``; NULL: none);
* ``participants``: every identity ever paid or refused, pinned on first sight (run, round, node id,
  key fingerprint, label). Payouts are keyed on identities, not on Flower's node ids, which change when
  a SuperNode restarts (``kfca_llm.flower.identity``);
* ``rounds``: status ``scored`` or ``not-scored``, the round's seed, package version and settings, the
  tensor layout and SHA-256 of the task words (what ``kfca-llm verify`` needs to recompute it), whether
  the packed signs were kept, the SHA-256 of the global arrays the round produced (for a resume), and a
  hash chained to the previous round's (``chain_hash``, over every field of the round, its rewards and
  failures, its run's row and the participants first seen in it): editing, deleting or reordering committed
  rows of any table breaks the chain (version 3 chains left out the ``runs`` and ``participants`` rows);
* ``rewards``: one row per scored participant (paid reward after the duplicate policy, the node id it
  used, its peers, examples, SHA-256 of its packed sign words, unadjusted reward, duplicate group);
* ``failures``: bad or refused replies, and round-level failures (``node_id`` NULL);
* ``settlements``: participants of an earlier, undetermined round paid at the end of a later one (``settled_in``,
  whose transaction writes them and whose chain hash covers them; ``fl.pool_settle``); a settled round pays the
  settlement's reward instead of its own row's. Added to version 4 later: a ledger without the table has none; a
  kfca-llm from before it reads the settling rounds of a ledger with settlements as edited (their hash covers rows it
  does not know), so audit a ledger with this version or a later one.

Beside the ledger, ``<ledger>.d/`` holds content-addressed files (named by their SHA-256): ``signs/`` the
packed sign words of each participant of a round and the round's task words (``keep_signs``), ``global/``
the arrays a round produced (the resume point). They are written atomically before the round's
transaction commits, so a committed round never names a file that is not there.

Version 1 and 2 ledgers (keyed by node id, no chain) are still read: their node ids read as identities.

Reading treats the file as hostile (an auditor reads what the operator hands over): it never writes beside
the ledger's folder when that folder is read-only (it reads a private copy), every cell is checked against
its field's type (text, integer, finite real, JSON of the right shape) and a row that fails is reported in
``LedgerContents.bad_rows`` and left out, never read as something else.
"""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ..errors import InputError
from .ledger_cells import open_for_reading, typed_rows
from .ledger_rows import (ADDED_ROUND_COLUMNS, GENESIS, NOT_SCORED, READABLE_VERSIONS, SCHEMA_VERSION, SCORED, FailureRow, LedgerContents,
                          Participant, RewardRow, RoundEntry, RoundRow, RunRow, SettlementRow, canonical_json, chain_hash)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    run_id TEXT PRIMARY KEY, started_at TEXT NOT NULL, strategy TEXT NOT NULL, package_version TEXT NOT NULL,
    settings TEXT NOT NULL, keep_signs INTEGER NOT NULL, receipt_key TEXT);
CREATE TABLE IF NOT EXISTS participants (
    participant TEXT PRIMARY KEY, label TEXT, key_fingerprint TEXT, first_run TEXT NOT NULL,
    first_round INTEGER NOT NULL, first_node_id TEXT NOT NULL, first_seen_at TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS rounds (
    run_id TEXT NOT NULL REFERENCES runs(run_id), round INTEGER NOT NULL,
    status TEXT NOT NULL CHECK (status IN ('scored', 'not-scored')), seed INTEGER NOT NULL,
    categorical_world INTEGER, valid_replies INTEGER NOT NULL, failed_replies INTEGER NOT NULL,
    recorded_at TEXT NOT NULL, package_version TEXT NOT NULL, settings TEXT NOT NULL, layout TEXT,
    task_sha256 TEXT, signs_kept INTEGER NOT NULL, global_sha256 TEXT, prev_hash TEXT NOT NULL,
    chain_hash TEXT NOT NULL UNIQUE, undetermined TEXT, reference_sha256 TEXT, public_sha256 TEXT,
    public_steps INTEGER, public_spans TEXT, values_sha256 TEXT, PRIMARY KEY (run_id, round));
CREATE TABLE IF NOT EXISTS rewards (
    run_id TEXT NOT NULL, round INTEGER NOT NULL, participant TEXT NOT NULL, node_id TEXT NOT NULL,
    reward REAL NOT NULL, peers TEXT NOT NULL, num_examples INTEGER, sign_sha256 TEXT NOT NULL,
    unadjusted_reward REAL NOT NULL, duplicate_group TEXT,
    PRIMARY KEY (run_id, round, participant), UNIQUE (run_id, round, node_id),
    FOREIGN KEY (run_id, round) REFERENCES rounds(run_id, round));
CREATE TABLE IF NOT EXISTS failures (
    run_id TEXT NOT NULL, round INTEGER NOT NULL, node_id TEXT, participant TEXT, reason TEXT NOT NULL,
    FOREIGN KEY (run_id, round) REFERENCES rounds(run_id, round));
CREATE TABLE IF NOT EXISTS settlements (
    run_id TEXT NOT NULL, round INTEGER NOT NULL, participant TEXT NOT NULL, settled_in INTEGER NOT NULL,
    reward REAL NOT NULL, peers TEXT NOT NULL, unadjusted_reward REAL NOT NULL,
    PRIMARY KEY (run_id, round, participant),
    FOREIGN KEY (run_id, round, participant) REFERENCES rewards(run_id, round, participant),
    FOREIGN KEY (run_id, settled_in) REFERENCES rounds(run_id, round));
"""


class LedgerWriteError(InputError):
    """The ledger (or its file store) cannot be written: full disk, read-only file, ... Nothing of the round
    was committed."""

def store_dir(path: str | os.PathLike) -> Path:
    """The folder of content-addressed files beside a ledger: ``rewards.sqlite`` -> ``rewards.sqlite.d``."""
    path = Path(path)
    return path.with_name(path.name + ".d")


def signs_path(ledger: str | os.PathLike, sha256: str) -> Path:
    return store_dir(ledger) / "signs" / sha256


def global_path(ledger: str | os.PathLike, sha256: str) -> Path:
    return store_dir(ledger) / "global" / f"{sha256}.safetensors"


def _write_content(path: Path, data: bytes) -> None:
    """Write a content-addressed file atomically (an existing file of that name holds the same bytes)."""
    from ..report import write_atomic

    if not path.is_file():
        write_atomic(path, data)


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="microseconds")


def _connect(path: Path) -> sqlite3.Connection:
    # isolation_level=None: transactions are explicit (BEGIN IMMEDIATE ... COMMIT) and span a whole round.
    conn = sqlite3.connect(path, isolation_level=None, timeout=30.0)
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute("PRAGMA foreign_keys=ON")
    return conn


def _json_or_null(value) -> str | None:
    return None if value is None else json.dumps(value)


class Ledger:
    """Append-only writer of one run's rounds; a fresh connection per round (any thread may write).

    ``resume=True`` continues the ledger's last run instead of starting one: its settings must equal
    ``settings`` (else ``InputError`` naming the first that differs); ``next_round`` is the round after
    its last committed one. ``keep_signs`` is the run's: a new run records the one given, a resumed run goes on
    with the one recorded (the only place that decides it: ``KFCAStrategy.keep_signs`` reads it).
    """

    def __init__(self, path: str | os.PathLike, *, run_id: str, strategy: str, package_version: str,
                 settings: Mapping[str, Any], keep_signs: bool, resume: bool = False,
                 receipt_key: str | None = None):
        self.path = Path(path)
        self.receipt_key = receipt_key
        self.keep_signs = bool(keep_signs)
        self.settings = dict(settings)
        self.package_version = package_version
        if self.path.exists() and not self.path.is_file():
            raise InputError(f"ledger path {str(self.path)!r} exists and is not a regular file")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            conn = _connect(self.path)
            try:
                version = conn.execute("PRAGMA user_version").fetchone()[0]
                if version not in (0, SCHEMA_VERSION):
                    raise InputError(f"ledger {str(self.path)!r} has schema version {version}, this kfca-llm "
                                     f"writes version {SCHEMA_VERSION}; give the strategy a new ledger file "
                                     f"(`kfca-llm ledger` still reads the old one)")
                conn.execute("PRAGMA journal_mode=WAL")
                conn.executescript(_SCHEMA)  # idempotent; executescript commits first, so before BEGIN
                # Columns added after version 4 was first written (additive: their rows read as None).
                for column, sql_type in ADDED_ROUND_COLUMNS.items():
                    if not _has_column(conn, "rounds", column):
                        conn.execute(f"ALTER TABLE rounds ADD COLUMN {column} {sql_type}")
                conn.execute("BEGIN IMMEDIATE")
                try:
                    conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
                    last = conn.execute("SELECT run_id, settings, receipt_key, keep_signs FROM runs ORDER BY rowid "
                                        "DESC LIMIT 1").fetchone()
                    if resume and last is not None:
                        _check_same_settings(json.loads(last[1]), self.settings)
                        if last[2] != receipt_key:
                            raise InputError(f"cannot resume: the run's receipts are signed with the server key "
                                             f"{last[2]!r}, this run's key is {receipt_key!r}")
                        self.run_id, self.keep_signs = last[0], bool(last[3])  # the run's flag, as recorded
                        done = conn.execute("SELECT max(round) FROM rounds WHERE run_id = ?", (self.run_id,))
                        self.next_round = (done.fetchone()[0] or 0) + 1
                    else:
                        self.run_id, self.next_round = run_id, 1
                        conn.execute("INSERT INTO runs VALUES (?, ?, ?, ?, ?, ?, ?)",
                                     (run_id, _now(), strategy, package_version, canonical_json(self.settings),
                                      int(self.keep_signs), receipt_key))
                    conn.execute("COMMIT")
                except BaseException:
                    conn.execute("ROLLBACK")
                    raise
            finally:
                conn.close()
        except sqlite3.DatabaseError as exc:
            raise LedgerWriteError(f"cannot use {str(self.path)!r} as a reward ledger: {exc}") from exc
        except OSError as exc:
            raise LedgerWriteError(f"cannot use {str(self.path)!r} as a reward ledger: {exc}") from exc

    def last_global_sha256(self) -> str | None:
        """SHA-256 of the arrays this run's last committed round produced (None: no round produced any)."""
        conn = _connect(self.path)
        try:
            row = conn.execute("SELECT global_sha256 FROM rounds WHERE run_id = ? AND global_sha256 IS NOT NULL "
                               "ORDER BY round DESC LIMIT 1", (self.run_id,)).fetchone()
        finally:
            conn.close()
        return None if row is None else row[0]

    def participants(self) -> dict[str, Participant]:
        conn = _connect(self.path)
        try:
            return {p.participant: p for p in _rows(conn, Participant, "participants")}
        finally:
            conn.close()

    def last_node_ids(self) -> dict[str, str]:
        """Per participant, the node id it was last paid from (a restart keeps the node id it had)."""
        conn = _connect(self.path)
        try:
            return dict(conn.execute("SELECT participant, node_id FROM rewards ORDER BY rowid"))
        finally:
            conn.close()

    def record_round(self, entry: RoundEntry) -> str:
        """Write one round in a single transaction (its files first); returns its chain hash.

        Raises ``LedgerWriteError`` (one line, nothing of the round committed) when the disk is full or
        the ledger cannot be written.
        """
        try:
            if entry.signs is not None:
                for sha, data in entry.signs.items():
                    _write_content(signs_path(self.path, sha), data)
            if entry.global_arrays is not None:
                _write_content(global_path(self.path, entry.global_arrays[0]), entry.global_arrays[1])
            return self._commit(entry)
        except (sqlite3.DatabaseError, OSError) as exc:
            raise LedgerWriteError(f"round {entry.round} was not recorded in the reward ledger "
                                   f"{str(self.path)!r} (nothing of it was committed): {exc}") from exc

    def _commit(self, entry: RoundEntry) -> str:
        round_row = RoundRow(
            run_id=self.run_id, round=entry.round, status=SCORED if entry.rewards else NOT_SCORED, seed=entry.seed,
            categorical_world=None if entry.categorical_world is None else bool(entry.categorical_world),
            valid_replies=entry.valid_replies,
            failed_replies=sum(f.node_id is not None for f in entry.failures), recorded_at=_now(),
            package_version=self.package_version, settings=dict(entry.settings),
            layout=None if entry.layout is None else tuple((n, tuple(s)) for n, s in entry.layout),
            task_sha256=entry.task_sha256, signs_kept=entry.signs is not None,
            global_sha256=None if entry.global_arrays is None else entry.global_arrays[0],
            undetermined=None if entry.undetermined is None else tuple(entry.undetermined),
            reference_sha256=entry.reference_sha256,
            public_sha256=None if entry.public is None else entry.public[0],
            public_steps=None if entry.public is None else int(entry.public[1]),
            public_spans=None if entry.public is None else tuple(int(s) for s in entry.public[2]),
            values_sha256=entry.values_sha256)
        conn = _connect(self.path)
        try:
            conn.execute("BEGIN IMMEDIATE")
            try:
                # Read inside the write transaction: two servers on one ledger still chain in commit order.
                prev = conn.execute("SELECT chain_hash FROM rounds ORDER BY rowid DESC LIMIT 1").fetchone()
                prev_hash = GENESIS if prev is None else prev[0]
                r = round_row
                for p in entry.new_participants:
                    conn.execute("INSERT OR IGNORE INTO participants VALUES (?, ?, ?, ?, ?, ?, ?)",
                                 (p.participant, p.label, p.key_fingerprint, p.first_run, p.first_round,
                                  p.first_node_id, p.first_seen_at or r.recorded_at))
                # The chain covers the rows as stored (read back): the run's row, the participants first seen now.
                (run,) = _rows(conn, RunRow, "runs", where=("run_id = ?", (r.run_id,)))
                first_seen = _rows(conn, Participant, "participants",
                                   where=("first_run = ? AND first_round = ?", (r.run_id, r.round)))
                digest = chain_hash(prev_hash, round_row, entry.rewards, entry.failures, run, first_seen,
                                    entry.settlements)
                conn.execute("INSERT INTO rounds (run_id, round, status, seed, categorical_world, valid_replies, "
                             "failed_replies, recorded_at, package_version, settings, layout, task_sha256, signs_kept, "
                             "global_sha256, prev_hash, chain_hash, undetermined, reference_sha256, public_sha256, "
                             "public_steps, public_spans, values_sha256) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, "
                             "?, ?, ?, ?, ?, ?, ?, ?)",
                             (r.run_id, r.round, r.status, r.seed, None if r.categorical_world is None
                              else int(r.categorical_world), r.valid_replies, r.failed_replies, r.recorded_at,
                              r.package_version, canonical_json(r.settings), _json_or_null(r.layout),
                              r.task_sha256, int(r.signs_kept), r.global_sha256, prev_hash, digest,
                              _json_or_null(None if r.undetermined is None else list(r.undetermined)),
                              r.reference_sha256, r.public_sha256, r.public_steps, _json_or_null(
                                  None if r.public_spans is None else list(r.public_spans)), r.values_sha256))
                for row in entry.rewards:
                    conn.execute("INSERT INTO rewards VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                                 (row.run_id, row.round, row.participant, row.node_id, row.reward,
                                  json.dumps(list(row.peers)), row.num_examples, row.sign_sha256,
                                  row.unadjusted_reward, _json_or_null(row.duplicate_group)))
                for f in entry.failures:
                    conn.execute("INSERT INTO failures VALUES (?, ?, ?, ?, ?)",
                                 (f.run_id, f.round, f.node_id, f.participant, f.reason))
                # Inserted after the round's row: the foreign key names it.
                for t in entry.settlements:
                    conn.execute("INSERT INTO settlements VALUES (?, ?, ?, ?, ?, ?, ?)",
                                 (t.run_id, t.round, t.participant, t.settled_in, t.reward, json.dumps(list(t.peers)),
                                  t.unadjusted_reward))
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
        finally:
            conn.close()
        return digest


def _check_same_settings(interrupted: Mapping[str, Any], resumed: Mapping[str, Any]) -> None:
    for key in sorted(set(interrupted) | set(resumed)):
        if interrupted.get(key) != resumed.get(key):
            raise InputError(f"cannot resume: scoring setting {key!r} was {interrupted.get(key)!r} in the "
                             f"interrupted run, this run has {resumed.get(key)!r}")


# ----------------------------------------------------------------------------------------------------------
# Reading


def _rows(conn: sqlite3.Connection, cls: type, table: str, columns: Mapping[str, str] = {},
          where: tuple[str, tuple] | None = None, bad: list[str] | None = None) -> list:
    return typed_rows(conn, cls, table, columns=columns, where=where, bad=bad)


def _has_table(conn: sqlite3.Connection, table: str) -> bool:
    return conn.execute("SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = ?", (table,)).fetchone()[0] > 0


def _has_column(conn: sqlite3.Connection, table: str, column: str) -> bool:
    # The reading connection returns text as bytes (ledger_cells checks every cell's encoding itself).
    return any(row[1] in (column, column.encode()) for row in conn.execute(f"PRAGMA table_info({table})"))


# Versions 1-2: keyed by node id, settings per run, no chain, no participants; read as version 3 rows.
_OLD_REWARDS = {"participant": "node_id", "unadjusted_reward": "unadjusted_reward", "duplicate_group": "duplicate_group"}
_OLD_ROUNDS = {**{c: "NULL" for c in ADDED_ROUND_COLUMNS}, "package_version": "''", "layout": "NULL", "task_sha256": "NULL", "signs_kept": "0",
               "global_sha256": "NULL", "prev_hash": "NULL", "chain_hash": "NULL",
               "settings": "(SELECT json_object('peers', peers, 'penalty', penalty, 'seed', runs.seed, 'bonus_fraction', "
                           "bonus_fraction, 'aggregation', aggregation{duplicates}) FROM runs "
                           "WHERE runs.run_id = rounds.run_id)"}


def read_ledger(path: str | os.PathLike) -> LedgerContents:
    """Every committed row of a reward ledger (read-only; an interrupted round is never visible; rows with a
    cell of the wrong type are listed in ``bad_rows`` and left out)."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"no ledger at {str(path)!r} (not a regular file)")
    bad: list[str] = []
    try:
        with open_for_reading(path) as conn:
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            if version not in READABLE_VERSIONS:
                raise InputError(f"{str(path)!r} is not a kfca-llm reward ledger (schema version {version})")
            if version >= 3:
                runs_columns = {} if version >= 4 else {"receipt_key": "NULL"}
                rewards = _rows(conn, RewardRow, "rewards", bad=bad)
                failures = _rows(conn, FailureRow, "failures", bad=bad)
                # A ledger written before a column was added (the pool's undetermined, the reference's signs) has
                # none: its rounds read as None there.
                rounds = _rows(conn, RoundRow, "rounds", {c: "NULL" for c in ADDED_ROUND_COLUMNS
                                                          if not _has_column(conn, "rounds", c)}, bad=bad)
                runs = _rows(conn, RunRow, "runs", runs_columns, bad=bad)
                participants = _rows(conn, Participant, "participants", bad=bad)
                settlements = _rows(conn, SettlementRow, "settlements", bad=bad) if _has_table(conn, "settlements") else []
            else:
                rewards = _rows(conn, RewardRow, "rewards", {
                    **_OLD_REWARDS, **({"unadjusted_reward": "reward", "duplicate_group": "NULL"} if version == 1
                                       else {})}, bad=bad)
                failures = _rows(conn, FailureRow, "failures", {"participant": "node_id"}, bad=bad)
                duplicates = ", 'duplicates', duplicates" if version == 2 else ""
                has_runs = conn.execute("SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'runs'")
                settings = _OLD_ROUNDS["settings"].format(duplicates=duplicates) if has_runs.fetchone()[0] else "'{}'"
                rounds = _rows(conn, RoundRow, "rounds", {**_OLD_ROUNDS, "settings": settings}, bad=bad)
                runs, participants, settlements = [], [], []
    except sqlite3.DatabaseError as exc:
        raise InputError(f"cannot read the reward ledger {str(path)!r}: {exc}") from exc
    except OSError as exc:
        raise InputError(f"cannot read the reward ledger {str(path)!r}: {exc}") from exc
    return LedgerContents(rewards, failures, rounds, runs, participants, version, bad, settlements)
