"""The packing plan of a layout: which program packs which words, built once per layout with numpy.

A round's tensors are packed by two launches per float format (``triton.py``; the CPU kernel uses the
same per-tensor tables): the *full words* of every tensor (32 elements each, read as 16-byte vectors:
``block_tensor[b]`` / ``block_word[b]`` say that block ``b`` packs words ``[block_word[b], block_word[b] +
block_words)`` of tensor ``block_tensor[b]``, cut at ``full_words``), and the *tail* of each tensor whose
element count is not a multiple of 32 (its last, partial word, read element by element; ``tail_tensors``).

Everything is an array over tensors or blocks, so building it costs a few numpy calls whatever the number
of tensors, and a launch over a subset of the tensors selects its blocks with ``blocks_of``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..intrinsics import WORD_BITS


@dataclass(frozen=True)
class PackPlan:
    block_words: int
    numels: np.ndarray
    """int64 [T]: elements of each tensor."""
    word_offsets: np.ndarray
    """int64 [T]: first word of each tensor in a client's row (and in the task plane)."""
    full_words: np.ndarray
    """int64 [T]: whole words of 32 elements (``numel // 32``)."""
    tails: np.ndarray
    """int64 [T]: elements in the partial last word (``numel % 32``; 0: none)."""
    block_start: np.ndarray
    """int64 [T + 1]: tensor t owns blocks ``block_start[t]:block_start[t + 1]``."""
    block_tensor: np.ndarray
    """int32 [B]: the tensor of each block."""
    block_word: np.ndarray
    """int64 [B]: the first word (within its tensor) of each block."""
    tail_tensors: np.ndarray
    """int32 [K]: the tensors with a partial last word, in layout order."""

    @classmethod
    def build(cls, numels, word_offsets, block_words: int) -> "PackPlan":
        numels = np.asarray(numels, dtype=np.int64)
        word_offsets = np.asarray(word_offsets, dtype=np.int64)
        full_words = numels // WORD_BITS
        blocks = -(-full_words // block_words)
        block_start = np.zeros(numels.size + 1, dtype=np.int64)
        np.cumsum(blocks, out=block_start[1:])
        block_tensor = np.repeat(np.arange(numels.size, dtype=np.int32), blocks)
        block_word = (np.arange(block_start[-1], dtype=np.int64) - block_start[:-1][block_tensor]) * block_words
        tails = numels % WORD_BITS
        return cls(block_words, numels, word_offsets, full_words, tails, block_start, block_tensor, block_word,
                   np.flatnonzero(tails).astype(np.int32))

    @property
    def n_tensors(self) -> int:
        return self.numels.size

    def blocks_of(self, tensors: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(block ids, position of each block's tensor in ``tensors``) of the blocks of the given tensors."""
        starts, stops = self.block_start[tensors], self.block_start[tensors + 1]
        counts = stops - starts
        positions = np.repeat(np.arange(tensors.size, dtype=np.int64), counts)
        first = np.cumsum(counts) - counts
        blocks = np.arange(int(counts.sum()), dtype=np.int64) - first[positions] + starts[positions]
        return blocks, positions
