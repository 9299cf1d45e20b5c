"""Canonical layout of an adapter update as a packed bitstream.

Tensors are ordered by name (plain string order) so every client, process and backend agrees.
Each tensor starts on a fresh 32-bit word: tensor ``k`` occupies words
``[word_offset, word_offset + ceil(numel / 32))`` and its element ``e`` (row-major) is bit
``e % 32`` (least significant first) of word ``word_offset + e // 32``. The global task coordinate
of that element is ``32 * word_offset + e``. Padding bits are never tasks (nobody's update is
non-zero there).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from ..errors import InputError
from ..kernels.intrinsics import WORD_BITS

MAX_COORDS = 1 << 32


@dataclass(frozen=True)
class TensorSlot:
    name: str
    shape: tuple[int, ...]
    numel: int
    word_offset: int

    @property
    def n_words(self) -> int:
        return -(-self.numel // WORD_BITS)


@dataclass(frozen=True)
class Layout:
    slots: tuple[TensorSlot, ...]

    @classmethod
    def from_shapes(cls, shapes: Mapping[str, Sequence[int]]) -> "Layout":
        if not shapes:
            raise InputError("an update must hold at least one tensor")
        for name, shape in shapes.items():
            if not isinstance(name, str):
                raise InputError(f"tensor names must be strings, got {name!r}")
            if (isinstance(shape, (str, bytes)) or not isinstance(shape, Sequence)
                    or not all(isinstance(s, (int, np.integer)) and not isinstance(s, bool) and s > 0 for s in shape)):
                raise InputError(f"shape must be a sequence of positive integers, got {shape!r}", tensor=name)
        slots, offset = [], 0
        for name in sorted(shapes):
            shape = tuple(int(s) for s in shapes[name])
            numel = 1
            for s in shape:
                numel *= s
            if numel == 0:
                raise InputError("tensor is empty", tensor=name)
            slot = TensorSlot(name, shape, numel, offset)
            slots.append(slot)
            offset += slot.n_words
        if offset * WORD_BITS > MAX_COORDS:
            raise InputError(f"update has more than {MAX_COORDS} coordinates (padded); split it")
        return cls(tuple(slots))

    @property
    def n_words(self) -> int:
        last = self.slots[-1]
        return last.word_offset + last.n_words

    @property
    def n_coords(self) -> int:
        return sum(s.numel for s in self.slots)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.slots)

    def slot(self, name: str) -> TensorSlot:
        try:
            return self._by_name[name]
        except KeyError:
            raise InputError("tensor is not part of the layout", tensor=name) from None

    @property
    def _by_name(self) -> dict[str, TensorSlot]:
        by_name = self.__dict__.get("_by_name_cache")
        if by_name is None:
            by_name = {s.name: s for s in self.slots}
            object.__setattr__(self, "_by_name_cache", by_name)
        return by_name
