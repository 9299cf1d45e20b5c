"""Signed receipts: what the server paid a participant in a round, which the operator cannot rewrite later.

The ledger's hash chain is unkeyed: whoever can write the ledger can edit a row and recompute every hash
after it. A receipt fixes the history at the time it was paid: the server signs, for every reward row, the
round, the participant, its reward, the SHA-256 of the signs it was scored on and the round's chain hash (and, for
a later round's settlement of an undetermined round, the settled round, the settling round, the settled reward and
the settling round's chain hash),
with an Ed25519 key whose public half the operator publishes (``<key>.pub``). ``KFCAStrategy(receipt_key=
PATH)`` signs them and sends each participant its receipts in the next message to its node (the evaluate
round's, or the next round's training message; ``RECEIPTS_RECORD``); a node keeps them with
``save_receipts`` (the recipes' ClientApp does, to its node config's ``receipts-dir``). ``check_receipts``
(``kfca-llm verify LEDGER --receipts DIR --server-key KEY.pub``) checks a ledger against them: a receipt
whose round hashes differently in the ledger, or whose row is gone or changed, is a forged history.

Receipt files are JSON ``{"receipt": {...}, "signature": "<hex>"}`` named by their own SHA-256.
``cryptography`` (a Flower dependency) signs and checks them; it is imported only here.
"""

from __future__ import annotations

import json
import os
import re
import stat
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from ..errors import InputError
from .ledger_rows import LedgerContents, RewardRow, SettlementRow, canonical_json, sha256_hex

RECEIPTS_RECORD = "kfca.receipts"
"""The ``ConfigRecord`` of a train or evaluate message that carries the node's receipts (key ``receipts``)."""
RECEIPTS_DIR_KEY = "receipts-dir"
"""The node-config key of the folder where the recipes' ClientApp keeps its receipts."""
RECEIPT_VERSION = 1
MAX_RECEIPT_BYTES = 64 * 1024
MAX_RECEIPTS = 100_000
_HEX64 = re.compile(r"[0-9a-f]{64}")
_FIELDS = {"version": int, "run_id": str, "round": int, "participant": str, "node_id": str, "reward": float,
           "unadjusted_reward": float, "sign_sha256": str, "chain_hash": str, "server_key": str}
SETTLEMENT = "settlement"
_SETTLEMENT_FIELDS = {"version": int, "kind": str, "run_id": str, "round": int, "settled_in": int, "participant": str,
                      "reward": float, "unadjusted_reward": float, "chain_hash": str, "server_key": str}
"""A settlement's receipt (``kind`` ``settlement``): the pay of an earlier, undetermined ``round``, made by the round
``settled_in``, whose chain hash it carries."""


def _crypto():
    try:
        from cryptography.exceptions import InvalidSignature
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
    except ImportError:
        raise InputError("receipts need the `cryptography` package (pip install cryptography; the flower extra "
                         "of kfca-llm brings it)") from None
    return InvalidSignature, serialization, Ed25519PrivateKey, Ed25519PublicKey


def public_hex(public_key) -> str:
    """The raw 32-byte Ed25519 public key as 64 hex digits (how the ledger and every receipt name it)."""
    _, serialization, _, _ = _crypto()
    return public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw).hex()


def load_or_create_server_key(path: str | os.PathLike):
    """The server's Ed25519 private key from a PEM file, created (mode 0600) with its public half beside it
    (``PATH.pub``, PEM: the file to publish) when ``path`` does not exist."""
    _, serialization, Ed25519PrivateKey, _ = _crypto()
    path = Path(path)
    if not path.exists():
        key = Ed25519PrivateKey.generate()
        pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)  # never readable by others, not even briefly
        with os.fdopen(fd, "wb") as handle:
            handle.write(pem)
        public = key.public_key().public_bytes(serialization.Encoding.PEM,
                                               serialization.PublicFormat.SubjectPublicKeyInfo)
        Path(f"{path}.pub").write_bytes(public)
        return key
    if not path.is_file():
        raise InputError(f"server key {str(path)!r} is not a regular file")
    try:
        key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    except (ValueError, TypeError) as exc:
        raise InputError(f"server key {str(path)!r} is not an unencrypted PEM private key: {exc}") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise InputError(f"server key {str(path)!r} is not an Ed25519 key")
    return key


def read_public_key(spec: str | os.PathLike):
    """A published server key: a PEM public key file (``<key>.pub``), or its 64 hex digits."""
    _, serialization, _, Ed25519PublicKey = _crypto()
    text = str(spec)
    if _HEX64.fullmatch(text.lower()):
        return Ed25519PublicKey.from_public_bytes(bytes.fromhex(text))
    path = Path(spec)
    if not path.is_file() or path.stat().st_size > MAX_RECEIPT_BYTES:
        raise InputError(f"server key {text!r} is neither 64 hex digits nor a PEM public key file")
    try:
        key = serialization.load_pem_public_key(path.read_bytes())
    except (ValueError, TypeError) as exc:
        raise InputError(f"server key {text!r} is not a PEM public key: {exc}") from None
    if not isinstance(key, Ed25519PublicKey):
        raise InputError(f"server key {text!r} is not an Ed25519 public key")
    return key


