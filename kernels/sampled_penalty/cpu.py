"""The sampled penalty on the CPU (numba): penalty planes, then the draws of every ordered pair.

Finding the rank-th member of M_1 (M_2) is a select over a bitstream, slow when done per draw. So,
once per round, each client's sign bits at the members of M_1 (M_2) are compacted, in increasing
coordinate order, into a bitstream (``penalty_planes``): a draw of rank r is then one lookup
(``draw_matches``).
"""

from __future__ import annotations

import llvmlite.binding as llvm_binding
import numba
import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.extending import intrinsic

from ..intrinsics.cpu import ir_mix32, ir_popcount, ir_splat, mix32, popcount64, set_masks
from ..numba_setup import configure_numba, serial_and_parallel

configure_numba()  # before the cache=True kernels below are defined


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
            bonus, m1 = set_masks(w, t, key, t_bonus, t_m1)
            sizes[block, 0] += popcount64(np.uint64(bonus))
            sizes[block, 1] += popcount64(np.uint64(m1))
            sizes[block, 2] += popcount64(np.uint64(t & ~(bonus | m1)))
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
            bonus, m1 = set_masks(w, t, key, t_bonus, t_m1)
            m1_masks[k] = m1
            m2_masks[k] = t & ~(bonus | m1)
            while bonus:
                bonus_coords[b] = np.uint32(w * 32) + np.uint32(popcount64(np.uint64((bonus & -bonus) - np.uint32(1))))
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
                        acc, n_bits, word, first = _append_compressed(row, bits, popcount64(np.uint64(masks[k])),
                                                                      acc, n_bits, word, head, first)
                edge[1] = head[0]
                edge[2] = word
                edge[3] = np.uint32(acc & np.uint64(0xFFFFFFFF)) if n_bits > 0 else np.uint32(0)


class _VectorGEP(ir.Instruction):
    """``getelementptr i32, ptr base, <N x i32> index``: N word addresses from one base and 32-bit indices.

    llvmlite's builder has no GEP with a vector index. From this form (a uniform base) LLVM gathers with
    32-bit indices: one 16-lane ``vpgatherdd`` where a vector of 64-bit pointers took two 8-lane
    ``vpgatherqd``; the draws ran 11-13% faster with their lookups in L1 or L2 (``benchmarks/RESULTS.md``).
    """

    def __init__(self, parent, base, index):
        super().__init__(parent, ir.VectorType(base.type, index.type.count), "getelementptr", [base, index])

    def descr(self, buf):
        base, index = self.operands
        buf.append(f"getelementptr i32, {base.type} {base.get_reference()}, {index.type} {index.get_reference()}\n")


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
            return ir_splat(builder, vector_type, value)

        def sign_bits(u, m, row_arg):
            # m < 2**32: zero-extended from 32 bits, the product is LLVM's mulhu (two vpmuludq), not vpmullq.
            m_lanes = builder.zext(splat(builder.trunc(m, i32), lanes32), lanes64)
            rank = builder.trunc(builder.lshr(builder.mul(builder.zext(u, lanes64), m_lanes),
                                              splat(32, lanes64)), lanes32)
            row = context.make_array(signature.args[row_arg])(context, builder, args[row_arg])
            pointers = _VectorGEP(builder.block, row.data, builder.lshr(rank, splat(5, lanes32)))
            builder._insert(pointers)  # what the builder's own methods call to place an instruction
            gather = builder.module.declare_intrinsic(
                "llvm.masked.gather.v16i32.v16p0", (),
                ir.FunctionType(lanes32, [pointers.type, i32, all_lanes.type, lanes32]))
            words = builder.call(gather, [pointers, ir.Constant(i32, 4), all_lanes, ir.Constant(lanes32, ir.Undefined)])
            return builder.lshr(words, builder.and_(rank, splat(31, lanes32)))

        coords = context.make_array(signature.args[0])(context, builder, args[0])
        x = builder.load(builder.bitcast(builder.gep(coords.data, [args[1]]), lanes32.as_pointer()), align=4)
        u1 = ir_mix32(builder, builder.xor(x, splat(args[2], lanes32)))
        u2 = ir_mix32(builder, builder.xor(u1, splat(args[3], lanes32)))
        differ = builder.and_(builder.xor(sign_bits(u1, args[4], 6), sign_bits(u2, args[5], 7)), splat(1, lanes32))
        same = builder.bitcast(builder.icmp_unsigned("==", differ, splat(0, lanes32)), ir.IntType(16))
        return ir_popcount(builder, builder.zext(same, i64))

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
            u1 = mix32(bonus_coords[k] ^ key)
            u2 = mix32(u1 ^ draw2_salt)
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



def draw_matches(bonus_coords: np.ndarray, plane1: np.ndarray, plane2: np.ndarray, pairs: np.ndarray,
                 pair_keys: np.ndarray, draw2_salt: int, m1: int, m2: int) -> np.ndarray:
    """int64 [P]: matches of the seeded (p1, p2) draws of each ordered pair (i, j) of ``pairs`` ([P, 2]).

    ``pair_keys[k]`` is the draw key of ``pairs[k]``; the planes and sizes come from ``penalty_planes``.
    """
    pairs = np.ascontiguousarray(pairs, dtype=np.int64).reshape(-1, 2)
    parallel = len(pairs) * bonus_coords.size >= 1 << 22  # ~10 ms of draws: worth waking the pool
    partial = _DRAWS[parallel](bonus_coords, plane1, plane2, pairs, pair_keys, np.uint32(draw2_salt), m1, m2)
    return partial.sum(axis=1)
