"""Value sketches: what tells a replay of an update from an honest retrain whose signs are all the same (pool rule 11).

Under FlowerTune's static data order an honest client trains again on the same samples, and late in the schedule its
update can repeat an earlier one's signs bit for bit (Flower's own general-NLP app, rounds 57 and 58 of 60: the same
20 rows, a learning rate of about 1.3e-6, AdamW steps that follow the gradients' signs: ``benchmarks/ROBUSTNESS.md``).
Its values differ: another learning rate, other gradient magnitudes from a newer global. A replay repeats the values
too, up to the rounding of the round trip a Flower client makes (it returns ``global + update`` in the adapter's
dtype, and the server subtracts the global it sent): at most half a spacing of each round's global there.

So each submission keeps, beside its signs, ``VALUE_SAMPLES`` of its values at fixed coordinates spread over the
update, with the rounding slack of each (``value_sketch``: 0 where the update was given as it was computed, the
spacing of ``max(|global|, |returned|)`` in the returned dtype where it was recovered from a returned model). An own
match on every sign is a replay only where the values match too (``replays_values``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence

import numpy as np

from ..engine.layout import Layout

VALUE_SAMPLES = 1024
"""Coordinates a value sketch keeps (16 KiB a submission as float64 values and slack, run-long as the sign sketches:
a stale node replays its first update however old)."""


def value_samples(layout: Layout) -> int:
    """How many coordinates a sketch of ``layout`` samples: ``VALUE_SAMPLES``, or every coordinate of a smaller one."""
    return min(VALUE_SAMPLES, layout.n_coords)


def value_positions(layout: Layout) -> list[tuple[str, np.ndarray]]:
    """(tensor name, flat offsets) of the sampled coordinates: ``value_samples`` evenly spaced over the tensors in
    layout order (coordinate ``floor(j * numel / samples)`` for sample ``j``)."""
    sizes = [slot.numel for slot in layout.slots]
    total, samples = sum(sizes), value_samples(layout)
    positions = np.arange(samples, dtype=np.int64) * total // samples
    out, start = [], 0
    for slot, size in zip(layout.slots, sizes):
        inside = positions[(positions >= start) & (positions < start + size)]
        if inside.size:
            out.append((slot.name, inside - start))
        start += size
    return out


def _sampled(array, offsets: np.ndarray) -> np.ndarray:
    """float64 values of ``array`` (numpy or torch, any float dtype, any device) at flat ``offsets``."""
    if isinstance(array, np.ndarray):
        return np.asarray(array).reshape(-1)[offsets].astype(np.float64)
    import torch

    index = torch.as_tensor(offsets, device=array.device)
    return array.detach().reshape(-1).index_select(0, index).to(torch.float64).cpu().numpy()


def value_sketch(update: Mapping[str, object], layout: Layout, sent: Mapping[str, np.ndarray] | None = None,
                 returned: Mapping[str, np.ndarray] | None = None) -> np.ndarray:
    """The sketch of ``update`` (tensor name -> numpy or torch float tensor of ``layout``): float64 ``[2, samples]``,
    its values at ``value_positions`` and their rounding slack. ``sent`` / ``returned``: the global sent and the model
    returned the update was recovered from (``returned - sent``), numpy arrays: the slack is the spacing of the larger
    of the two in the returned dtype; without them the update is exact (slack 0)."""
    values, slack = [], []
    for name, offsets in value_positions(layout):
        values.append(_sampled(update[name], offsets))
        if sent is None or returned is None:
            slack.append(np.zeros(offsets.size))
        else:
            back = np.asarray(returned[name]).reshape(-1)[offsets]
            larger = np.maximum(np.abs(np.asarray(sent[name]).reshape(-1)[offsets].astype(back.dtype)), np.abs(back))
            slack.append(np.spacing(larger).astype(np.float64))
    return np.stack([np.concatenate(values), np.concatenate(slack)])


def share_apart(mine: np.ndarray, earlier: np.ndarray) -> float:
    """The fraction of the sampled coordinates at which two sketches of one layout differ by more than their two
    slacks (a round trip rounds each side by at most half its slack)."""
    return float(np.mean(~(np.abs(mine[0] - earlier[0]) <= mine[1] + earlier[1])))


def replays_values(mine: np.ndarray | None, earlier: np.ndarray | None) -> bool:
    """Whether a submission of sketch ``mine`` may be a replay of an earlier one of sketch ``earlier``: no sampled
    value apart (``share_apart``). A sketch missing on either side (a caller that gave none: the signs decide alone, as
    under pool rule 10): True; sketches of another layout: False."""
    if mine is None or earlier is None:
        return True
    return mine.shape == earlier.shape and share_apart(mine, earlier) == 0


def sketches_bytes(values: Mapping[str, np.ndarray]) -> bytes:
    """The stored form of a round's value sketches (a ledger's ``RoundRow.values_sha256`` hashes it): per participant
    in sorted order, the SHA-256 of its name (32 bytes) and its ``[2, samples]`` sketch as little-endian float64. Each
    sketch names its participant: a row a reader cannot take (a hostile cell) leaves the others' readable."""
    return b"".join(_name_key(p) + np.ascontiguousarray(values[p], dtype="<f8").tobytes() for p in sorted(values))


def sketches_size(count: int, samples: int) -> int:
    """The bytes ``sketches_bytes`` writes for ``count`` sketches of ``samples`` coordinates."""
    return count * (32 + 2 * samples * 8)


def sketches_from_bytes(data: bytes, participants: Sequence[str], count: int, samples: int) -> dict[str, np.ndarray]:
    """Participant -> its sketch among the ``count`` that ``sketches_bytes`` wrote into ``data`` (one of
    ``participants`` it holds none of has none); a ``ValueError`` where ``data`` cannot be them."""
    entry = sketches_size(1, samples)
    if len(data) != sketches_size(count, samples):
        raise ValueError(f"{len(data)} bytes, where {count} sketches of {samples} values take {count * entry}")
    stored = {}
    for k in range(count):
        key = data[k * entry:k * entry + 32]
        if key in stored:
            raise ValueError("one participant named twice")
        stored[key] = np.frombuffer(data[k * entry + 32:(k + 1) * entry], dtype="<f8").reshape(2, samples).astype(
            np.float64)
    return {p: stored[_name_key(p)] for p in participants if _name_key(p) in stored}


def _name_key(participant: str) -> bytes:
    return hashlib.sha256(participant.encode("utf-8", "surrogatepass")).digest()
