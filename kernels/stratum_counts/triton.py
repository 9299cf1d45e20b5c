"""Stratum counts on the GPU (Triton): ``popcount(sign_i & set & stratum_s)`` over packed words.

The three task-set planes come from ``pair_counts.triton.set_planes`` (the partition hashed once per round).
A program owns one stratum, one tile of ``TILE`` clients and one contiguous range of words; per word it
builds the stratum's mask from the ``P`` public planes (each plane or its complement, AND-ed), and keeps
``3 x TILE`` per-thread counters in registers across the range (one AND + popcount per set and client per
word, like the Gram tiles). Every program writes its own int64 partial counts, summed by torch on the
device: no atomics, deterministic and exact. Each stratum's program reads the sign words once, so signs are
read S times in all (the planes stay small: P words per word).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..intrinsics.triton import as_uint32, not32, on_interpreter, popcount32
from ..pair_counts.triton import set_planes

_SETS = 3


@triton.jit
def _strata_kernel(signs_ptr, sets_ptr, planes_ptr, partial_ptr, sizes_ptr, n_clients, n_words, words_per_program,
                   N_PLANES: tl.constexpr, TILE: tl.constexpr, BLOCK: tl.constexpr):
    """partial [parts, 3, S, n] int64 negatives; sizes [parts, tiles, 3, S] int64 members (tile 0's are read)."""
    part = tl.program_id(0)
    s = tl.program_id(1)
    tile = tl.program_id(2)
    n_strata = tl.num_programs(1)
    rows = tile * TILE + tl.arange(0, TILE)
    row_ok = rows < n_clients
    row_base = rows.to(tl.int64) * n_words
    start = part * words_per_program
    stop = tl.minimum(start + words_per_program, n_words)
    acc_b = tl.zeros((TILE, BLOCK), dtype=tl.int32)
    acc_1 = tl.zeros((TILE, BLOCK), dtype=tl.int32)
    acc_2 = tl.zeros((TILE, BLOCK), dtype=tl.int32)
    size_b = tl.zeros((BLOCK,), dtype=tl.int32)
    size_1 = tl.zeros((BLOCK,), dtype=tl.int32)
    size_2 = tl.zeros((BLOCK,), dtype=tl.int32)
    for offset in range(start, stop, BLOCK):
        words = offset + tl.arange(0, BLOCK)
        ok = words < stop
        stratum = tl.full((BLOCK,), 0xFFFFFFFF, dtype=tl.uint32)
        for p in tl.static_range(N_PLANES):
            plane = as_uint32(tl.load(planes_ptr + p * n_words + words, mask=ok, other=0))
            stratum &= tl.where(((s >> p) & 1) == 1, plane, not32(plane))
        bonus = as_uint32(tl.load(sets_ptr + words, mask=ok, other=0)) & stratum
        m1 = as_uint32(tl.load(sets_ptr + n_words + words, mask=ok, other=0)) & stratum
        m2 = as_uint32(tl.load(sets_ptr + 2 * n_words + words, mask=ok, other=0)) & stratum
        size_b += popcount32(bonus).to(tl.int32)
        size_1 += popcount32(m1).to(tl.int32)
        size_2 += popcount32(m2).to(tl.int32)
        signs = as_uint32(tl.load(signs_ptr + row_base[:, None] + words[None, :],
                                  mask=row_ok[:, None] & ok[None, :], other=0))
        acc_b += popcount32(signs & bonus[None, :]).to(tl.int32)
        acc_1 += popcount32(signs & m1[None, :]).to(tl.int32)
        acc_2 += popcount32(signs & m2[None, :]).to(tl.int32)
    set_stride = n_strata * n_clients
    out = partial_ptr + part.to(tl.int64) * (3 * set_stride) + s * n_clients + rows  # 3 task sets (a literal:
    # compiled kernels read no non-constexpr globals)
    tl.store(out, tl.sum(acc_b.to(tl.int64), axis=1), mask=row_ok)
    tl.store(out + set_stride, tl.sum(acc_1.to(tl.int64), axis=1), mask=row_ok)
    tl.store(out + 2 * set_stride, tl.sum(acc_2.to(tl.int64), axis=1), mask=row_ok)
    sizes = sizes_ptr + ((part * tl.num_programs(2) + tile) * 3) * n_strata + s
    tl.store(sizes, tl.sum(size_b.to(tl.int64)))
    tl.store(sizes + n_strata, tl.sum(size_1.to(tl.int64)))
    tl.store(sizes + 2 * n_strata, tl.sum(size_2.to(tl.int64)))


def stratum_counts(signs: torch.Tensor, task: torch.Tensor, planes: torch.Tensor, key: int, t_bonus: int, t_m1: int,
                   *, tile: int = 8, num_warps: int | None = None,
                   target_programs: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(negatives int64 [3, S, n], sizes int64 [3, S]) on the device, S = 2 ** planes.shape[0]."""
    n_clients, n_words = signs.shape
    n_planes = planes.shape[0]
    n_strata = 1 << n_planes
    device = signs.device
    if n_words == 0 or n_clients == 0:
        return (torch.zeros((_SETS, n_strata, n_clients), dtype=torch.int64, device=device),
                torch.zeros((_SETS, n_strata), dtype=torch.int64, device=device))
    interpreted = on_interpreter(signs)
    if num_warps is None:
        num_warps = 8 if interpreted else 4
    if target_programs is None:
        target_programs = 4 if interpreted else 32 * torch.cuda.get_device_properties(device).multi_processor_count
    sets, _ = set_planes(task, key, t_bonus, t_m1, 1024 if interpreted else 256)
    block = 32 * num_warps
    n_tiles = -(-n_clients // tile)
    n_blocks = -(-n_words // block)
    parts = min(max(-(-target_programs // (n_strata * n_tiles)), 1), n_blocks)
    words_per_program = -(-n_blocks // parts) * block
    parts = -(-n_words // words_per_program)
    partial = torch.empty((parts, _SETS, n_strata, n_clients), dtype=torch.int64, device=device)
    size_partial = torch.empty((parts, n_tiles, _SETS, n_strata), dtype=torch.int64, device=device)
    planes = planes.contiguous() if n_planes else torch.zeros((1, n_words), dtype=torch.int32, device=device)
    _strata_kernel[(parts, n_strata, n_tiles)](signs, sets, planes, partial, size_partial, n_clients, n_words,
                                              words_per_program, N_PLANES=n_planes, TILE=tile, BLOCK=block,
                                              num_warps=num_warps)
    return partial.sum(dim=0), size_partial[:, 0].sum(dim=0)
