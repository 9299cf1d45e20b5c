"""The reward ledger's rows as Python reads and writes them, and what is computed from rows alone: the hash
chain (``chain_hash``, ``chain_hasher``) and each participant's balance (``ledger_summary``).

Standard library only, no SQLite: the file itself (schema, writer, reader, the content-addressed store beside
it) is ``ledger.py``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

SCHEMA_VERSION = 4
READABLE_VERSIONS = (1, 2, 3, 4)
FULL_CHAIN_VERSION = 4
"""The first schema whose chain covers the ``runs`` and ``participants`` rows."""
SCORED, NOT_SCORED = "scored", "not-scored"
GENESIS = "0" * 64
"""The ``prev_hash`` of a ledger's first round."""


@dataclass(frozen=True)
class RewardRow:
    run_id: str
    round: int
    participant: str
    """The identity paid (``kfca_llm.flower.identity``): stable across restarts of its SuperNode."""
    node_id: str
    """The Flower node id the participant replied from in this round."""
    reward: float
    peers: tuple[str, ...]
    num_examples: int | None
    sign_sha256: str
    """SHA-256 of the participant's packed sign words (little-endian int32): the exact bits scored."""
    unadjusted_reward: float
    """The reward before the duplicate policy (``reward`` is what is paid)."""
    duplicate_group: tuple[str, ...] | None = None
    """The group of copies this participant was found in this round (None: not flagged)."""


@dataclass(frozen=True)
class SettlementRow:
    """A participant of an earlier, undetermined round, paid at the end of a later round (``fl.pool_settle``)."""

    run_id: str
    round: int
    """The round whose submission is paid (its ``rewards`` row holds 0 and the score it had then)."""
    participant: str
    settled_in: int
    """The round whose transaction (and chain hash) holds this row."""
    reward: float
    peers: tuple[str, ...]
    unadjusted_reward: float


@dataclass(frozen=True)
class FailureRow:
    run_id: str
    round: int
    node_id: str | None
    reason: str
    participant: str | None = None


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
    package_version: str = ""
    settings: dict = field(default_factory=dict)
    layout: tuple[tuple[str, tuple[int, ...]], ...] | None = None
    """(tensor name, shape) of every scored tensor, in the packer's order (None: not scored)."""
    task_sha256: str | None = None
    signs_kept: bool = False
    global_sha256: str | None = None
    prev_hash: str | None = None
    chain_hash: str | None = None
    """None in version 1-2 ledgers (no chain)."""
    undetermined: tuple[str, ...] | None = None
    """Participants paid with fewer than ``min_peers`` distinct peers (no majority that could outvote one
    deviator: their reward cannot tell who deviated); None in rounds recorded before the peer pool."""
    reference_sha256: str | None = None
    """SHA-256 of the trusted reference's packed sign words the round was scored against (``fl.reference``; kept
    in the signs store when the run keeps signs, so ``kfca-llm verify`` recomputes the round); None: no reference."""
    public_sha256: str | None = None
    """SHA-256 of the public strata's packed planes the round was scored within (``engine.public``: ``public_steps``
    sign planes, then the magnitude planes; kept in the signs store when the run keeps signs); None: unconditioned."""
    public_steps: int | None = None
    """How many sign planes the planes hold (fewer than the setting early in a run; before ``public_spans`` also the
    doubling spans ``1, 2, 4, ...`` they cover); None: unconditioned."""
    public_spans: tuple[int, ...] | None = None
    """The span of each sign plane (the global's newest steps summed; ``engine.public.public_spans``: the doubling
    spans and the participants' reception gaps), ``public_steps`` of them; None: unconditioned, or recorded before
    the spans were."""
    values_sha256: str | None = None
    """SHA-256 of the participants' value sketches (``fl.pool_values``, stored as ``sketches_bytes``: kept in
    the signs store when the run keeps signs): what a verifier judges own replays on (pool rule 11); None: recorded
    without them."""


@dataclass(frozen=True)
class RunRow:
    run_id: str
    started_at: str
    strategy: str
    package_version: str
    settings: dict
    keep_signs: bool
    receipt_key: str | None = None
    """Hex of the raw Ed25519 public key that signs this run's receipts (None: no receipts)."""


@dataclass(frozen=True)
class Participant:
    participant: str
    label: str | None
    key_fingerprint: str | None
    first_run: str
    first_round: int
    first_node_id: str
    first_seen_at: str


