"""What the numba (CPU) kernels share: the partition hash, popcount, and the LLVM IR helpers.

The scalar functions are ``inline="always"``: they compile into each kernel that calls them. numba
keys a cached kernel by its own file only, so after changing this module delete the kernels'
``__pycache__`` folders (``find kernels -name __pycache__ -exec rm -r {} +``) or the cached kernels
keep the old code.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic


def ir_popcount(builder, value):
    """LLVM's ``ctpop`` of an i64 (one ``popcnt`` instruction)."""
    return builder.call(builder.module.declare_intrinsic("llvm.ctpop", [ir.IntType(64)]), [value])


@intrinsic
def popcount64(typingctx, x):
    def codegen(context, builder, signature, args):
        return ir_popcount(builder, args[0])

    return types.uint64(types.uint64), codegen


@njit(inline="always")
def mix32(x):
    """``partition.mix32`` on one uint32."""
    x = np.uint32(x)
    x ^= x >> np.uint32(16)
    x = np.uint32(x * np.uint32(0x7FEB352D))
    x ^= x >> np.uint32(15)
    x = np.uint32(x * np.uint32(0x846CA68B))
    x ^= x >> np.uint32(16)
    return x


def ir_splat(builder, vector_type, value):
    """``value`` (a Python int or an LLVM scalar of the lane type) in every lane of ``vector_type``."""
    lanes = vector_type.count
    if isinstance(value, int):
        return ir.Constant(vector_type, [ir.Constant(vector_type.element, value)] * lanes)
    i32 = ir.IntType(32)
    vec = builder.insert_element(ir.Constant(vector_type, ir.Undefined), value, ir.Constant(i32, 0))
    return builder.shuffle_vector(vec, ir.Constant(vector_type, ir.Undefined),
                                  ir.Constant(ir.VectorType(i32, lanes), [0] * lanes))


def ir_mix32(builder, x):
    """``partition.mix32`` on every lane of the <N x i32> vector ``x`` (the kernels' vector hashes)."""
    def shifted(value, bits):
        return builder.lshr(value, ir_splat(builder, x.type, bits))

    x = builder.xor(x, shifted(x, 16))
    x = builder.mul(x, ir_splat(builder, x.type, 0x7FEB352D))
    x = builder.xor(x, shifted(x, 15))
    x = builder.mul(x, ir_splat(builder, x.type, 0x846CA68B))
    return builder.xor(x, shifted(x, 16))


@intrinsic
def partition_word(typingctx, word_index, key, t_bonus, t_m1):
    """(bonus, M_1) masks of the 32 coordinates of one word, hashed as one <32 x i32> vector.

    Same arithmetic as ``partition.mix32`` lane by lane; M_2 is whatever task bit is in neither.
    """
    result = types.UniTuple(types.uint32, 2)

    def codegen(context, builder, signature, args):
        i32 = ir.IntType(32)
        vector_type = ir.VectorType(i32, 32)

        def splat(value):
            return ir_splat(builder, vector_type, value)

        base = builder.mul(builder.trunc(args[0], i32), ir.Constant(i32, 32))
        coords = builder.add(splat(base), ir.Constant(vector_type, [ir.Constant(i32, k) for k in range(32)]))
        x = ir_mix32(builder, builder.xor(coords, splat(args[1])))
        bonus = builder.bitcast(builder.icmp_unsigned("<", x, splat(args[2])), i32)
        below_m1 = builder.bitcast(builder.icmp_unsigned("<", x, splat(args[3])), i32)
        m1 = builder.and_(below_m1, builder.not_(bonus))
        return context.make_tuple(builder, result, [bonus, m1])

    return result(word_index, key, t_bonus, t_m1), codegen


@njit(inline="always")
def set_masks(word_index, task_word, key, t_bonus, t_m1):
    """Bonus and M_1 masks of one word's task bits (M_2 is the rest of the task bits)."""
    bonus, m1 = partition_word(word_index, key, t_bonus, t_m1)
    return bonus & task_word, m1 & task_word


@njit(inline="always")
def set_masks64(lane, task_lane, key, t_bonus, t_m1):
    """Bonus, M_1 and M_2 masks of one uint64 lane of task bits (the 32-bit words ``2 lane`` and ``2 lane + 1``)."""
    b_lo, m1_lo = set_masks(2 * lane, np.uint32(task_lane & np.uint64(0xFFFFFFFF)), key, t_bonus, t_m1)
    b_hi, m1_hi = set_masks(2 * lane + 1, np.uint32(task_lane >> np.uint64(32)), key, t_bonus, t_m1)
    bonus = np.uint64(b_lo) | (np.uint64(b_hi) << np.uint64(32))
    m1 = np.uint64(m1_lo) | (np.uint64(m1_hi) << np.uint64(32))
    return bonus, m1, task_lane & ~(bonus | m1)
