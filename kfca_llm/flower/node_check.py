"""A participant's own check of a ledger: the update it holds is the one scored (its signs), and the round recorded
its values as that update has them (pool rule 11's value sketch).

The ledger's recomputation (``audit.verify_ledger``) rebuilds every round from what the ledger recorded; it cannot
tell whether a recorded sketch is the participant's. A sketch is what tells an honest retrain that repeats every sign
from a replay of the earlier update (``fl.pool_values``): a server, or whoever rewrote the ledger, that recorded the
earlier update's values in the new one's place, or widened their rounding slack, charges an honest participant back as
its own resubmission, and the recomputation agrees. Only the participant holds what its values were, so only its
check can see it. With the global it was sent it checks the slack too (the spacing of the larger of the global and
the returned model at each sampled coordinate, as the server computed it): the slack is what lets values that differ
pass as one replay's.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..engine.layout import Layout
from ..errors import InputError
from ..fl.pool_values import value_sketch
from .audit import update_sha256
from .ledger import read_ledger
from .ledger_rows import RewardRow, RoundRow
from .pool_replay import Damaged, recorded_values
from .recompute import read_stored

VALUES_MATCH = "match"
VALUES_DIFFER = "differ"
VALUES_NOT_RECORDED = "not recorded"
VALUES_DAMAGED = "damaged"

SLACK_MARGIN = 2.0
"""How much wider than the participant's own estimate a recorded slack may be: the returned model the participant
rebuilds as global + update can sit one binade below the one the server subtracted from (twice the spacing)."""


@dataclass(frozen=True)
class ValueCheck:
    """What a participant's check found of the value sketch its round recorded of it."""
    status: str
    """``VALUES_MATCH``, ``VALUES_DIFFER`` (the recorded sketch is not this update's), ``VALUES_NOT_RECORDED`` (the
    round recorded no sketches, or did not keep them) or ``VALUES_DAMAGED`` (the stored sketches cannot be read)."""
    detail: str
    slack_checked: bool = False
    """Whether the recorded slack was checked against the global the participant was sent."""

    @property
    def ok(self) -> bool:
        return self.status in (VALUES_MATCH, VALUES_NOT_RECORDED)


def check_node(path: str | os.PathLike, update: Mapping[str, np.ndarray], server_round: int,
               run_id: str | None = None, sent: Mapping[str, np.ndarray] | None = None
               ) -> list[tuple[RewardRow, ValueCheck]]:
    """The ledger rows of ``server_round`` whose sign hash is the one of ``update``, each with the check of the value
    sketch its round recorded of its participant (``values_check``); the ledger is read once."""
    contents = read_ledger(path)
    rows = [r for r in contents.rewards if r.round == server_round and (run_id is None or r.run_id.startswith(run_id))]
    if not rows:
        raise InputError(f"the ledger has no scored round {server_round}" + (f" in run {run_id}" if run_id else ""))
    digest = update_sha256(update)
    round_of = {(r.run_id, r.round): r for r in contents.rounds}
    return [(row, values_check(path, round_of.get((row.run_id, row.round)), row.participant, update, sent))
            for row in rows if row.sign_sha256 == digest]


def values_check(path: str | os.PathLike, round_row: RoundRow | None, participant: str,
                 update: Mapping[str, np.ndarray], sent: Mapping[str, np.ndarray] | None = None) -> ValueCheck:
    """Whether the value sketch ``round_row`` recorded of ``participant`` (in the store beside ledger ``path``) is
    ``update``'s: every sampled value within the recorded rounding slack of this update's, and, given the global
    ``sent`` that round, no recorded slack wider than ``SLACK_MARGIN`` times the spacing this update and that global
    imply."""
    if round_row is None or round_row.values_sha256 is None:
        return ValueCheck(VALUES_NOT_RECORDED, "the round recorded no value sketches (its own replays were judged on "
                                               "the signs alone)")
    if not round_row.signs_kept:
        return ValueCheck(VALUES_NOT_RECORDED, "the round's value sketches were not kept (keep_signs=False)")
    try:
        layout = Layout.from_shapes(dict(round_row.layout or ()))
        recorded = recorded_values(round_row, [participant],
                                   lambda sha, rows=1, size=None: read_stored(path, sha, size)).get(participant)
    except (Damaged, InputError, TypeError, ValueError) as exc:  # a hostile layout or store: never a crash
        return ValueCheck(VALUES_DAMAGED, f"the round's value sketches cannot be read: {exc}")
    if recorded is None:
        return ValueCheck(VALUES_DAMAGED, f"the round's value sketches hold none of participant {participant}")
    update = _in_layout(update, layout, "update")
    returned = None
    if sent is not None:
        sent = _in_layout(sent, layout, "global sent")
        returned = {name: (sent[name] + update[name]).astype(update[name].dtype) for name in update}
    mine = value_sketch(update, layout, sent, returned)
    apart = int(np.sum(~(np.abs(recorded[0] - mine[0]) <= recorded[1])))
    samples = recorded.shape[1]
    if apart:
        return ValueCheck(VALUES_DIFFER, f"{apart} of {samples} sampled values differ from this update's by more "
                                         "than their recorded slack", sent is not None)
    if sent is None:
        return ValueCheck(VALUES_MATCH, f"{samples} sampled values within their recorded slack (the slack is not "
                                        "checked: give the global you were sent)")
    wide = int(np.sum(recorded[1] > SLACK_MARGIN * mine[1]))
    if wide:
        return ValueCheck(VALUES_DIFFER, f"{wide} of {samples} recorded slacks are wider than this update and the "
                                         "global it was sent allow", True)
    return ValueCheck(VALUES_MATCH, f"{samples} sampled values within their recorded slack, the slack as the global "
                                    "sent implies", True)


def _in_layout(arrays: Mapping[str, np.ndarray], layout: Layout, what: str) -> dict[str, np.ndarray]:
    """``arrays``' tensors of ``layout`` (float, its shapes), or an ``InputError`` naming the first that is not."""
    out = {}
    for slot in layout.slots:
        if slot.name not in arrays:
            raise InputError(f"the {what} has no tensor {slot.name!r}, which the round scored")
        array = np.asarray(arrays[slot.name])
        if array.shape != tuple(slot.shape) or not np.issubdtype(array.dtype, np.floating):
            raise InputError(f"the {what}'s tensor {slot.name!r} is {array.dtype} {array.shape}, the round scored "
                             f"a float tensor of shape {tuple(slot.shape)}")
        out[slot.name] = array
    return out


def load_update_file(path: str | os.PathLike, what: str = "update") -> dict[str, np.ndarray]:
    """A participant's arrays from a .safetensors or .npz file (no pickle): its update (what it sent minus what it was
    sent), or the global it was sent."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"no {what} file at {str(path)!r}")
    try:
        if path.suffix == ".npz":
            with np.load(path, allow_pickle=False) as data:
                return {k: data[k] for k in data.files}
        from safetensors.numpy import load_file

        return load_file(str(path))
    except (OSError, ValueError) as exc:
        raise InputError(f"cannot read the {what} {str(path)!r}: {exc}") from exc
    except Exception as exc:  # safetensors raises its own error type on a malformed header
        raise InputError(f"cannot read the {what} {str(path)!r}: {exc}") from exc