@dataclass(frozen=True)
class LedgerContents:
    """Every row of a ledger, in the order they were written."""

    rewards: list[RewardRow]
    failures: list[FailureRow]
    rounds: list[RoundRow]
    runs: list[RunRow] = field(default_factory=list)
    participants: list[Participant] = field(default_factory=list)
    schema_version: int = SCHEMA_VERSION
    bad_rows: list[str] = field(default_factory=list)
    """Rows left out because a cell is not of its field's type, one line each (table, rowid, column, why)."""
    settlements: list[SettlementRow] = field(default_factory=list)

    def paid(self) -> list[tuple[RewardRow, float]]:
        """Each reward row with what it pays: its settlement's reward where a later round settled it, else its own."""
        settled = {(s.run_id, s.round, s.participant): s.reward for s in self.settlements}
        return [(row, settled.get((row.run_id, row.round, row.participant), row.reward)) for row in self.rewards]

    def totals(self) -> dict[str, float]:
        """Total reward per participant over every run and round, settlements included (sorted by identity)."""
        out: dict[str, float] = {}
        for row, reward in self.paid():
            out[row.participant] = out.get(row.participant, 0.0) + reward
        return dict(sorted(out.items()))


@dataclass(frozen=True)
class RoundEntry:
    """One round as the strategy hands it to ``Ledger.record_round``."""

    round: int
    seed: int
    settings: Mapping[str, Any]
    valid_replies: int
    categorical_world: bool | None
    rewards: Sequence[RewardRow]
    failures: Sequence[FailureRow]
    layout: Sequence[tuple[str, tuple[int, ...]]] | None = None
    task_sha256: str | None = None
    signs: Mapping[str, bytes] | None = None
    """Content to keep, by SHA-256 (each participant's sign words and the task words); None: not kept."""
    global_arrays: tuple[str, bytes] | None = None
    """(SHA-256, safetensors bytes) of the arrays the round produced; None: the round produced none."""
    new_participants: Sequence[Participant] = ()
    undetermined: Sequence[str] | None = None
    reference_sha256: str | None = None
    """SHA-256 of the reference's sign words (its bytes in ``signs`` when kept); None: no reference."""
    public: tuple[str, int, tuple[int, ...]] | None = None
    """(SHA-256, sign planes, their spans) of the public strata's planes (their bytes in ``signs`` when kept); None:
    unconditioned."""
    settlements: Sequence[SettlementRow] = ()
    """Earlier undetermined rounds' participants this round settled (``fl.pool_settle``)."""
    values_sha256: str | None = None
    """SHA-256 of the participants' value sketches (their bytes in ``signs`` when kept); None: none."""


