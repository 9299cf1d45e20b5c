"""Canonical layout of an adapter update as a packed bitstream.

Tensors are ordered by name (plain string order) so every client, process and backend agrees.
Each tensor starts on a fresh 32-bit word: tensor ``k`` occupies words
``[word_offset, word_offset + ceil(numel / 32))`` and its element ``e`` (row-major) is bit
``e % 32`` (least significant first) of word ``word_offset + e // 32``. The global task coordinate
of that element is ``32 * word_offset + e``. Padding bits are never tasks (nobody's update is
non-zero there).

The same layout places a whole update in one *padded flat buffer* of ``32 * n_words`` elements: tensor
``k``'s elements start at element ``32 * word_offset`` (row-major); the padding between tensors is never
read. ``FlatUpdate`` is such a buffer seen as a state dict; the backends pack it with no per-tensor work.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

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
        return int(self.numels.sum())

    @property
    def padded_numel(self) -> int:
        """Elements of a padded flat buffer of this layout (every tensor padded to whole words)."""
        return self.n_words * WORD_BITS

    @property
    def names(self) -> tuple[str, ...]:
        return self.cached("names", lambda: tuple(s.name for s in self.slots))

    @property
    def numels(self) -> np.ndarray:
        """int64 [n_tensors], layout order."""
        return self.cached("numels", lambda: np.array([s.numel for s in self.slots], dtype=np.int64))

    @property
    def word_offsets(self) -> np.ndarray:
        """int64 [n_tensors]: each tensor's first word (its first element in a padded flat buffer is 32 x this)."""
        return self.cached("word_offsets", lambda: np.array([s.word_offset for s in self.slots], dtype=np.int64))

    @property
    def names_index(self) -> dict[str, int]:
        """Tensor name -> its index in the layout."""
        return self.cached("names_index", lambda: {s.name: k for k, s in enumerate(self.slots)})

    def slot(self, name: str) -> TensorSlot:
        try:
            return self.slots[self.names_index[name]]
        except KeyError:
            raise InputError("tensor is not part of the layout", tensor=name) from None

    def same_as(self, other: "Layout") -> bool:
        """Equal names, shapes and order (compared as tuples in C, not slot by slot in Python)."""
        def key(layout: Layout):
            return layout.cached("key", lambda: (layout.names, tuple(s.shape for s in layout.slots)))
        return self is other or key(self) == key(other)

    def cached(self, key, build: Callable[[], Any]) -> Any:
        """A value derived from this (immutable) layout, built once: arrays, packing plans, their device copies."""
        cache = self.__dict__.setdefault("_derived", {})
        if key not in cache:
            cache[key] = build()
        return cache[key]

    def __getstate__(self):
        return {"slots": self.slots}  # not the derived values (device tables among them)

    def flat_buffer(self, dtype: torch.dtype = torch.float32, device=None, *, pin_memory: bool = False) -> torch.Tensor:
        """A zeroed padded flat buffer of this layout (``FlatUpdate(layout, buffer)`` views it per tensor)."""
        return torch.zeros(self.padded_numel, dtype=dtype, device=device, pin_memory=pin_memory)

    def flatten(self, tensors: Mapping[str, Any], dtype: torch.dtype, device=None) -> "FlatUpdate":
        """A copy of a state dict with this layout's names and shapes in a new padded flat buffer."""
        update = FlatUpdate(self, self.flat_buffer(dtype, device))
        for name, view in update.items():
            view.copy_(torch.as_tensor(tensors[name]).reshape(view.shape))
        return update


class FlatUpdate(Mapping[str, torch.Tensor]):
    """A client's update held in one padded flat buffer of a layout, seen as a state dict (name -> view).

    The views are the tensors: writing into them (``torch.sub(a, b, out=update[name])``) fills the buffer,
    and ``SignPacker.add_flat`` / ``score_updates`` pack the buffer in one pass, with no per-tensor work. The
    mapping itself is read-only, so the buffer and its views cannot disagree. Padding is never read.
    """

    def __init__(self, layout: Layout, buffer: torch.Tensor):
        if not isinstance(buffer, torch.Tensor) or buffer.dim() != 1 or buffer.numel() != layout.padded_numel:
            raise InputError(f"a flat update of this layout is a 1-D tensor of {layout.padded_numel} elements "
                             f"(Layout.flat_buffer), got {getattr(buffer, 'shape', type(buffer).__name__)}")
        if not buffer.is_floating_point():
            raise InputError(f"a flat update must hold floats, got dtype {buffer.dtype}")
        self.layout = layout
        self.buffer = buffer

    def __getitem__(self, name: str) -> torch.Tensor:
        if name not in self.layout.names_index:
            raise KeyError(name)  # what a Mapping raises (``in``, ``get`` rely on it)
        slot = self.layout.slots[self.layout.names_index[name]]
        start = slot.word_offset * WORD_BITS
        return self.buffer[start:start + slot.numel].view(slot.shape)

    def __iter__(self) -> Iterator[str]:
        return iter(self.layout.names)

    def __len__(self) -> int:
        return len(self.layout.slots)
