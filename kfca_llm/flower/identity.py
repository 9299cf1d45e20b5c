"""Participant identities: who is paid, stable across restarts of a SuperNode (Flower's node ids are not).

What a ServerApp sees of a node (Flower 1.42, ``flwr/serverapp/grid/grid.py``: ``Grid.get_nodes()`` ->
``flwr.proto.node_pb2.NodeInfo``): its ``node_id``, the ``public_key`` the SuperNode registered with
(PEM bytes), and the ``name`` given to ``flwr supernode register --name``. The key is an identity only
where the SuperLink authenticates SuperNodes (``flower-superlink --enable-supernode-auth``: the key was
registered by the operator with ``flwr supernode register`` and the node proves it holds the private key);
without that, a SuperNode makes a fresh key pair each time it starts (``flwr/supernode/
fleet_http_connection.py``), and so does the simulation engine for each node (``flwr/server/superlink/fleet/
vce/vce_api.py``). A node's config never reaches the ServerApp, so an identity declared there travels in
the node's reply: ``declare_participant`` adds it (``ConfigRecord`` ``kfca.identity``, key ``participant``).

Modes (``KFCAStrategy(identity=...)``, run config ``kfca.identity``):

* ``"public-key"``: the participant is ``key:<SHA-256 of the public key>``; a name the node declares (or
  the registered name) is its label, pinned to that key on first sight: another key declaring the same
  name later is refused. For SuperLinks with SuperNode authentication.
* ``"declared"``: the participant is ``name:<the declared name>``, pinned on first sight (the ledger keeps
  the run, round, node id and key it first came with). A reply declaring nothing is refused. Without
  SuperNode authentication a declaration cannot be checked: it keeps a restarted node's balance, and the
  rules below keep it from being paid twice, but any node may claim any name.
* ``"auto"`` (default): ``declared`` for replies that declare a name, ``public-key`` for the others
  (``node:<node id>`` where the grid reports no key: not stable across restarts).

In every mode a second live node claiming a participant already in the round is refused (recorded as a
failure, never paid): the node the participant was last paid from keeps it, else the first reply.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass

from ..errors import InputError

IDENTITY_MODES = ("auto", "public-key", "declared")
IDENTITY_RECORD = "kfca.identity"
"""The reply's ``ConfigRecord`` that carries a declared participant name."""
PARTICIPANT_KEY = "participant"
"""The node-config key (and the key in ``IDENTITY_RECORD``) of a declared participant name."""
MAX_NAME = 64


def check_identity_mode(mode: str) -> str:
    if not isinstance(mode, str) or mode not in IDENTITY_MODES:
        raise InputError(f"identity must be one of {IDENTITY_MODES}, got {mode!r}")
    return mode


def check_participant_name(name) -> str:
    """A declared participant name: 1-64 printable characters, no surrounding spaces."""
    if (not isinstance(name, str) or not 0 < len(name) <= MAX_NAME or name.strip() != name
            or not name.isprintable()):
        raise InputError(f"a participant name must be 1-{MAX_NAME} printable characters without surrounding "
                         f"spaces, got {name!r}"[:200])
    return name


def registered_label(name: str) -> str | None:
    """A name given to ``flwr supernode register --name`` as a label: kept when it would pass as a declared
    name, else written as printable escapes (cut to ``MAX_NAME``), so no CR, newline or escape code reaches
    the ledger, its CSV or a terminal; None for no name."""
    if not name:
        return None
    try:
        return check_participant_name(name)
    except InputError:
        escaped = "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in name).strip()
        return escaped[:MAX_NAME] or None


def key_fingerprint(public_key: bytes) -> str:
    return hashlib.sha256(public_key).hexdigest()


@dataclass(frozen=True)
class Claim:
    """Who a reply says it is: the node's registered key and name (from the grid), the declared name."""

    node_id: str
    public_key: bytes = b""
    registered_name: str = ""
    declared: str | None = None


@dataclass(frozen=True)
class Identity:
    participant: str
    label: str | None
    key_fingerprint: str | None


def resolve(claim: Claim, mode: str) -> Identity:
    """The participant a claim maps to under ``mode``; ``InputError`` says why it maps to none."""
    fingerprint = key_fingerprint(claim.public_key) if claim.public_key else None
    if mode == "declared" or (mode == "auto" and claim.declared is not None):
        if claim.declared is None:
            raise InputError(f"the reply declares no participant (node config {PARTICIPANT_KEY!r}, sent back in "
                             f"the reply's {IDENTITY_RECORD!r} record) and identity is 'declared'")
        return Identity(f"name:{claim.declared}", claim.declared, fingerprint)
    if fingerprint is None:
        if mode == "auto":  # a grid that reports no keys (older or custom grids): Flower's node id, not stable
            return Identity(f"node:{claim.node_id}", registered_label(claim.registered_name), None)
        raise InputError("the grid reports no public key for this node, so it has no identity under 'public-key' "
                         "(run the SuperLink with --enable-supernode-auth, or declare participants)")
    return Identity(f"key:{fingerprint}", registered_label(claim.registered_name) or claim.declared, fingerprint)


def pinned_conflict(identity: Identity, pinned_labels: Mapping[str, str]) -> str | None:
    """Why ``identity`` may not carry its label: the label is pinned to another key-based participant."""
    if not identity.participant.startswith("key:") or identity.label is None:
        return None
    owner = pinned_labels.get(identity.label)
    if owner is not None and owner != identity.participant:
        return (f"declares the name {identity.label!r}, pinned on first sight to {owner[:20]}...; "
                f"this node's key differs ({identity.participant[:20]}...)")
    return None