def make_receipt(private_key, row: RewardRow | SettlementRow, chain_hash: str) -> str:
    """One participant's signed receipt for one round, or for a later round's settlement of it (JSON text)."""
    if isinstance(row, SettlementRow):
        body = {"version": RECEIPT_VERSION, "kind": SETTLEMENT, "run_id": row.run_id, "round": row.round,
                "settled_in": row.settled_in, "participant": row.participant, "reward": row.reward,
                "unadjusted_reward": row.unadjusted_reward, "chain_hash": chain_hash,
                "server_key": public_hex(private_key.public_key())}
    else:
        body = {"version": RECEIPT_VERSION, "run_id": row.run_id, "round": row.round, "participant": row.participant,
                "node_id": row.node_id, "reward": row.reward, "unadjusted_reward": row.unadjusted_reward,
                "sign_sha256": row.sign_sha256, "chain_hash": chain_hash,
                "server_key": public_hex(private_key.public_key())}
    signature = private_key.sign(canonical_json(body).encode()).hex()
    return canonical_json({"receipt": body, "signature": signature})


def _parse(text: str | bytes) -> tuple[dict, bytes]:
    """(body, signature) of a receipt's JSON; ValueError says what is malformed."""
    try:
        item = json.loads(text)
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None
    except ValueError as exc:
        raise ValueError(f"not JSON ({str(exc)[:80]})") from None
    if not isinstance(item, dict) or set(item) != {"receipt", "signature"} or not isinstance(item["receipt"], dict):
        raise ValueError("not a receipt (keys 'receipt' and 'signature')")
    body, signature = item["receipt"], item["signature"]
    fields = _SETTLEMENT_FIELDS if body.get("kind") == SETTLEMENT else _FIELDS
    if set(body) != set(fields):
        raise ValueError(f"receipt fields {sorted(body)[:12]} are not {sorted(fields)}")
    for name, kind in fields.items():
        value = body[name]
        ok = isinstance(value, (int, float) if kind is float else kind) and not isinstance(value, bool)
        if not ok:
            raise ValueError(f"receipt field {name!r} is not a {kind.__name__}")
    if not isinstance(signature, str) or not re.fullmatch(r"[0-9a-f]{128}", signature):
        raise ValueError("the signature is not 128 hex digits")
    return body, bytes.fromhex(signature)


def receipts_in_message(config_records: Mapping) -> list[str]:
    """The receipt texts a train or evaluate message carries (``RECEIPTS_RECORD``); [] when none."""
    record = config_records.get(RECEIPTS_RECORD)
    texts = [] if record is None else record.get("receipts", [])
    return [t for t in (texts if isinstance(texts, list) else []) if isinstance(t, str)]


def save_receipts(texts: Iterable[str], folder: str | os.PathLike) -> list[Path]:
    """Keep well-formed receipts in ``folder`` (``<sha256>.json``, written atomically); malformed ones are
    skipped (the server's messages are checked, not trusted). Returns the files written or already there."""
    from ..report import write_atomic

    out = []
    for text in texts:
        if len(text) > MAX_RECEIPT_BYTES:
            continue
        try:
            _parse(text)
        except ValueError:
            continue
        path = Path(folder) / f"{sha256_hex(text.encode())}.json"
        if not path.is_file():
            write_atomic(path, text)
        out.append(path)
    return out


def _receipt_files(folder: Path) -> tuple[list[tuple[Path, bytes]], list[str]]:
    if not folder.is_dir():
        raise InputError(f"receipts folder {str(folder)!r} is not a directory")
    files, problems = [], []
    for path in sorted(folder.iterdir())[:MAX_RECEIPTS]:
        if path.suffix != ".json":
            continue
        info = os.lstat(path)
        if not stat.S_ISREG(info.st_mode):
            problems.append(f"{path.name}: not a regular file (not read)")
        elif info.st_size > MAX_RECEIPT_BYTES:
            problems.append(f"{path.name}: {info.st_size} bytes, larger than any receipt (not read)")
        else:
            files.append((path, path.read_bytes()))
    if not files and not problems:
        raise InputError(f"no receipt files (*.json) in {str(folder)!r}")
    return files, problems


