"""Sign packing on the CPU (numba): many tensors of many clients, one float format, in one pass.

The kernel works on the raw bits of the floats (viewed as same-width signed integers), so
fp16/bf16/fp32/fp64 share one code path: negative = sign bit set, magnitude non-zero and not NaN
(exactly ``x < 0``: -0.0 and -NaN are not negative), non-zero = magnitude bits non-zero,
non-finite = exponent bits all ones.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from llvmlite import ir
from numba import prange, types
from numba.extending import intrinsic

from kfca_llm.errors import InputError

from ..intrinsics.cpu import ir_splat
from ..numba_setup import configure_numba, serial_and_parallel

configure_numba()  # before the cache=True kernels below are defined

# (same-width integer view, exponent mask) per float dtype; the magnitude is every bit but the top one.
_RAW_FORMATS = {
    torch.float16: (torch.int16, 0x7C00),
    torch.bfloat16: (torch.int16, 0x7F80),
    torch.float32: (torch.int32, 0x7F800000),
    torch.float64: (torch.int64, 0x7FF0000000000000),
}
_NUMPY_FLOATS = {np.dtype(np.float16): torch.float16, np.dtype(np.float32): torch.float32,
                 np.dtype(np.float64): torch.float64}
_PACK_BLOCK_WORDS = 1 << 12
_PARALLEL_FROM_WORDS = 1 << 15

# Software prefetch distance of the packing loop. Measured on a 2-core CI machine: one core streams
# 8-9 GB/s through the packing loop without it (its mask arithmetic keeps too few loads in flight)
# and 12-15 GB/s with it, as fast as a plain reduction; 2 to 128 KB ahead all did as well.
_PREFETCH_BYTES = 8192


@intrinsic
def _lanes32(typingctx, address, witness, exp_mask):
    """(negative, non-zero, non-finite) bit masks of the 32 floats at ``address`` as three uint32.

    ``witness`` is any array of the floats' same-width integer type (it only sets the lane width).
    One vector load and three vector compares whose <32 x i1> results are bitcast to i32: LLVM
    lowers this to compare-into-mask-register (AVX-512) or movemask (AVX2) instructions, which is
    what lets packing run at memory speed. Each 64-byte line ``_PREFETCH_BYTES`` ahead is prefetched
    into L2 (a prefetch past the end of a buffer is harmless: it never faults).
    """
    width = witness.dtype.bitwidth
    result = types.UniTuple(types.uint32, 3)

    def codegen(context, builder, signature, args):
        lane_type = ir.IntType(width)
        vector_type = ir.VectorType(lane_type, 32)
        i8_pointer = ir.IntType(8).as_pointer()
        i32, i64 = ir.IntType(32), ir.IntType(64)
        prefetch = builder.module.declare_intrinsic(
            "llvm.prefetch", [i8_pointer], ir.FunctionType(ir.VoidType(), [i8_pointer, i32, i32, i32]))
        for line in range(max(width * 32 // 8 // 64, 1)):
            target = builder.add(args[0], ir.Constant(i64, _PREFETCH_BYTES + 64 * line))
            # read, locality 1 (L2: each line is used once, soon), data cache
            builder.call(prefetch, [builder.inttoptr(target, i8_pointer), ir.Constant(i32, 0), ir.Constant(i32, 1),
                                    ir.Constant(i32, 1)])
        v = builder.load(builder.inttoptr(args[0], vector_type.as_pointer()), align=width // 8)

        def splat(value):
            return ir_splat(builder, vector_type, value)

        exp = splat(builder.trunc(args[2], lane_type) if width < 64 else args[2])
        magnitude = builder.and_(v, splat((1 << (width - 1)) - 1))
        nonzero = builder.icmp_unsigned("!=", magnitude, splat(0))
        not_nan = builder.icmp_unsigned("<=", magnitude, exp)
        negative = builder.and_(builder.and_(builder.icmp_signed("<", v, splat(0)), nonzero), not_nan)
        nonfinite = builder.icmp_unsigned(">=", magnitude, exp)
        words = [builder.bitcast(mask, i32) for mask in (negative, nonzero, nonfinite)]
        return context.make_tuple(builder, result, words)

    return result(address, witness, exp_mask), codegen


def _pack_kernel(slot_items, addresses, sign_offsets, full_words, task_offsets, tails, has_tail, signs, task,
                 exp_mask):
    """Pack many tensors of many clients (one float format) in one pass; per item: non-zero if NaN/Inf.

    Items (one client's copy of one tensor) are grouped by tensor: tensor group g is items
    ``slot_items[g]:slot_items[g + 1]``; they share ``full_words[g]`` whole words of 32 floats and the
    task words from ``task_offsets[g]``. Item i reads ``addresses[i]`` (the caller keeps the buffers
    alive) and writes ``signs[sign_offsets[i]:]`` (``signs`` is every client's row, flattened). A block
    of ``_PACK_BLOCK_WORDS`` words packs that range for every item of its group, so each task word is
    written by one thread only. A partial last word comes zero-padded in ``tails[i]`` where
    ``has_tail[g]`` (zeros are never tasks, so padding packs as nothing).

    Addresses instead of numba's typed list of arrays: the typed list costs about 10 us per tensor to
    build and, with the workqueue threading layer, made the kernel run at half the memory speed.
    """
    n_groups = full_words.size
    first_block = np.zeros(n_groups + 1, dtype=np.int64)
    for g in range(n_groups):
        first_block[g + 1] = first_block[g] + (full_words[g] + _PACK_BLOCK_WORDS - 1) // _PACK_BLOCK_WORDS
    # One flag per (item, block of its group): a shared per-item flag would be a lost-update race.
    flag_start = np.zeros(addresses.size + 1, dtype=np.int64)
    for g in range(n_groups):
        for i in range(slot_items[g], slot_items[g + 1]):
            flag_start[i + 1] = flag_start[i] + first_block[g + 1] - first_block[g]
    flags = np.zeros(flag_start[-1], dtype=np.uint32)
    stride = np.uint64(32 * tails.itemsize)
    for block in prange(first_block[n_groups]):
        g = np.searchsorted(first_block, block, side="right") - 1
        local = block - first_block[g]
        first = np.uint64(local * _PACK_BLOCK_WORDS)
        stop = np.uint64(min((local + 1) * _PACK_BLOCK_WORDS, full_words[g]))
        task_base = np.uint64(task_offsets[g])
        for w in range(first, stop):
            task_word = np.uint32(0)
            for i in range(slot_items[g], slot_items[g + 1]):
                negative, nonzero, nonfinite = _lanes32(np.uint64(addresses[i]) + w * stride, tails, exp_mask)
                flags[flag_start[i] + local] |= nonfinite
                signs[np.uint64(sign_offsets[i]) + w] = negative
                task_word |= nonzero
            task[task_base + w] |= task_word
    per_item = np.zeros(addresses.size, dtype=np.uint32)
    for i in range(addresses.size):
        for f in range(flag_start[i], flag_start[i + 1]):
            per_item[i] |= flags[f]
    for g in range(n_groups):
        if has_tail[g]:
            w = np.uint64(full_words[g])
            for i in range(slot_items[g], slot_items[g + 1]):
                negative, nonzero, nonfinite = _lanes32(np.uint64(tails[i:].ctypes.data), tails, exp_mask)
                per_item[i] |= nonfinite
                signs[np.uint64(sign_offsets[i]) + w] = negative
                task[np.uint64(task_offsets[g]) + w] |= nonzero
    return per_item


_PACK = serial_and_parallel(_pack_kernel)


def raw_view(values) -> tuple[torch.Tensor, int]:
    """Contiguous CPU tensor of the floats' bits as same-width signed integers (copied only if needed),
    and the format's exponent mask."""
    if isinstance(values, torch.Tensor) and values.dtype in _RAW_FORMATS and values.is_contiguous() \
            and values.device.type == "cpu":  # the common case, in a few torch calls (tiny rounds pay per tensor)
        int_dtype, exp_mask = _RAW_FORMATS[values.dtype]
        return values.detach().view(int_dtype), exp_mask
    if isinstance(values, np.ndarray):
        if values.dtype not in _NUMPY_FLOATS:
            raise InputError(f"expected a float array, got dtype {values.dtype}")
        values = torch.from_numpy(np.ascontiguousarray(values))
    if values.dtype not in _RAW_FORMATS:
        raise InputError(f"expected a float tensor, got dtype {values.dtype}")
    int_dtype, exp_mask = _RAW_FORMATS[values.dtype]
    t = values.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    return t.contiguous().view(int_dtype), exp_mask


def sign_pack(tensors: Sequence[tuple[int, Sequence[tuple[int, torch.Tensor]]]], signs: np.ndarray, task: np.ndarray,
              exp_mask: int) -> np.ndarray:
    """Pack the copies of several tensors, all in one float format (``raw_view``), in one pass.

    ``tensors``: per tensor, (its first word in ``task``, [(first word of the copy in ``signs``, raw bits)]),
    one copy per client; the copies of a tensor have its number of elements. ``signs`` (every client's row,
    flattened) and ``task`` are uint32 words; a copy's words are overwritten, the task words OR-ed.
    Returns uint32 [copies] (in the order given): non-zero where that copy held NaN or Inf.
    """
    # The raw tensors stay referenced (in ``members``) until the kernel returns: it reads them by address.
    members = [raw for _, copies in tensors for _, raw in copies]
    slot_items = np.cumsum([0] + [len(copies) for _, copies in tensors]).astype(np.int64)
    numels = [copies[0][1].numel() for _, copies in tensors]
    full_words = np.array([numel // 32 for numel in numels], dtype=np.int64)
    task_offsets = np.array([offset for offset, _ in tensors], dtype=np.int64)
    has_tail = np.array([numel % 32 != 0 for numel in numels])
    tails = torch.zeros((len(members), 32), dtype=members[0].dtype)
    for i, raw in enumerate(members):
        partial = raw.numel() % 32
        if partial:
            tails[i, :partial] = raw.reshape(-1)[raw.numel() - partial:]
    addresses = np.array([raw.data_ptr() for raw in members], dtype=np.uint64)
    sign_offsets = np.array([offset for _, copies in tensors for offset, _ in copies], dtype=np.int64)
    parallel = int(np.diff(slot_items) @ full_words) >= _PARALLEL_FROM_WORDS
    return _PACK[parallel](slot_items, addresses, sign_offsets, full_words, task_offsets, tails.numpy(), has_tail,
                           signs, task, np.int64(exp_mask))


def sign_pack_flat(numels: np.ndarray, word_offsets: np.ndarray, flats: Sequence[torch.Tensor],
                   sign_rows: np.ndarray, signs: np.ndarray, task: np.ndarray, exp_mask: int) -> np.ndarray:
    """Pack whole updates held in padded flat buffers (raw bits, one format; tensor t from element
    ``32 * word_offsets[t]``) in one pass, with the same kernel and words as ``sign_pack``.

    ``sign_rows[s]``: the first word of flat ``s``'s row in ``signs``. The item tables are built with numpy
    over (tensor, flat) at once: no Python work per tensor. Returns uint32 [flats, tensors]: non-zero where
    that tensor of that flat held NaN or Inf.
    """
    n_flats, n_tensors = len(flats), numels.size
    itemsize = flats[0].element_size()
    full_words = numels // 32
    bases = np.array([flat.data_ptr() for flat in flats], dtype=np.uint64)
    # Items grouped by tensor (item t * n_flats + s), as the kernel wants them.
    addresses = (bases[None, :] + (word_offsets * (32 * itemsize)).astype(np.uint64)[:, None]).ravel()
    sign_offsets = (np.asarray(sign_rows, dtype=np.int64)[None, :] + word_offsets[:, None]).ravel()
    slot_items = np.arange(0, n_tensors * n_flats + 1, n_flats, dtype=np.int64)
    tails = np.zeros((n_tensors, n_flats, 32), dtype=flats[0].numpy().dtype)
    has_tail = numels % 32 != 0
    tailed = np.flatnonzero(has_tail)
    if tailed.size:
        lanes = np.arange(32)
        index = 32 * (word_offsets[tailed] + full_words[tailed])[:, None] + lanes[None, :]
        real = lanes[None, :] < (numels[tailed] % 32)[:, None]  # the padding after a tensor is never read
        for s, flat in enumerate(flats):
            tails[tailed, s] = np.where(real, flat.numpy()[index], 0)
    parallel = int(full_words.sum()) * n_flats >= _PARALLEL_FROM_WORDS
    bad = _PACK[parallel](slot_items, addresses, sign_offsets, full_words, word_offsets, tails.reshape(-1, 32),
                          has_tail, signs, task, np.int64(exp_mask))
    return bad.reshape(n_tensors, n_flats).T
