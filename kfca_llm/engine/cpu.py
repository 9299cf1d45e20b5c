"""CPU backend ("numpy"): numpy buffers, numba kernels for the hot loops.

Why numba: packing must read each client's update once and emit sign and non-zero bits in one
fused, multi-threaded pass (``np.packbits`` needs a boolean temporary per plane and runs on one
thread), and counting needs LLVM's ``ctpop`` on 64-bit words with the seeded partition generated
on the fly. numba gives both without a compiler at install time.

The kernels work on the raw bits of the floats (viewed as same-width signed integers), so
fp16/bf16/fp32/fp64 share one code path:
negative = sign bit set, magnitude non-zero and not NaN (exactly ``x < 0``: -0.0 and -NaN are not
negative), non-zero = magnitude bits non-zero, non-finite = exponent bits all ones.
"""

from __future__ import annotations

import numpy as np
import torch
from llvmlite import ir
from numba import njit, prange, types
from numba.typed import List
from numba.extending import intrinsic

from ..errors import InputError
from ..partition import DRAW2_SALT, MAX_CLIENTS, pair_key, partition_key, partition_thresholds
from .backends import Backend, PackedBuffers
from .layout import Layout
from .numba_cache import ensure_numba_cache
from .stats import RoundCounts

ensure_numba_cache()  # before the cache=True kernels below are defined

# (same-width integer view, magnitude mask, exponent mask) per float dtype.
_RAW_FORMATS = {
    torch.float16: (torch.int16, 0x7FFF, 0x7C00),
    torch.bfloat16: (torch.int16, 0x7FFF, 0x7F80),
    torch.float32: (torch.int32, 0x7FFFFFFF, 0x7F800000),
    torch.float64: (torch.int64, 0x7FFFFFFFFFFFFFFF, 0x7FF0000000000000),
}
_NUMPY_FLOATS = {np.dtype(np.float16): torch.float16, np.dtype(np.float32): torch.float32,
                 np.dtype(np.float64): torch.float64}
_WORDS_PER_CHUNK = 1 << 14
_PACK_BLOCK_WORDS = 1 << 12


@intrinsic
def _popcount64(typingctx, x):
    def codegen(context, builder, signature, args):
        ctpop = builder.module.declare_intrinsic("llvm.ctpop", [ir.IntType(64)])
        return builder.call(ctpop, args)

    return types.uint64(types.uint64), codegen


@njit(inline="always")
def _mix32(x):
    x = np.uint32(x)
    x ^= x >> np.uint32(16)
    x = np.uint32(x * np.uint32(0x7FEB352D))
    x ^= x >> np.uint32(15)
    x = np.uint32(x * np.uint32(0x846CA68B))
    x ^= x >> np.uint32(16)
    return x


