"""Binary Gram counts over packed sign words on the GPU (Triton): ``popcount(s_i & s_j & set)`` per task set.

Partition: the class of coordinate ``c = 32 * w + lane`` is derived inside the kernels from the
counter hash of ``kfca_llm.partition`` (``u = mix32(c ^ key)``, bonus if ``u < t_bonus``, M_1 if
``u < t_m1``, else M_2), so no index array of size d is ever built; a set's member word is that
class's lanes AND-ed with the task mask. The kernels take those integers (and the pairs' draw keys)
as they are: ``kfca_llm.partition.partition_params`` and ``pair_keys`` derive them from a seed.

``binary_gram`` ("expected" penalty and everything else): each program walks a contiguous range
of words; per chunk it loads the words of a tile of client rows and a tile of client columns once
and counts ``popcount(s_i & s_j & set)`` for every pair of the two tiles and all three sets.
Clients are split into tiles of at most 16 and only tile pairs with ``tj >= ti`` run (n <= 16: one
tile, one pass over the words). Every program writes its own int64 partial counts, which torch sums
on the device in int64: no float, no atomics, so the result is deterministic and exact.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..intrinsics.triton import (as_uint32, coordinates, lanes_to_words, mix32, on_interpreter, popcount32, program_cap,
                                 round_params)

_MAX_TILE = 16


@triton.jit
def _count_pairs(row_words, col_words, set_words):
    """[T, T] int64: popcount(row_i & col_j & set) summed over the chunk's words."""
    both = row_words[:, None, :] & col_words[None, :, :] & set_words[None, None, :]
    return tl.sum(popcount32(as_uint32(both)).to(tl.int32), axis=2).to(tl.int64)


@triton.jit
def _gram_kernel(signs_ptr, task_ptr, params_ptr, partial_ptr, sizes_ptr, n_clients, n_words,
                 blocks_per_program, N_TILES: tl.constexpr, TILE: tl.constexpr,
                 BLOCK_WORDS: tl.constexpr):
    pid = tl.program_id(0)
    tile_pair = tl.program_id(1)
    ti = tile_pair // N_TILES
    tj = tile_pair % N_TILES
    if tj >= ti:
        key = tl.load(params_ptr).to(tl.uint32)
        t_bonus = tl.load(params_ptr + 1)
        t_m1 = tl.load(params_ptr + 2)
        rows = ti * TILE + tl.arange(0, TILE)
        cols = tj * TILE + tl.arange(0, TILE)
        row_base = rows.to(tl.int64) * n_words
        col_base = cols.to(tl.int64) * n_words
        acc_bonus = tl.zeros((TILE, TILE), dtype=tl.int64)
        acc_m1 = tl.zeros((TILE, TILE), dtype=tl.int64)
        acc_m2 = tl.zeros((TILE, TILE), dtype=tl.int64)
        size_bonus = tl.zeros((), dtype=tl.int64)
        size_m1 = tl.zeros((), dtype=tl.int64)
        size_m2 = tl.zeros((), dtype=tl.int64)
        for k in range(blocks_per_program):
            words = (pid * blocks_per_program + k) * BLOCK_WORDS + tl.arange(0, BLOCK_WORDS)
            in_range = words < n_words
            task = tl.load(task_ptr + words, mask=in_range, other=0)
            u = mix32(coordinates(words) ^ key).to(tl.int64)
            bonus = lanes_to_words(u < t_bonus) & task
            m1 = lanes_to_words((u >= t_bonus) & (u < t_m1)) & task
            m2 = lanes_to_words(u >= t_m1) & task
            row_words = tl.load(signs_ptr + row_base[:, None] + words[None, :],
                                mask=(rows[:, None] < n_clients) & in_range[None, :], other=0)
            col_words = tl.load(signs_ptr + col_base[:, None] + words[None, :],
                                mask=(cols[:, None] < n_clients) & in_range[None, :], other=0)
            acc_bonus += _count_pairs(row_words, col_words, bonus)
            acc_m1 += _count_pairs(row_words, col_words, m1)
            acc_m2 += _count_pairs(row_words, col_words, m2)
            size_bonus += tl.sum(popcount32(as_uint32(bonus)).to(tl.int32)).to(tl.int64)
            size_m1 += tl.sum(popcount32(as_uint32(m1)).to(tl.int32)).to(tl.int64)
            size_m2 += tl.sum(popcount32(as_uint32(m2)).to(tl.int32)).to(tl.int64)
        tile = tl.arange(0, TILE)[:, None] * TILE + tl.arange(0, TILE)[None, :]
        out = partial_ptr + (tile_pair * tl.num_programs(0) + pid).to(tl.int64) * (3 * TILE * TILE)
        tl.store(out + tile, acc_bonus)
        tl.store(out + TILE * TILE + tile, acc_m1)
        tl.store(out + 2 * TILE * TILE + tile, acc_m2)
        if tile_pair == 0:
            tl.store(sizes_ptr + pid * 3, size_bonus)
            tl.store(sizes_ptr + pid * 3 + 1, size_m1)
            tl.store(sizes_ptr + pid * 3 + 2, size_m2)


def _gram_config(n_clients: int, signs: torch.Tensor) -> tuple[int, int]:
    """(tile, words per chunk): tile^2 * words pair-words per chunk (4096 on a GPU fit in registers)."""
    tile = min(max(2, triton.next_power_of_2(n_clients)), _MAX_TILE)
    if on_interpreter(signs):
        return tile, min((1 << 18) // (tile * tile), 4096)
    return tile, max(4096 // (tile * tile), 16)


def binary_gram(signs: torch.Tensor, task: torch.Tensor, key: int, t_bonus: int,
                t_m1: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(gram int64 [3, n, n], sizes int64 [3]) on the device: co-negative counts per task set."""
    n_clients, n_words = signs.shape
    params = round_params(key, t_bonus, t_m1, signs.device)
    tile, block_words = _gram_config(n_clients, signs)
    n_tiles = triton.cdiv(n_clients, tile)
    n_blocks = triton.cdiv(n_words, block_words)
    per_program = triton.cdiv(n_blocks, min(n_blocks, program_cap(signs)))
    n_programs = triton.cdiv(n_blocks, per_program)
    partial = torch.zeros((n_tiles * n_tiles, n_programs, 3, tile, tile), dtype=torch.int64,
                          device=signs.device)
    size_partial = torch.empty((n_programs, 3), dtype=torch.int64, device=signs.device)
    _gram_kernel[(n_programs, n_tiles * n_tiles)](
        signs, task, params, partial, size_partial, n_clients, n_words, per_program,
        N_TILES=n_tiles, TILE=tile, BLOCK_WORDS=block_words, num_warps=8)
    per_tile = partial.sum(dim=1)
    padded = n_tiles * tile
    gram = torch.zeros((3, padded, padded), dtype=torch.int64, device=signs.device)
    for ti in range(n_tiles):
        for tj in range(ti, n_tiles):
            counts = per_tile[ti * n_tiles + tj]
            gram[:, ti * tile:(ti + 1) * tile, tj * tile:(tj + 1) * tile] = counts
            gram[:, tj * tile:(tj + 1) * tile, ti * tile:(ti + 1) * tile] = counts.transpose(1, 2)
    return gram[:, :n_clients, :n_clients], size_partial.sum(dim=0)
