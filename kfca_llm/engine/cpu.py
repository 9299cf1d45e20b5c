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

import numba
import numpy as np
import torch
import llvmlite.binding as llvm_binding
from llvmlite import ir
from numba import njit, prange, types
from numba.extending import intrinsic

from ..errors import InputError
from ..partition import DRAW2_SALT, MAX_CLIENTS, pair_keys, partition_params
from .backends import Backend, PackedBuffers
from .layout import Layout
from .numba_setup import configure_numba, serial_and_parallel
from .stats import RoundCounts

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


def _ir_splat(builder, vector_type, value):
    """``value`` (a Python int or an LLVM scalar of the lane type) in every lane of ``vector_type``."""
    lanes = vector_type.count
    if isinstance(value, int):
        return ir.Constant(vector_type, [ir.Constant(vector_type.element, value)] * lanes)
    i32 = ir.IntType(32)
    vec = builder.insert_element(ir.Constant(vector_type, ir.Undefined), value, ir.Constant(i32, 0))
    return builder.shuffle_vector(vec, ir.Constant(vector_type, ir.Undefined),
                                  ir.Constant(ir.VectorType(i32, lanes), [0] * lanes))


def _ir_mix32(builder, x):
    """``partition.mix32`` on every lane of the <N x i32> vector ``x`` (the kernels' vector hashes)."""
    def shifted(value, bits):
        return builder.lshr(value, _ir_splat(builder, x.type, bits))

    x = builder.xor(x, shifted(x, 16))
    x = builder.mul(x, _ir_splat(builder, x.type, 0x7FEB352D))
    x = builder.xor(x, shifted(x, 15))
    x = builder.mul(x, _ir_splat(builder, x.type, 0x846CA68B))
    return builder.xor(x, shifted(x, 16))


# Software prefetch distance of the packing loop. Measured on the 2-core CI machine: one core streams
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
            return _ir_splat(builder, vector_type, value)

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
_PARALLEL_FROM_WORDS = 1 << 15


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
            return _ir_splat(builder, vector_type, value)

        base = builder.mul(builder.trunc(args[0], i32), ir.Constant(i32, 32))
        coords = builder.add(splat(base), ir.Constant(vector_type, [ir.Constant(i32, k) for k in range(32)]))
        x = _ir_mix32(builder, builder.xor(coords, splat(args[1])))
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


def _gram_kernel(signs, task, key, t_bonus, t_m1, row_starts, cols, n_groups):
    """Co-negative counts of each client (the Gram diagonal) and of the listed pairs, per task set.

    Pairs are given row by row (CSR): client i's partners are ``cols[row_starts[i]:row_starts[i + 1]]``.
    ``signs`` and ``task`` are viewed as uint64 (two 32-bit words per lane; rows are padded to an
    even number of words). Per chunk of words the three set masks are built once; each row is
    masked once and then every listed pair runs a contiguous AND + popcount reduction over the
    chunk, which LLVM vectorises. Chunks are dealt round-robin to ``n_groups`` groups, so partials
    take ``n_groups`` x (n + pairs) counts of memory however long the rows are.
    """
    n, n_words = signs.shape
    n_pairs = cols.size
    n_chunks = (n_words + _WORDS_PER_CHUNK - 1) // _WORDS_PER_CHUNK
    n_groups = max(min(n_groups, n_chunks), 1)
    diagonal = np.zeros((n_groups, 3, n), dtype=np.int64)
    pair_counts = np.zeros((n_groups, 3, n_pairs), dtype=np.int64)
    sizes = np.zeros((n_groups, 3), dtype=np.int64)
    for group in prange(n_groups):
        masks = np.empty((3, _WORDS_PER_CHUNK), dtype=np.uint64)
        masked = np.empty(_WORDS_PER_CHUNK, dtype=np.uint64)
        for chunk in range(group, n_chunks, n_groups):
            start = chunk * _WORDS_PER_CHUNK
            stop = min(start + _WORDS_PER_CHUNK, n_words)
            width = stop - start
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
            for s in range(3):
                total = 0
                for k in range(width):
                    total += _popcount64(masks[s, k])
                sizes[group, s] += total
                for i in range(n):
                    row_i = signs[i, start:stop]
                    own = 0
                    for k in range(width):
                        masked[k] = row_i[k] & masks[s, k]
                        own += _popcount64(masked[k])
                    diagonal[group, s, i] += own
                    for p in range(row_starts[i], row_starts[i + 1]):
                        row_j = signs[cols[p], start:stop]
                        acc = 0
                        for k in range(width):
                            acc += _popcount64(masked[k] & row_j[k])
                        pair_counts[group, s, p] += acc
    return diagonal, pair_counts, sizes


