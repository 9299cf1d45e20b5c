"""A training reply as ``KFCAStrategy`` reads it: whether it can be scored and aggregated, whose it is, its weight, its
update packed.

Reply contents are untrusted: every check returns why a reply is refused (one line), never raises on what a node
sent. ``declare_participant`` is the ClientApp's side: the participant name a reply declares (``identity.py``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict

from ..errors import InputError
from ..fl.pool_values import value_sketch
from ..packer import SignPacker
from ..tensors import is_float
from ..text import quoted
from .identity import (IDENTITY_RECORD, PARTICIPANT_KEY, Claim, Identity, check_participant_name, pinned_conflict,
                       resolve)
from .ledger_rows import Participant


def declare_participant(content: RecordDict, node_config: Mapping) -> RecordDict:
    """Add the node config's ``participant`` (if any) to a reply's content, for ``identity`` declared/auto."""
    name = node_config.get(PARTICIPANT_KEY)
    if name is not None:
        content[IDENTITY_RECORD] = ConfigRecord({PARTICIPANT_KEY: check_participant_name(name)})
    return content


def sent_arrays(sent: Mapping[int, ArrayRecord], node_id: int,
                sent_numpy: dict[int, dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """The arrays ``node_id`` was sent, as numpy (``sent_numpy`` keeps them per distinct sent record)."""
    record = sent[node_id]
    if id(record) not in sent_numpy:
        sent_numpy[id(record)] = {name: array.numpy() for name, array in record.items()}
    return sent_numpy[id(record)]


def packed_updates(paid: Mapping[str, Message], sent: Mapping[int, ArrayRecord],
                   sent_numpy: dict[int, dict[str, np.ndarray]], shapes: Mapping[str, tuple[int, ...]],
                   arrayrecord_key: str, backend: str, sketch_values: bool) -> tuple[SignPacker, dict[str, np.ndarray]]:
    """Each checked reply's update (returned minus sent, the float tensors ``shapes`` names) packed into a
    ``SignPacker`` of the ``paid`` participants, and with ``sketch_values`` each one's value sketch (what tells an own
    replay from a retrain, pool rule 11: ``fl.pool_values``)."""
    packer = SignPacker(dict(shapes), list(paid), backend=backend)
    values = {}
    for participant, reply in paid.items():
        given = sent_arrays(sent, reply.metadata.src_node_id, sent_numpy)
        returned = {name: array.numpy() for name, array in reply.content.array_records[arrayrecord_key].items()
                    if name in shapes}
        # Deserialised again (the check pass kept nothing): one participant's update in memory at a time, packed as
        # one batch.
        update = {name: returned[name] - given[name] for name in shapes}
        packer.add_many(participant, update)
        if sketch_values:
            values[participant] = value_sketch(update, packer.layout, given, returned)
    return packer, values


class EveryNodeFailed(InputError):
    """Every node of a round replied with an error (its ClientApp raised): a setting no node can run with
    (``kfca.attackers`` naming a client the federation lacks, say) or a broken environment. Every later round
    would fail the same way and end "0 results": the run stops, and Flower marks it failed."""


def stop_if_every_node_failed(server_round: int, replies: list[Message]) -> None:
    """Raise ``EveryNodeFailed`` with the first node's error when every reply of the round is an error."""
    if replies and all(reply.has_error() for reply in replies):
        reason = " ".join(replies[0].error.reason.split())
        raise EveryNodeFailed(f"round {server_round}: all {len(replies)} nodes replied with an error, so the run "
                              f"stops; the first: {quoted(reason, 500)}")


def check_reply(reply: Message, node: str, valid: Mapping[str, Message], sent: Mapping[int, ArrayRecord],
                sent_numpy: dict[int, dict[str, np.ndarray]], arrayrecord_key: str,
                weighted_by_key: str | None) -> str | None:
    """Why a reply cannot be scored or aggregated (None: it can). Reply contents are untrusted."""
    if reply.has_error():
        return f"the node replied with an error (code {reply.error.code}): {reply.error.reason}"
    if reply.metadata.src_node_id not in sent:
        return "reply from a node that was not sent a training message this round"
    if node in valid:
        return "more than one reply from this node"
    if not reply.has_content():
        return "reply has no content"
    content = reply.content
    records = sorted(content.array_records)
    if arrayrecord_key not in content.array_records:
        return f"no ArrayRecord under {arrayrecord_key!r} (found {records})"
    if len(records) != 1:
        return f"expected one ArrayRecord, found {records}"
    reason = check_metrics(content, weighted_by_key)
    if reason is not None:
        return reason
    expected_arrays = sent_arrays(sent, reply.metadata.src_node_id, sent_numpy)
    returned = content.array_records[arrayrecord_key]
    missing, extra = sorted(set(expected_arrays) - set(returned)), sorted(set(returned) - set(expected_arrays))
    if missing:
        return f"arrays missing from the reply: {missing[:5]}{' ...' if len(missing) > 5 else ''}"
    if extra:
        return f"arrays the node was not sent: {extra[:5]}{' ...' if len(extra) > 5 else ''}"
    for name, expected in expected_arrays.items():
        try:
            array = returned[name].numpy()
        except Exception as exc:  # untrusted bytes: any parse failure is a bad reply, not a crash
            return f"array {name!r} cannot be read as a numpy array: {exc}"
        if array.shape != expected.shape:
            return f"array {name!r}: shape {array.shape} differs from the sent shape {expected.shape}"
        if is_float(expected) and not is_float(array):
            return f"array {name!r}: dtype {array.dtype} is not a floating-point type"
        if array.dtype != expected.dtype:
            return f"array {name!r}: dtype {array.dtype} differs from the sent dtype {expected.dtype}"
        if is_float(array) and not np.isfinite(array).all():
            return f"array {name!r} holds NaN or Inf values"
    return None


