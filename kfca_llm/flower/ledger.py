"""The reward ledger: what KFCA paid, per run, round and node, in one SQLite file (WAL mode).

Money is paid on these rows, so a round is written in one transaction: a server killed in the middle
of a round leaves no row of it, and a restarted server appends a new run. Each node's row keeps the
SHA-256 of its packed sign report (the exact bits the rewards were computed from), so a payout can
be audited later by packing the same update again. Standard library only: no Flower needed to read.

Tables: ``runs`` (one row per strategy instance), ``rounds`` (status ``scored`` or ``not-scored``),
``rewards`` (one row per scored node), ``failures`` (bad replies, and rounds that could not be scored
or aggregated, with the reason; ``node_id`` is NULL for a round-level failure).

``rewards.reward`` is what is paid: after the strategy's duplicate policy (``runs.duplicates``, default
``zero``). ``unadjusted_reward`` is the reward before it and ``duplicate_group`` the node ids (JSON) of
the group of copies the node was found in (NULL if none), so an operator can review a flagged group and
release the original's pay. Schema version 2; a version-1 ledger (before copy detection) is still read
(its rewards read as unadjusted, with no group) but not appended to.
"""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass, fields
from datetime import datetime, timezone
from pathlib import Path

from ..errors import InputError

SCHEMA_VERSION = 2
READABLE_VERSIONS = (1, 2)
SCORED, NOT_SCORED = "scored", "not-scored"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    run_id TEXT PRIMARY KEY, started_at TEXT NOT NULL, strategy TEXT NOT NULL, aggregation TEXT NOT NULL,
    peers INTEGER, penalty TEXT NOT NULL, seed INTEGER NOT NULL, bonus_fraction REAL NOT NULL,
    duplicates TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS rounds (
    run_id TEXT NOT NULL REFERENCES runs(run_id), round INTEGER NOT NULL,
    status TEXT NOT NULL CHECK (status IN ('scored', 'not-scored')), seed INTEGER NOT NULL,
    categorical_world INTEGER, valid_replies INTEGER NOT NULL, failed_replies INTEGER NOT NULL,
    recorded_at TEXT NOT NULL, PRIMARY KEY (run_id, round));
CREATE TABLE IF NOT EXISTS rewards (
    run_id TEXT NOT NULL, round INTEGER NOT NULL, node_id TEXT NOT NULL, reward REAL NOT NULL,
    peers TEXT NOT NULL, penalty TEXT NOT NULL, seed INTEGER NOT NULL, categorical_world INTEGER NOT NULL,
    num_examples INTEGER, sign_sha256 TEXT NOT NULL, unadjusted_reward REAL NOT NULL, duplicate_group TEXT,
    PRIMARY KEY (run_id, round, node_id),
    FOREIGN KEY (run_id, round) REFERENCES rounds(run_id, round));
CREATE TABLE IF NOT EXISTS failures (
    run_id TEXT NOT NULL, round INTEGER NOT NULL, node_id TEXT, reason TEXT NOT NULL,
    FOREIGN KEY (run_id, round) REFERENCES rounds(run_id, round));