_GRAM = serial_and_parallel(_gram_kernel)


def _compress_table() -> np.ndarray:
    """uint8 [256, 256]: the bits of value byte v at the set bits of mask byte m, packed low (pext)."""
    masks = np.arange(256, dtype=np.uint32)[:, None]
    values = np.arange(256, dtype=np.uint32)[None, :]
    table = np.zeros((256, 256), dtype=np.uint32)
    rank = np.zeros((256, 1), dtype=np.uint32)  # set bits of m below bit b
    for b in range(8):
        in_mask = (masks >> np.uint32(b)) & np.uint32(1)
        table |= (((values >> np.uint32(b)) & np.uint32(1)) & in_mask) << rank
        rank = rank + in_mask
    return table.astype(np.uint8)


_COMPRESS = _compress_table()
_POPCOUNT8 = np.array([bin(m).count("1") for m in range(256)], dtype=np.int64)
_PLANE_BLOCK_WORDS = 1 << 12
_DRAWS_PER_TASK = 1 << 16


def _penalty_set_sizes(task, key, t_bonus, t_m1):
    """int64 [n_blocks, 3]: bonus, M_1 and M_2 members per block of ``_PLANE_BLOCK_WORDS`` words."""
    n_blocks = (task.size + _PLANE_BLOCK_WORDS - 1) // _PLANE_BLOCK_WORDS
    sizes = np.zeros((n_blocks, 3), dtype=np.int64)
    for block in prange(n_blocks):
        for w in range(block * _PLANE_BLOCK_WORDS, min((block + 1) * _PLANE_BLOCK_WORDS, task.size)):
            t = task[w]
            if t == 0:
                continue
            bonus, m1 = _set_masks(w, t, key, t_bonus, t_m1)
            sizes[block, 0] += _popcount64(np.uint64(bonus))
            sizes[block, 1] += _popcount64(np.uint64(m1))
            sizes[block, 2] += _popcount64(np.uint64(t & ~(bonus | m1)))
    return sizes


@intrinsic
def _pext32(typingctx, value, mask):
    """BMI2 ``pext``: the bits of ``value`` at the set bits of ``mask``, packed low (one instruction)."""
    def codegen(context, builder, signature, args):
        i32 = ir.IntType(32)
        pext = builder.module.declare_intrinsic("llvm.x86.bmi.pext.32", (), ir.FunctionType(i32, [i32, i32]))
        return builder.call(pext, args)

    return types.uint32(types.uint32, types.uint32), codegen


@njit(inline="always")
def _pext_compress(value, mask, table, pop8):
    return _pext32(value, mask)


@njit(inline="always")
def _table_compress(value, mask, table, pop8):
    """``pext`` by a byte table, for CPUs without BMI2 (4 lookups instead of one instruction)."""
    bits = np.uint32(0)
    n_bits = 0
    for byte in range(4):
        m = (mask >> np.uint32(8 * byte)) & np.uint32(0xFF)
        bits |= np.uint32(table[m, (value >> np.uint32(8 * byte)) & np.uint32(0xFF)]) << np.uint32(n_bits)
        n_bits += pop8[m]
    return bits


def _numba_target_has_pext() -> bool:
    """Whether numba compiles for a CPU with BMI2 (its target is the host unless NUMBA_CPU_NAME says otherwise)."""
    if numba.config.CPU_NAME and numba.config.CPU_NAME != "host":
        return "+bmi2" in (numba.config.CPU_FEATURES or "")
    return bool(llvm_binding.get_host_cpu_features().get("bmi2", False))