def canonical_json(value: Any) -> str:
    """JSON with sorted keys and no spaces: the bytes the chain hashes (floats round-trip exactly)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False)


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def chain_hash(prev_hash: str, round_row: RoundRow, rewards: Sequence[RewardRow], failures: Sequence[FailureRow],
               run: RunRow | None = None, participants: Sequence[Participant] | None = None,
               settlements: Sequence[SettlementRow] = ()) -> str:
    """SHA-256 over the previous round's hash and every field of this round, its rewards and failures, and
    (schema 4) of its run's row, the participants first seen in it (None: a version 3 chain) and the settlements it
    made (hashed only where there are some: rounds before settlements keep their hash)."""
    # A field added later is hashed only where it is recorded: rounds written before it keep their hash.
    body = {"round": {f.name: getattr(round_row, f.name) for f in fields(RoundRow)
                      if f.name not in ("prev_hash", "chain_hash")
                      and not (f.name in _ADDED_ROUND_FIELDS and getattr(round_row, f.name) is None)},
            "rewards": [_plain(r) for r in sorted(rewards, key=lambda r: r.participant)],
            "failures": [_plain(f) for f in failures]}
    if run is not None:
        body["run"] = _plain(run)
    if participants is not None:
        body["participants"] = [_plain(p) for p in sorted(participants, key=lambda p: p.participant)]
    if settlements:
        body["settlements"] = [_plain(t) for t in sorted(settlements, key=lambda t: (t.round, t.participant))]
    return sha256_hex((prev_hash + canonical_json(body)).encode())


ADDED_ROUND_COLUMNS = {"undetermined": "TEXT", "reference_sha256": "TEXT", "public_sha256": "TEXT",
                       "public_steps": "INTEGER", "public_spans": "TEXT", "values_sha256": "TEXT"}
"""Columns of ``rounds`` added to schema 4 after it was first written, with their SQL types: a ledger may lack them
(read as None), the chain hashes them only where recorded."""
_ADDED_ROUND_FIELDS = tuple(ADDED_ROUND_COLUMNS)


def chain_hasher(contents: LedgerContents):
    """``hash_round(round_row, prev_hash)``: the chain hash a round must have, from the rows ``contents`` holds
    for it (its rewards and failures; schema 4: its run's row and the participants first seen in it)."""
    rewards: dict[tuple[str, int], list[RewardRow]] = {}
    failures: dict[tuple[str, int], list[FailureRow]] = {}
    first_seen: dict[tuple[str, int], list[Participant]] = {}
    for r in contents.rewards:
        rewards.setdefault((r.run_id, r.round), []).append(r)
    for f in contents.failures:
        failures.setdefault((f.run_id, f.round), []).append(f)
    for p in contents.participants:
        first_seen.setdefault((p.first_run, p.first_round), []).append(p)
    settled: dict[tuple[str, int], list[SettlementRow]] = {}
    for t in contents.settlements:
        settled.setdefault((t.run_id, t.settled_in), []).append(t)
    runs = {r.run_id: r for r in contents.runs}
    full = contents.schema_version >= FULL_CHAIN_VERSION

    def hash_round(round_row: RoundRow, prev_hash: str) -> str:
        key = (round_row.run_id, round_row.round)
        if not full:
            return chain_hash(prev_hash, round_row, rewards.get(key, []), failures.get(key, []))
        if round_row.run_id not in runs:  # its run's row is gone: nothing it could hash to
            return ""
        return chain_hash(prev_hash, round_row, rewards.get(key, []), failures.get(key, []), runs[round_row.run_id],
                          first_seen.get(key, []), settled.get(key, []))

    return hash_round


def _plain(row) -> dict:
    return {f.name: getattr(row, f.name) for f in fields(row)}


DISTINGUISHABLE_Z = 1.96
"""A balance is distinguishable from zero when its mean is this many standard errors away (two-sided 5%)."""


def ledger_summary(contents: LedgerContents) -> list[dict]:
    """Per participant: label, the node ids it used, total reward, rounds paid, mean per paid round, the mean's
    standard error (sample standard deviation / sqrt(rounds); None below 2 rounds), whether the mean lies
    ``DISTINGUISHABLE_Z`` standard errors from zero (None below 2 rounds), the rounds that were undetermined
    (``RoundRow.undetermined``) and, of those, the ones a later round settled (``SettlementRow``); a settled round
    counts with its settled reward."""
    paid: dict[str, list[float]] = {}
    nodes: dict[str, list[str]] = {}
    undetermined = {(r.run_id, r.round): set(r.undetermined or ()) for r in contents.rounds}
    settled_keys = {(s.run_id, s.round, s.participant) for s in contents.settlements}
    unsure: dict[str, int] = {}
    settled: dict[str, int] = {}
    for row, reward in contents.paid():
        paid.setdefault(row.participant, []).append(reward)
        used = nodes.setdefault(row.participant, [])
        if row.node_id not in used:
            used.append(row.node_id)
        if row.participant in undetermined.get((row.run_id, row.round), ()):
            unsure[row.participant] = unsure.get(row.participant, 0) + 1
            if (row.run_id, row.round, row.participant) in settled_keys:
                settled[row.participant] = settled.get(row.participant, 0) + 1
    labels = {p.participant: p.label for p in contents.participants}
    out = []
    for who, total in contents.totals().items():
        values = paid[who]
        n, mean = len(values), total / len(values)
        se = None
        if n >= 2:
            variance = sum((v - mean) ** 2 for v in values) / (n - 1)
            se = (variance / n) ** 0.5
        distinguishable = None if se is None else (abs(mean) > DISTINGUISHABLE_Z * se if se > 0 else mean != 0)
        out.append({"participant": who, "label": labels.get(who), "node_ids": nodes[who], "total": total,
                    "rounds": n, "mean": mean, "std_error": se, "distinguishable_from_zero": distinguishable,
                    "undetermined_rounds": unsure.get(who, 0), "settled_rounds": settled.get(who, 0)})
    return out
