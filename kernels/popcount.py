"""Bit-twiddling helpers shared by the kernels: SWAR popcount and the partition hash.

Both work on ``tl.uint32`` so that ``>>`` is a logical shift (on signed types it is arithmetic);
callers bitcast int32 words first. Compiled for sm_90, ``popcount32`` becomes one ``popc.b32``;
unlike ``libdevice.popc`` it also runs under ``TRITON_INTERPRET=1``.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def popcount32(x):
    """Number of set bits of each uint32 lane (returns uint32)."""
    x = x - ((x >> 1) & 0x55555555)
    x = (x & 0x33333333) + ((x >> 2) & 0x33333333)
    x = (x + (x >> 4)) & 0x0F0F0F0F
    return (x * 0x01010101) >> 24


@triton.jit
def mix32(x):
    """lowbias32 hash of each uint32 lane, identical to ``kfca_llm.partition.mix32`` (wrapping)."""
    x = x ^ (x >> 16)
    x = x * 0x7FEB352D
    x = x ^ (x >> 15)
    x = x * 0x846CA68B
    return x ^ (x >> 16)


@triton.jit
def as_uint32(words):
    """Reinterpret int32 words as uint32 (no value change), for logical shifts and popcount."""
    return words.to(tl.uint32, bitcast=True)