def check_receipts(contents: LedgerContents, folder: str | os.PathLike, public_key) -> tuple[list[str], int]:
    """(problems, receipts checked): every receipt in ``folder`` must verify with ``public_key`` and be in the
    ledger as signed: its round with the same chain hash, its row with the same reward and signs."""
    InvalidSignature, _, _, _ = _crypto()
    key_hex = public_hex(public_key)
    rounds = {(r.run_id, r.round): r for r in contents.rounds}
    rows = {(r.run_id, r.round, r.participant): r for r in contents.rewards}
    settled = {(r.run_id, r.round, r.participant): r for r in contents.settlements}
    files, problems = _receipt_files(Path(folder))
    problems += [f"run {r.run_id[:8]}: the ledger says its receipts were signed with the key {r.receipt_key[:16]}..., "
                 f"not the key given ({key_hex[:16]}...)" for r in contents.runs
                 if r.receipt_key is not None and r.receipt_key != key_hex]
    checked = 0
    for path, data in files:
        try:
            body, signature = _parse(data)
        except ValueError as exc:
            problems.append(f"{path.name}: {exc}")
            continue
        try:
            public_key.verify(signature, canonical_json(body).encode())
        except InvalidSignature:
            problems.append(f"{path.name}: the signature does not verify with the server key {key_hex[:16]}... "
                            f"(signed by another key, or altered)")
            continue
        checked += 1
        settlement = body.get("kind") == SETTLEMENT
        where = (f"{path.name[:16]}...: run {body['run_id'][:8]} round {body['round']}"
                 + (f" settled in round {body['settled_in']}" if settlement else "") + f" ({body['participant'][:40]})")
        round_row = rounds.get((body["run_id"], body["settled_in"] if settlement else body["round"]))
        if round_row is None:
            problems.append(f"{where}: the ledger has no such round (deleted)")
            continue
        if round_row.chain_hash != body["chain_hash"]:
            problems.append(f"{where}: the ledger's round hashes to {str(round_row.chain_hash)[:16]}..., the signed "
                            f"receipt to {body['chain_hash'][:16]}... (the round was rewritten after it was paid)")
        if settlement:
            row = settled.get((body["run_id"], body["round"], body["participant"]))
            if row is None:
                problems.append(f"{where}: the ledger has no settlement for this participant (deleted or relabelled)")
                continue
            signed = (body["reward"], body["unadjusted_reward"], body["settled_in"])
            stored = (row.reward, row.unadjusted_reward, row.settled_in)
            problems += [f"{where}: {n} is {s!r} in the ledger, {r!r} in the signed receipt"
                         for n, s, r in zip(("reward", "unadjusted_reward", "settled_in"), stored, signed) if s != r]
            continue
        row = rows.get((body["run_id"], body["round"], body["participant"]))
        if row is None:
            problems.append(f"{where}: the ledger has no reward row for this participant (deleted or relabelled)")
            continue
        signed = (body["reward"], body["unadjusted_reward"], body["sign_sha256"], body["node_id"])
        stored = (row.reward, row.unadjusted_reward, row.sign_sha256, row.node_id)
        names = ("reward", "unadjusted_reward", "sign_sha256", "node_id")
        problems += [f"{where}: {n} is {s!r} in the ledger, {r!r} in the signed receipt"
                     for n, s, r in zip(names, stored, signed) if s != r]
    return problems, checked


class ReceiptPost:
    """The server side: receipts due per participant, attached to its node's next messages until it replies."""

    def __init__(self, private_key):
        self.key = private_key
        self.due: dict[str, list[str]] = {}
        """Participant -> receipts not yet in a message its node replied to."""
        self._attached: dict[int, list[str]] = {}

    def issue(self, rows: Iterable[RewardRow | SettlementRow], chain_hash: str) -> None:
        for row in rows:
            self.due.setdefault(row.participant, []).append(make_receipt(self.key, row, chain_hash))

    def attach(self, messages: Sequence, last_node: Mapping[str, str]) -> list:
        """``messages`` (Flower instructions), each to a node whose participant (``last_node``: participant ->
        the node id it was last paid from) has receipts due carrying them in ``RECEIPTS_RECORD``."""
        from flwr.app import ConfigRecord, RecordDict

        participant_of = {node: participant for participant, node in last_node.items()}
        for message in messages:
            due = self.due.get(participant_of.get(str(message.metadata.dst_node_id)), [])
            if due and message.has_content():
                content = RecordDict(dict(message.content.items()))  # a strategy may share one content
                content[RECEIPTS_RECORD] = ConfigRecord({"receipts": list(due)})
                message.content = content
                self._attached[message.metadata.dst_node_id] = list(due)
        return list(messages)

    def delivered(self, replies: Iterable) -> None:
        """A node that replied received its message: the receipts it carried are no longer due."""
        for reply in replies:
            sent = set(self._attached.pop(reply.metadata.src_node_id, ()))
            for participant in [p for p, due in self.due.items() if sent & set(due)]:
                kept = [r for r in self.due[participant] if r not in sent]
                if kept:
                    self.due[participant] = kept
                else:
                    del self.due[participant]