_compress_bits = _pext_compress if _numba_target_has_pext() else _table_compress


@njit(inline="always")
def _append_compressed(plane_row, bits, n_new, acc, n_bits, word, edges, first):
    """Append ``n_new`` compressed bits to the bitstream; full words owned by this block are stored.

    The first word of a block may hold the previous block's bits and its last word the next one's:
    those go to ``edges`` (OR-ed in afterwards), so parallel blocks never write the same word.
    """
    acc |= np.uint64(bits) << np.uint64(n_bits)
    n_bits += n_new
    if n_bits >= 32:  # at most one word: n_bits was below 32 and a word adds at most 32
        if first:
            edges[0] = np.uint32(acc & np.uint64(0xFFFFFFFF))
            first = False
        else:
            plane_row[word] = np.uint32(acc & np.uint64(0xFFFFFFFF))
        acc >>= np.uint64(32)
        n_bits -= 32
        word += 1
    return acc, n_bits, word, first


def _penalty_planes_kernel(signs, task, key, t_bonus, t_m1, offsets, plane1, plane2, bonus_coords, edges,
                           table, pop8):
    """Compact every client's sign bits on M_1 and M_2 (increasing coordinate order) and list the bonus tasks.

    ``offsets[block]`` = (bonus, M_1, M_2) members before the block. ``edges[block, set, client]`` holds
    the block's first and last partial words of each plane as (word index, bits), OR-ed in by the caller.
    """
    n = signs.shape[0]
    n_blocks = offsets.shape[0]
    for block in prange(n_blocks):
        first_word = block * _PLANE_BLOCK_WORDS
        stop = min(first_word + _PLANE_BLOCK_WORDS, task.size)
        width = stop - first_word
        m1_masks = np.empty(width, dtype=np.uint32)
        m2_masks = np.empty(width, dtype=np.uint32)
        b = offsets[block, 0]
        for k in range(width):
            w = first_word + k
            t = task[w]
            if t == 0:
                m1_masks[k] = 0
                m2_masks[k] = 0
                continue
            bonus, m1 = _set_masks(w, t, key, t_bonus, t_m1)
            m1_masks[k] = m1
            m2_masks[k] = t & ~(bonus | m1)
            while bonus:
                bonus_coords[b] = np.uint32(w * 32) + np.uint32(_popcount64(np.uint64((bonus & -bonus) - np.uint32(1))))
                bonus &= bonus - np.uint32(1)
                b += 1
        for s in range(2):
            masks = m1_masks if s == 0 else m2_masks
            plane = plane1 if s == 0 else plane2
            start = offsets[block, s + 1]
            for i in range(n):
                row = plane[i]
                edge = edges[block, s, i]
                acc = np.uint64(0)
                n_bits = start & 31
                word = start >> 5
                edge[0] = word
                first = n_bits != 0
                head = np.zeros(1, dtype=np.uint32)
                for k in range(width):
                    if masks[k] != 0:
                        bits = _compress_bits(signs[i, first_word + k], masks[k], table, pop8)
                        acc, n_bits, word, first = _append_compressed(row, bits, _popcount64(np.uint64(masks[k])),
                                                                      acc, n_bits, word, head, first)
                edge[1] = head[0]
                edge[2] = word
                edge[3] = np.uint32(acc & np.uint64(0xFFFFFFFF)) if n_bits > 0 else np.uint32(0)


