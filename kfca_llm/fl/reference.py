"""A trusted reference: the server's own update on a small clean data set, scored as a peer of every participant.

Where an operator holds a small clean data set (FLTrust's root set, 100-500 examples), the server trains on it
from the round's global each round; that update's sign bits join the round as one more peer of every
participant, with weight ``reference_weight`` among the peers (an in-round peer's is 1, a pool peer's
``PoolSettings.weight`` at most). The reference is never paid, never aggregated and never enters the peer
pool; its bits are read on the round's task mask (as a pool entry's are), so the round's own counts, task
partition and copy detection are those of the round without it. A round with a reference (weight > 0) is
never undetermined: one trusted peer tells an honest participant from a deviator at any round size.
The weighting itself is ``fl.peer_pool.score_with_pool``'s (one implementation for simulate and Flower).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from ..engine.layout import FlatUpdate
from ..errors import InputError
from ..packer import SignPacker

REFERENCE = "(reference)"
"""The reference's peer name in reports and the ledger's ``peers`` column (never a participant id: parentheses)."""

DEFAULT_REFERENCE_WEIGHT = 4.0
"""A trusted peer outweighs an in-round deviator at FlowerTune's two participants per round (measured in
``benchmarks/ROBUSTNESS.md``)."""


def check_reference_weight(weight) -> float:
    if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not 0 <= weight <= 1e6:
        raise InputError(f"reference weight must be a number >= 0 (0: the reference counts for nothing), got {weight!r}")
    return float(weight)


def reference_signs(packer: SignPacker, update: Mapping[str, np.ndarray]) -> np.ndarray:
    """The packed sign words of the reference ``update`` (name -> array, local - global) on ``packer``'s layout.

    A missing, extra, misshapen or non-finite tensor is an ``InputError`` naming the reference and the tensor.
    """
    if not isinstance(update, Mapping):
        raise InputError(f"the reference must return a dict of tensor name -> array, got {type(update).__name__}",
                         client=REFERENCE)
    # A FlatUpdate (simulate's reference client) packs as is; a dict of arrays or tensors tensor by tensor.
    arrays = update if isinstance(update, FlatUpdate) else dict(update.items())
    # A packer scores pairs, so it holds two rows; the second is the same arrays (no copy), never read.
    own = SignPacker(packer.layout, [REFERENCE, f"{REFERENCE}'"], backend="cpu")
    own.add_clients({REFERENCE: arrays, f"{REFERENCE}'": arrays})
    own._check_complete()  # a missing tensor or a NaN: one clear error before anything is scored
    signs, _ = own.words()
    return np.ascontiguousarray(signs[0], dtype=np.int32)