"""


@dataclass(frozen=True)
class RewardRow:
    run_id: str
    round: int
    node_id: str
    reward: float
    peers: tuple[str, ...]
    penalty: str
    seed: int
    """The round's KFCA seed (derived from the strategy's seed and the round)."""
    categorical_world: bool
    num_examples: int | None
    sign_sha256: str
    unadjusted_reward: float
    """The reward before the duplicate policy (``reward`` is what is paid)."""
    duplicate_group: tuple[str, ...] | None = None
    """The group of copies this node was found in this round (None: not flagged)."""


@dataclass(frozen=True)
class FailureRow:
    run_id: str
    round: int
    node_id: str | None
    reason: str


@dataclass(frozen=True)
class RoundRow:
    run_id: str
    round: int
    status: str
    seed: int
    categorical_world: bool | None
    valid_replies: int
    failed_replies: int
    recorded_at: str


@dataclass(frozen=True)
class LedgerContents:
    """Every row of a ledger, in the order they were written."""

    rewards: list[RewardRow]
    failures: list[FailureRow]
    rounds: list[RoundRow]

    def totals(self) -> dict[str, float]:
        """Total reward per node over every run and round (sorted by node id)."""
        out: dict[str, float] = {}
        for row in self.rewards:
            out[row.node_id] = out.get(row.node_id, 0.0) + row.reward
        return dict(sorted(out.items()))


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="microseconds")


def _connect(path: Path) -> sqlite3.Connection:
    # isolation_level=None: transactions are explicit (BEGIN IMMEDIATE ... COMMIT) and span a whole round.
    conn = sqlite3.connect(path, isolation_level=None, timeout=30.0)
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute("PRAGMA foreign_keys=ON")
    return conn


class Ledger:
    """Append-only writer of one run's rounds; a fresh connection per round (any thread may write)."""

    def __init__(self, path: str | os.PathLike, *, run_id: str, strategy: str, aggregation: str,
                 peers: int | None, penalty: str, seed: int, bonus_fraction: float, duplicates: str):
        self.path = Path(path)
        self.run_id = run_id
        if self.path.exists() and not self.path.is_file():
            raise InputError(f"ledger path {str(self.path)!r} exists and is not a regular file")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            conn = _connect(self.path)
            try:
                version = conn.execute("PRAGMA user_version").fetchone()[0]
                if version not in (0, SCHEMA_VERSION):
                    raise InputError(f"ledger {str(self.path)!r} has schema version {version}, this kfca-llm "
                                     f"writes version {SCHEMA_VERSION}; give the strategy a new ledger file "
                                     f"(`kfca-llm ledger` still reads the old one)")
                conn.execute("PRAGMA journal_mode=WAL")
                conn.executescript(_SCHEMA)  # idempotent; executescript commits first, so before BEGIN
                conn.execute("BEGIN IMMEDIATE")
                conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
                conn.execute("INSERT INTO runs VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                             (run_id, _now(), strategy, aggregation, peers, penalty, seed, bonus_fraction,
                              duplicates))
                conn.execute("COMMIT")
            finally:
                conn.close()
        except sqlite3.DatabaseError as exc:
            raise InputError(f"cannot use {str(self.path)!r} as a reward ledger: {exc}") from exc

    def record_round(self, server_round: int, *, seed: int, rewards: Sequence[RewardRow],
                     failures: Sequence[FailureRow], valid_replies: int,
                     categorical_world: bool | None) -> None:
        """Write one round (its status, rewards and failures) in a single transaction."""
        conn = _connect(self.path)
        try:
            conn.execute("BEGIN IMMEDIATE")
            try:
                conn.execute("INSERT INTO rounds VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                             (self.run_id, server_round, SCORED if rewards else NOT_SCORED, seed,
                              None if categorical_world is None else int(categorical_world), valid_replies,
                              sum(f.node_id is not None for f in failures), _now()))
                for row in rewards:
                    conn.execute("INSERT INTO rewards VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                                 (row.run_id, row.round, row.node_id, row.reward, json.dumps(list(row.peers)),
                                  row.penalty, row.seed, int(row.categorical_world), row.num_examples,
                                  row.sign_sha256, row.unadjusted_reward,
                                  None if row.duplicate_group is None else json.dumps(list(row.duplicate_group))))
                for f in failures:
                    conn.execute("INSERT INTO failures VALUES (?, ?, ?, ?)", (f.run_id, f.round, f.node_id, f.reason))
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
        finally:
            conn.close()


def _rows(conn: sqlite3.Connection, cls: type, table: str, convert, absent: tuple[str, ...] = ()) -> list:
    """Rows of ``table`` as ``cls``; the ``absent`` fields (columns an older schema lacks) are left to ``convert``."""
    names = [f.name for f in fields(cls) if f.name not in absent]
    query = f"SELECT {', '.join(names)} FROM {table} ORDER BY rowid"
    return [cls(**convert(dict(zip(names, values)))) for values in conn.execute(query)]


def _reward_row(r: dict) -> dict:
    group = r.get("duplicate_group")
    return {**r, "peers": tuple(json.loads(r["peers"])), "categorical_world": bool(r["categorical_world"]),
            # version 1 had no copy detection: what was paid is the unadjusted reward
            "unadjusted_reward": r.get("unadjusted_reward", r["reward"]),
            "duplicate_group": None if group is None else tuple(json.loads(group))}


def read_ledger(path: str | os.PathLike) -> LedgerContents:
    """Every committed row of a reward ledger (read-only; an interrupted round is never visible)."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"no ledger at {str(path)!r} (not a regular file)")
    try:
        conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
        try:
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            if version not in READABLE_VERSIONS:
                raise InputError(f"{str(path)!r} is not a kfca-llm reward ledger (schema version {version})")
            rewards = _rows(conn, RewardRow, "rewards", _reward_row,
                            absent=("unadjusted_reward", "duplicate_group") if version == 1 else ())
            failures = _rows(conn, FailureRow, "failures", lambda r: r)
            rounds = _rows(conn, RoundRow, "rounds", lambda r: {
                **r, "categorical_world": None if r["categorical_world"] is None else bool(r["categorical_world"])})
        finally:
            conn.close()
    except sqlite3.DatabaseError as exc:
        raise InputError(f"cannot read the reward ledger {str(path)!r}: {exc}") from exc
    return LedgerContents(rewards, failures, rounds)


def ledger_summary(contents: LedgerContents) -> list[dict]:
    """Per node: total reward, rounds paid and mean reward per paid round (sorted by node id)."""
    paid: dict[str, list[float]] = {}
    for row in contents.rewards:
        paid.setdefault(row.node_id, []).append(row.reward)
    return [{"node_id": node, "total": total, "rounds": len(paid[node]), "mean": total / len(paid[node])}
            for node, total in contents.totals().items()]