@intrinsic
def _draw16(typingctx, bonus_coords, start, key, draw2_salt, m1, m2, row1, row2):
    """Matches of the 16 draws of bonus tasks ``bonus_coords[start:start + 16]`` for one ordered pair.

    The scalar arithmetic of ``_draw_kernel``'s tail as <16 x i32> vectors: two ``mix32`` hashes, two
    32x32->64-bit rank products and two 16-lane gathers from the planes. LLVM's own vectorisation of the
    scalar loop used 4-lane gathers with 64-bit indices and ran 1.5x slower.
    """
    def codegen(context, builder, signature, args):
        i32, i64 = ir.IntType(32), ir.IntType(64)
        lanes32, lanes64 = ir.VectorType(i32, 16), ir.VectorType(i64, 16)
        all_lanes = ir.Constant(ir.VectorType(ir.IntType(1), 16), [1] * 16)

        def splat(value, vector_type):
            return _ir_splat(builder, vector_type, value)

        def sign_bits(u, m, row_arg):
            rank = builder.trunc(builder.lshr(builder.mul(builder.zext(u, lanes64), splat(m, lanes64)),
                                              splat(32, lanes64)), lanes32)
            row = context.make_array(signature.args[row_arg])(context, builder, args[row_arg])
            byte_offsets = builder.shl(builder.zext(builder.lshr(rank, splat(5, lanes32)), lanes64), splat(2, lanes64))
            pointers = builder.inttoptr(builder.add(splat(builder.ptrtoint(row.data, i64), lanes64), byte_offsets),
                                        ir.VectorType(i32.as_pointer(), 16))
            gather = builder.module.declare_intrinsic(
                "llvm.masked.gather.v16i32.v16p0", (),
                ir.FunctionType(lanes32, [pointers.type, i32, all_lanes.type, lanes32]))
            words = builder.call(gather, [pointers, ir.Constant(i32, 4), all_lanes, ir.Constant(lanes32, ir.Undefined)])
            return builder.lshr(words, builder.and_(rank, splat(31, lanes32)))

        coords = context.make_array(signature.args[0])(context, builder, args[0])
        x = builder.load(builder.bitcast(builder.gep(coords.data, [args[1]]), lanes32.as_pointer()), align=4)
        u1 = _ir_mix32(builder, builder.xor(x, splat(args[2], lanes32)))
        u2 = _ir_mix32(builder, builder.xor(u1, splat(args[3], lanes32)))
        differ = builder.and_(builder.xor(sign_bits(u1, args[4], 6), sign_bits(u2, args[5], 7)), splat(1, lanes32))
        same = builder.bitcast(builder.icmp_unsigned("==", differ, splat(0, lanes32)), ir.IntType(16))
        ctpop = builder.module.declare_intrinsic("llvm.ctpop", [i64])
        return builder.call(ctpop, [builder.zext(same, i64)])

    return types.int64(bonus_coords, start, key, draw2_salt, m1, m2, row1, row2), codegen


def _draw_kernel(bonus_coords, plane1, plane2, pairs, pair_keys, draw2_salt, m1, m2):
    """Matches of Algorithm 1's draws per ordered pair: ranks hashed from the bonus task, signs from the planes."""
    n_pairs = pairs.shape[0]
    n_chunks = (bonus_coords.size + _DRAWS_PER_TASK - 1) // _DRAWS_PER_TASK
    partial = np.zeros((n_pairs, n_chunks), dtype=np.int64)
    m1 = np.uint64(m1)
    m2 = np.uint64(m2)
    for task_id in prange(n_pairs * n_chunks):
        p = task_id // n_chunks
        chunk = task_id % n_chunks
        row1 = plane1[pairs[p, 0]]
        row2 = plane2[pairs[p, 1]]
        key = pair_keys[p]
        start = chunk * _DRAWS_PER_TASK
        stop = min(start + _DRAWS_PER_TASK, bonus_coords.size)
        matches = 0
        vector_stop = start + (stop - start) // 16 * 16
        for k in range(start, vector_stop, 16):
            matches += _draw16(bonus_coords, k, key, draw2_salt, m1, m2, row1, row2)
        for k in range(vector_stop, stop):
            u1 = _mix32(bonus_coords[k] ^ key)
            u2 = _mix32(u1 ^ draw2_salt)
            rank1 = np.uint32((np.uint64(u1) * m1) >> np.uint64(32))
            rank2 = np.uint32((np.uint64(u2) * m2) >> np.uint64(32))
            bit1 = row1[rank1 >> np.uint32(5)] >> (rank1 & np.uint32(31))
            bit2 = row2[rank2 >> np.uint32(5)] >> (rank2 & np.uint32(31))
            matches += np.int64(~(bit1 ^ bit2) & np.uint32(1))
        partial[p, chunk] = matches
    return partial


