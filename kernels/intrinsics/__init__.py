"""What every kernel family shares: the packed word, the partition hash, popcount.

One definition per implementation family:

* numpy (the references): ``kfca_llm.partition.mix32`` is the contract itself; ``np.bitwise_count``;
* numba (the CPU kernels): ``intrinsics.cpu``: the scalar ``mix32``, ``popcount64``, and the LLVM IR
  helpers (``ir_splat``, ``ir_mix32``, ``ir_popcount``) that the vector intrinsics are written with;
* Triton (the GPU kernels): ``intrinsics.triton``: ``mix32``, ``popcount32`` and the word/lane helpers.

The two compiled families live in two modules because triton is optional (Linux only) and slow to
import: the CPU kernels must not need it.
"""

WORD_BITS = 32
"""Bits per packed word: element ``e`` of a tensor is bit ``e % 32`` of its word ``e // 32``."""