def check_metrics(content: RecordDict, weighted_by_key: str | None) -> str | None:
    """Why a reply's metrics cannot weigh it in the wrapped strategy (None: they can, or it weighs by no key)."""
    if weighted_by_key is None:
        return None
    metric_records = list(content.metric_records.values())
    if len(metric_records) != 1:
        return f"expected one MetricRecord, found {len(metric_records)}"
    weight = metric_records[0].get(weighted_by_key)
    if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight) or weight < 0:
        return f"metric {weighted_by_key!r} must be a finite number >= 0, got {weight!r}"
    return None


def reply_claim(claims: Mapping[int, Claim], node: str, reply: Message) -> Claim:
    """The grid's record of the node, with the participant name its reply declares (validated)."""
    claim = claims.get(reply.metadata.src_node_id, Claim(node))
    record = reply.content.config_records.get(IDENTITY_RECORD)
    declared = None if record is None else check_participant_name(record.get(PARTICIPANT_KEY))
    return Claim(claim.node_id, claim.public_key, claim.registered_name, declared)


def identify(valid: Mapping[str, Message], claims: Mapping[int, Claim], mode: str, pins: Mapping[str, Participant],
             last_node: Mapping[str, str]) -> tuple[dict[str, Identity], list[tuple[str, str]]]:
    """Each valid reply's participant; refused replies with the reason (untrusted claims never crash).

    ``pins``: the participants the ledger knows; ``last_node``: the node each participant was last paid from."""
    identities: dict[str, Identity] = {}
    refused: list[tuple[str, str]] = []
    labels = {p.label: p.participant for p in pins.values() if p.label and p.participant.startswith("key:")}
    for node, reply in valid.items():
        try:
            identity = resolve(reply_claim(claims, node, reply), mode)
        except InputError as exc:
            refused.append((node, f"no participant identity: {exc}"))
            continue
        conflict = pinned_conflict(identity, labels)
        if conflict is not None:
            refused.append((node, conflict))
            continue
        identities[node] = identity
    by_participant: dict[str, list[str]] = {}
    for node, identity in identities.items():
        by_participant.setdefault(identity.participant, []).append(node)
    for participant, nodes in by_participant.items():
        if len(nodes) < 2:
            continue
        # The node the participant was last paid from keeps it (a restart that overlaps its old
        # process); otherwise the first reply received.
        last = last_node.get(participant)
        keep = last if last in nodes else nodes[0]
        for node in nodes:
            if node != keep:
                del identities[node]
                refused.append((node, f"participant {participant} already replied this round from node {keep}; "
                                      "a second live node claiming it is refused"))
    return identities, refused


def reply_weight(reply: Message, weighted_by_key: str | None) -> float:
    """A reply's weight in the wrapped strategy (1 where it weighs replies by no key)."""
    if weighted_by_key is None:
        return 1.0
    (metrics,) = reply.content.metric_records.values()  # check_metrics: exactly one
    return float(metrics[weighted_by_key])


def reweighted(reply: Message, weighted_by_key: str, weight: float) -> Message:
    """The reply with ``weight`` under the wrapped strategy's weight key."""
    content = RecordDict(dict(reply.content.items()))
    (name, metrics), = content.metric_records.items()
    scaled = MetricRecord(dict(metrics.items()))
    scaled[weighted_by_key] = weight
    content[name] = scaled
    return Message(content=content, metadata=reply.metadata)


def num_examples(reply: Message, weighted_by_key: str | None) -> int | None:
    """The examples a reply reports under the weight key (else ``num-examples``); None: no integer there."""
    key = weighted_by_key or "num-examples"
    for metrics in reply.content.metric_records.values():
        value = metrics.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
    return None