_SET_SIZES = serial_and_parallel(_penalty_set_sizes)
_PLANES = serial_and_parallel(_penalty_planes_kernel)
_DRAWS = serial_and_parallel(_draw_kernel)


def penalty_planes(signs: np.ndarray, task: np.ndarray, key, t_bonus, t_m1):
    """(bonus coordinates uint32 [|M_b|], plane1 uint32 [n, m1/32 + 1], plane2, m1, m2).

    Bit r of ``plane1[i]`` (word r // 32, bit r % 32) is client i's sign at the r-th member of M_1, so a
    draw of rank r is one lookup in a bitstream 1/4 the size of the sign row.
    """
    parallel = task.size > 16 * _PLANE_BLOCK_WORDS
    sizes = _SET_SIZES[parallel](task, key, t_bonus, t_m1)
    ends = np.cumsum(sizes, axis=0)
    offsets = np.ascontiguousarray(ends - sizes)
    n_bonus, m1, m2 = (int(v) for v in ends[-1])
    n = signs.shape[0]
    plane1 = np.zeros((n, m1 // 32 + 1), dtype=np.uint32)
    plane2 = np.zeros((n, m2 // 32 + 1), dtype=np.uint32)
    bonus_coords = np.empty(n_bonus, dtype=np.uint32)
    edges = np.zeros((offsets.shape[0], 2, n, 4), dtype=np.uint32)  # head word, head bits, tail word, tail bits
    _PLANES[parallel](signs, task, key, t_bonus, t_m1, offsets, plane1, plane2, bonus_coords, edges,
                           _COMPRESS, _POPCOUNT8)
    for s, plane in enumerate((plane1, plane2)):
        rows = np.arange(n)[None, :]
        for word_col, bits_col in ((0, 1), (2, 3)):
            np.bitwise_or.at(plane, (np.broadcast_to(rows, edges.shape[:1] + (n,)),
                                     edges[:, s, :, word_col].astype(np.int64)), edges[:, s, :, bits_col])
    return bonus_coords, plane1, plane2, m1, m2


def _raw_view(values) -> tuple[torch.Tensor, int]:
    """Contiguous CPU tensor of the floats' bits as same-width signed integers (copied only if needed)."""
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


def _unique_pairs(pairs: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(rows, cols) of the distinct unordered pairs i < j of ``pairs``, sorted by row then column."""
    low, high = pairs.min(axis=1), pairs.max(axis=1)
    flat = np.unique(low[low != high] * n + high[low != high])
    return flat // n, flat % n


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
        self.pack_clients(buffers, [(client, tensor, values)])

    def pack_many(self, buffers: PackedBuffers, client: int, items) -> None:
        self.pack_clients(buffers, [(client, tensor, values) for tensor, values in items])

    def pack_clients(self, buffers: PackedBuffers, items) -> None:
        slots = buffers.layout.slots
        groups: dict[tuple, dict[int, list]] = {}
        for client, tensor, values in items:
            raw, exp_mask = _raw_view(values)
            if raw.numel() != slots[tensor].numel:
                raise InputError(f"expected {slots[tensor].numel} values, got {raw.numel()}", tensor=slots[tensor].name)
            groups.setdefault((raw.dtype, exp_mask), {}).setdefault(tensor, []).append((client, raw))
        row_words = buffers.signs.shape[1]
        signs, task = buffers.signs.view(np.uint32).reshape(-1), buffers.task.view(np.uint32)
        for (raw_dtype, exp_mask), by_tensor in groups.items():
            # The raw tensors stay referenced (in ``by_tensor``) until the kernel returns: it reads them by address.
            members, slot_items, full_words, task_offsets, has_tail = [], [0], [], [], []
            for tensor, copies in by_tensor.items():
                slot = slots[tensor]
                members += [(client, tensor, raw) for client, raw in copies]
                slot_items.append(len(members))
                full_words.append(slot.numel // 32)
                task_offsets.append(slot.word_offset)
                has_tail.append(slot.numel % 32 != 0)
            tails = torch.zeros((len(members), 32), dtype=raw_dtype)
            for i, (_, tensor, raw) in enumerate(members):
                partial = raw.numel() % 32
                if partial:
                    tails[i, :partial] = raw.reshape(-1)[raw.numel() - partial:]
            addresses = np.array([raw.data_ptr() for _, _, raw in members], dtype=np.uint64)
            clients = np.array([client for client, _, _ in members], dtype=np.int64)
            tensors = np.repeat(np.array(list(by_tensor), dtype=np.int64), np.diff(slot_items))
            word_offsets = np.array(task_offsets, dtype=np.int64)
            sign_offsets = clients * row_words + np.repeat(word_offsets, np.diff(slot_items))
            full_words = np.array(full_words, dtype=np.int64)
            slot_items = np.array(slot_items, dtype=np.int64)
            parallel = int(np.diff(slot_items) @ full_words) >= _PARALLEL_FROM_WORDS
            bad = _PACK[parallel](slot_items, addresses, sign_offsets, full_words, word_offsets, tails.numpy(),
                                  np.array(has_tail), signs, task, np.int64(exp_mask))
            buffers.nonfinite[clients, tensors] = bad != 0

    def nonfinite(self, buffers: PackedBuffers) -> np.ndarray:
        return buffers.nonfinite != 0

    def round_counts(self, buffers: PackedBuffers, seed: int, bonus_fraction: float,
                     pairs: np.ndarray | None = None) -> RoundCounts:
        key, t_bonus, t_m1 = (np.uint32(v) for v in partition_params(seed, bonus_fraction))
        n = buffers.signs.shape[0]
        if pairs is None:
            rows, cols = np.triu_indices(n, 1)
        else:  # each unordered pair once, as (smaller, larger); the diagonal is always counted
            pairs = np.asarray(pairs, dtype=np.int64).reshape(-1, 2)
            rows, cols = _unique_pairs(pairs, n)
        row_starts = np.searchsorted(rows, np.arange(n + 1)).astype(np.int64)
        parallel = buffers.signs.shape[1] > 2 * _WORDS_PER_CHUNK  # one chunk of words: one thread
        diagonal, pair_counts, sizes = _GRAM[parallel](
            buffers.signs.view(np.uint64), buffers.task.view(np.uint64), key, t_bonus, t_m1, row_starts,
            np.ascontiguousarray(cols, dtype=np.int64), 4 * numba.get_num_threads())
        # np.zeros maps untouched pages lazily: only the diagonal and the scored pairs are written.
        gram = np.zeros((3, n, n), dtype=np.int64)
        clients = np.arange(n)
        gram[:, clients, clients] = diagonal.sum(axis=0)
        counts = pair_counts.sum(axis=0)
        gram[:, rows, cols] = counts
        gram[:, cols, rows] = counts
        return RoundCounts(gram, sizes.sum(axis=0))

    def sampled_matches(self, buffers: PackedBuffers, seed: int, bonus_fraction: float,
                        pairs: np.ndarray) -> np.ndarray:
        key, t_bonus, t_m1 = (np.uint32(v) for v in partition_params(seed, bonus_fraction))
        bonus_coords, plane1, plane2, m1, m2 = penalty_planes(buffers.signs.view(np.uint32),
                                                              buffers.task.view(np.uint32), key, t_bonus, t_m1)
        if m1 == 0 or m2 == 0:
            raise InputError("too few informative coordinates to form non-empty penalty sets")
        pairs = np.ascontiguousarray(pairs, dtype=np.int64).reshape(-1, 2)
        parallel = len(pairs) * bonus_coords.size >= 1 << 22  # ~10 ms of draws: worth waking the pool
        partial = _DRAWS[parallel](bonus_coords, plane1, plane2, pairs, pair_keys(seed, pairs), np.uint32(DRAW2_SALT),
                                   m1, m2)
        return partial.sum(axis=1)

    def host_words(self, buffers: PackedBuffers) -> tuple[np.ndarray, np.ndarray]:
        n_words = buffers.layout.n_words
        return buffers.signs[:, :n_words], buffers.task[:n_words]