@intrinsic
def _lanes32(typingctx, raw, start, exp_mask):
    """(negative, non-zero, non-finite) bit masks of raw[start:start + 32] as three uint32.

    One vector load and three vector compares whose <32 x i1> results are bitcast to i32: LLVM
    lowers this to compare-into-mask-register (AVX-512) or movemask (AVX2) instructions, which is
    what lets packing run at memory speed.
    """
    width = raw.dtype.bitwidth
    result = types.UniTuple(types.uint32, 3)

    def codegen(context, builder, signature, args):
        array = context.make_array(signature.args[0])(context, builder, args[0])
        lane_type = ir.IntType(width)
        vector_type = ir.VectorType(lane_type, 32)
        pointer = builder.bitcast(builder.gep(array.data, [args[1]]), vector_type.as_pointer())
        v = builder.load(pointer, align=width // 8)

        def splat(value):
            return ir.Constant(vector_type, [ir.Constant(lane_type, value)] * 32)

        exp_scalar = builder.trunc(args[2], lane_type) if width < 64 else args[2]
        exp = builder.insert_element(ir.Constant(vector_type, ir.Undefined), exp_scalar,
                                     ir.Constant(ir.IntType(32), 0))
        exp = builder.shuffle_vector(exp, ir.Constant(vector_type, ir.Undefined),
                                     ir.Constant(ir.VectorType(ir.IntType(32), 32), [0] * 32))
        magnitude = builder.and_(v, splat((1 << (width - 1)) - 1))
        nonzero = builder.icmp_unsigned("!=", magnitude, splat(0))
        not_nan = builder.icmp_unsigned("<=", magnitude, exp)
        negative = builder.and_(builder.and_(builder.icmp_signed("<", v, splat(0)), nonzero), not_nan)
        nonfinite = builder.icmp_unsigned(">=", magnitude, exp)
        words = [builder.bitcast(mask, ir.IntType(32)) for mask in (negative, nonzero, nonfinite)]
        return context.make_tuple(builder, result, words)

    return result(raw, start, exp_mask), codegen


@njit(inline="always")
def _pack_words(raw, signs_row, task, word_offset, first, stop, mag_mask, exp_mask):
    """Pack words [first, stop) of one tensor; the last word of the tensor may be partial."""
    n = raw.size
    bad = 0
    for w in range(first, stop):
        if (w + 1) * 32 <= n:
            negative, nonzero, nonfinite = _lanes32(raw, w * 32, exp_mask)
            bad += nonfinite != 0
        else:
            negative = np.uint32(0)
            nonzero = np.uint32(0)
            for lane in range(n - w * 32):
                v = np.int64(raw[w * 32 + lane])
                magnitude = v & mag_mask
                bit = np.uint32(1) << np.uint32(lane)
                if magnitude != 0:
                    nonzero |= bit
                    if v < 0 and magnitude <= exp_mask:  # -NaN is not < 0
                        negative |= bit
                bad += magnitude >= exp_mask
        signs_row[word_offset + w] = negative
        task[word_offset + w] |= nonzero
    return bad


@njit(parallel=True, cache=True)
def _pack_one_kernel(raw, word_offset, signs_row, task, mag_mask, exp_mask):
    """Pack one tensor (the streaming path: no container to build per call)."""
    n_words = (raw.size + 31) // 32
    n_blocks = (n_words + _PACK_BLOCK_WORDS - 1) // _PACK_BLOCK_WORDS
    bad = np.zeros(n_blocks, dtype=np.int64)
    for block in prange(n_blocks):
        first = block * _PACK_BLOCK_WORDS
        stop = min(first + _PACK_BLOCK_WORDS, n_words)
        bad[block] = _pack_words(raw, signs_row, task, word_offset, first, stop, mag_mask, exp_mask)
    return bad.sum()


@njit(parallel=True, cache=True)
def _pack_kernel(raws, word_offsets, signs_row, task, mag_mask, exp_mask):
    """Pack several tensors of one client (same float format) in one parallel pass.

    Work is split into blocks of ``_PACK_BLOCK_WORDS`` words across all tensors, so many small LoRA
    tensors cost one parallel region instead of one each. Returns non-finite counts per tensor.
    """
    k = len(raws)
    first_block = np.zeros(k + 1, dtype=np.int64)
    for t in range(k):
        n_words = (raws[t].size + 31) // 32
        first_block[t + 1] = first_block[t] + (n_words + _PACK_BLOCK_WORDS - 1) // _PACK_BLOCK_WORDS
    bad = np.zeros(first_block[k], dtype=np.int64)
    for block in prange(first_block[k]):
        t = np.searchsorted(first_block, block, side="right") - 1
        raw = raws[t]
        first = (block - first_block[t]) * _PACK_BLOCK_WORDS
        stop = min(first + _PACK_BLOCK_WORDS, (raw.size + 31) // 32)
        bad[block] = _pack_words(raw, signs_row, task, word_offsets[t], first, stop, mag_mask, exp_mask)
    per_tensor = np.zeros(k, dtype=np.int64)
    for t in range(k):
        per_tensor[t] = bad[first_block[t]:first_block[t + 1]].sum()
    return per_tensor


@intrinsic
def _partition_word(typingctx, word_index, key, t_bonus, t_m1):
    """(bonus, M_1) masks of the 32 coordinates of one word, hashed as one <32 x i32> vector.

    Same arithmetic as ``partition.mix32`` lane by lane; M_2 is whatever task bit is in neither.
    """
    result = types.UniTuple(types.uint32, 2)

    def codegen(context, builder, signature, args):
        i32 = ir.IntType(32)
        vector_type = ir.VectorType(i32, 32)

        def splat(value):
            if isinstance(value, int):
                return ir.Constant(vector_type, [ir.Constant(i32, value)] * 32)
            vec = builder.insert_element(ir.Constant(vector_type, ir.Undefined), value, ir.Constant(i32, 0))
            return builder.shuffle_vector(vec, ir.Constant(vector_type, ir.Undefined),
                                          ir.Constant(vector_type, [0] * 32))

        base = builder.mul(builder.trunc(args[0], i32), ir.Constant(i32, 32))
        coords = builder.add(splat(base), ir.Constant(vector_type, [ir.Constant(i32, k) for k in range(32)]))
        x = builder.xor(coords, splat(args[1]))
        x = builder.xor(x, builder.lshr(x, splat(16)))
        x = builder.mul(x, splat(0x7FEB352D))
        x = builder.xor(x, builder.lshr(x, splat(15)))
        x = builder.mul(x, splat(0x846CA68B))
        x = builder.xor(x, builder.lshr(x, splat(16)))
        bonus = builder.bitcast(builder.icmp_unsigned("<", x, splat(args[2])), i32)
        below_m1 = builder.bitcast(builder.icmp_unsigned("<", x, splat(args[3])), i32)
        m1 = builder.and_(below_m1, builder.not_(bonus))
        return context.make_tuple(builder, result, [bonus, m1])

    return result(word_index, key, t_bonus, t_m1), codegen


@njit(inline="always")
def _set_masks(word_index, task_word, key, t_bonus, t_m1):
    """Bonus and M_1 masks of one word's task bits (M_2 is the rest of the task bits)."""
    bonus, m1 = _partition_word(word_index, key, t_bonus, t_m1)
    return bonus & task_word, m1 & task_word


@njit(parallel=True, cache=True)
def _gram_kernel(signs, task, key, t_bonus, t_m1):
    """Upper triangles of the three co-negative Gram matrices, one partial per chunk of words.

    ``signs`` and ``task`` are viewed as uint64 (two 32-bit words per lane; rows are padded to an
    even number of words). Per block of words the three set masks are built once, then every pair
    runs a contiguous AND + popcount reduction over the block, which LLVM vectorises.
    """
    n, n_words = signs.shape
    n_chunks = (n_words + _WORDS_PER_CHUNK - 1) // _WORDS_PER_CHUNK
    partial = np.zeros((n_chunks, 3, n, n), dtype=np.int64)
    sizes = np.zeros((n_chunks, 3), dtype=np.int64)
    for chunk in prange(n_chunks):
        start = chunk * _WORDS_PER_CHUNK
        stop = min(start + _WORDS_PER_CHUNK, n_words)
        width = stop - start
        masks = np.empty((3, width), dtype=np.uint64)
        masked = np.empty(width, dtype=np.uint64)
        for k in range(width):
            w = start + k
            t = task[w]
            if t == 0:
                masks[0, k] = 0
                masks[1, k] = 0
                masks[2, k] = 0
                continue
            b_lo, m1_lo = _set_masks(2 * w, np.uint32(t & np.uint64(0xFFFFFFFF)), key, t_bonus, t_m1)
            b_hi, m1_hi = _set_masks(2 * w + 1, np.uint32(t >> np.uint64(32)), key, t_bonus, t_m1)
            bonus = np.uint64(b_lo) | (np.uint64(b_hi) << np.uint64(32))
            m1 = np.uint64(m1_lo) | (np.uint64(m1_hi) << np.uint64(32))
            masks[0, k] = bonus
            masks[1, k] = m1
            masks[2, k] = t & ~(bonus | m1)
        local = partial[chunk]
        for s in range(3):
            total = 0
            for k in range(width):
                total += _popcount64(masks[s, k])
            sizes[chunk, s] = total
            for i in range(n):
                row_i = signs[i, start:stop]
                for k in range(width):
                    masked[k] = row_i[k] & masks[s, k]
                for j in range(i, n):
                    row_j = signs[j, start:stop]
                    acc = 0
                    for k in range(width):
                        acc += _popcount64(masked[k] & row_j[k])
                    local[s, i, j] += acc
    return partial, sizes


@njit(cache=True)
def _penalty_coords(task, key, t_bonus, t_m1):
    """Task coordinates of M_1 and M_2 in increasing order (the draws pick them by rank)."""
    total = 0
    for w in range(task.size):
        total += _popcount64(np.uint64(task[w]))
    m1 = np.empty(total, dtype=np.int64)
    m2 = np.empty(total, dtype=np.int64)
    n1 = 0
    n2 = 0
    for w in range(task.size):
        t = task[w]
        if t == 0:
            continue
        bonus, in_m1 = _set_masks(w, t, key, t_bonus, t_m1)
        for lane in range(32):
            bit = np.uint32(1) << np.uint32(lane)
            if in_m1 & bit:
                m1[n1] = w * 32 + lane
                n1 += 1
            elif (t & bit) and not (bonus & bit):
                m2[n2] = w * 32 + lane
                n2 += 1
    return m1[:n1], m2[:n2]


@njit(inline="always")
def _bit(signs, client, coord):
    return (signs[client, coord >> 5] >> np.uint32(coord & 31)) & np.uint32(1)


@njit(parallel=True, cache=True)
def _sampled_kernel(signs, task, key, t_bonus, t_m1, m1_coords, m2_coords, pairs, pair_keys, draw2_salt):
    n_words = task.size
    n_pairs = pairs.shape[0]
    m1 = np.uint64(m1_coords.size)
    m2 = np.uint64(m2_coords.size)
    n_chunks = (n_words + _WORDS_PER_CHUNK - 1) // _WORDS_PER_CHUNK
    partial = np.zeros((n_chunks, n_pairs), dtype=np.int64)
    for chunk in prange(n_chunks):
        start = chunk * _WORDS_PER_CHUNK
        stop = min(start + _WORDS_PER_CHUNK, n_words)
        for w in range(start, stop):
            t = task[w]
            if t == 0:
                continue
            bonus, _ = _set_masks(w, t, key, t_bonus, t_m1)
            while bonus:
                lane = _popcount64(np.uint64((bonus & -bonus) - np.uint32(1)))
                bonus &= bonus - np.uint32(1)
                coord = np.uint32(w * 32 + lane)
                for p in range(n_pairs):
                    u1 = _mix32(coord ^ pair_keys[p])
                    u2 = _mix32(u1 ^ draw2_salt)
                    p1 = m1_coords[(np.uint64(u1) * m1) >> np.uint64(32)]
                    p2 = m2_coords[(np.uint64(u2) * m2) >> np.uint64(32)]
                    partial[chunk, p] += _bit(signs, pairs[p, 0], p1) == _bit(signs, pairs[p, 1], p2)
    return partial


def _raw_view(values) -> tuple[np.ndarray, int, int]:
    """Signed-integer numpy view of one tensor's float bits (copying only if not contiguous)."""
    if isinstance(values, np.ndarray):
        if values.dtype not in _NUMPY_FLOATS:
            raise InputError(f"expected a float array, got dtype {values.dtype}")
        values = torch.from_numpy(np.ascontiguousarray(values))
    if values.dtype not in _RAW_FORMATS:
        raise InputError(f"expected a float tensor, got dtype {values.dtype}")
    int_dtype, mag_mask, exp_mask = _RAW_FORMATS[values.dtype]
    t = values.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    return t.contiguous().view(int_dtype).numpy().reshape(-1), mag_mask, exp_mask


class CpuBackend(Backend):
    name = "numpy"

    def allocate(self, n_clients: int, layout: Layout, device=None) -> PackedBuffers:
        if not 2 <= n_clients <= MAX_CLIENTS:
            raise InputError(f"need between 2 and {MAX_CLIENTS} clients, got {n_clients}")
        # Rows padded to an even number of words (zeros: never tasks) so counting can use uint64.
        padded = layout.n_words + layout.n_words % 2
        return PackedBuffers(
            layout=layout,
            signs=np.zeros((n_clients, padded), dtype=np.int32),
            task=np.zeros(padded, dtype=np.int32),
            nonfinite=np.zeros((n_clients, len(layout.slots)), dtype=np.int32),
            device="cpu",
        )

    def pack(self, buffers: PackedBuffers, client: int, tensor: int, values) -> None:
        self.pack_many(buffers, client, [(tensor, values)])

    def pack_many(self, buffers: PackedBuffers, client: int, items) -> None:
        groups: dict[tuple, list] = {}
        for tensor, values in items:
            slot = buffers.layout.slots[tensor]
            raw, mag_mask, exp_mask = _raw_view(values)
            if raw.size != slot.numel:
                raise InputError(f"expected {slot.numel} values, got {raw.size}", tensor=slot.name)
            groups.setdefault((raw.dtype, mag_mask, exp_mask), []).append((tensor, raw))
        signs_row, task = buffers.signs[client].view(np.uint32), buffers.task.view(np.uint32)
        slots = buffers.layout.slots
        for (_, mag_mask, exp_mask), group in groups.items():
            masks = np.int64(mag_mask), np.int64(exp_mask)
            if len(group) == 1:  # the streaming path: no container to build per tensor
                tensor, raw = group[0]
                bad = [_pack_one_kernel(raw, slots[tensor].word_offset, signs_row, task, *masks)]
            else:
                raws = List([raw for _, raw in group])
                offsets = np.array([slots[t].word_offset for t, _ in group], dtype=np.int64)
                bad = _pack_kernel(raws, offsets, signs_row, task, *masks)
            for (tensor, _), count in zip(group, bad):
                buffers.nonfinite[client, tensor] = min(int(count), 1)

    def nonfinite(self, buffers: PackedBuffers) -> np.ndarray:
        return buffers.nonfinite != 0

    def round_counts(self, buffers: PackedBuffers, seed: int, bonus_fraction: float) -> RoundCounts:
        t_bonus, t_m1 = partition_thresholds(bonus_fraction)
        partial, sizes = _gram_kernel(buffers.signs.view(np.uint64), buffers.task.view(np.uint64),
                                      np.uint32(partition_key(seed)), np.uint32(t_bonus), np.uint32(t_m1))
        upper = partial.sum(axis=0)
        gram = np.triu(upper) + np.triu(upper, 1).transpose(0, 2, 1)
        return RoundCounts(gram, sizes.sum(axis=0))

    def sampled_matches(self, buffers: PackedBuffers, seed: int, bonus_fraction: float,
                        pairs: np.ndarray) -> np.ndarray:
        t_bonus, t_m1 = partition_thresholds(bonus_fraction)
        key = np.uint32(partition_key(seed))
        task = buffers.task.view(np.uint32)
        m1_coords, m2_coords = _penalty_coords(task, key, np.uint32(t_bonus), np.uint32(t_m1))
        if m1_coords.size == 0 or m2_coords.size == 0:
            raise InputError("too few informative coordinates to form non-empty penalty sets")
        pairs = np.ascontiguousarray(pairs, dtype=np.int64).reshape(-1, 2)
        keys = np.array([pair_key(seed, int(i), int(j)) for i, j in pairs], dtype=np.uint32)
        partial = _sampled_kernel(buffers.signs.view(np.uint32), task, key, np.uint32(t_bonus),
                                  np.uint32(t_m1), m1_coords, m2_coords, pairs, keys, np.uint32(DRAW2_SALT))
        return partial.sum(axis=0)

    def host_words(self, buffers: PackedBuffers) -> tuple[np.ndarray, np.ndarray]:
        n_words = buffers.layout.n_words
        return buffers.signs[:, :n_words], buffers.task[:n_words]

