"""The sampled penalty's draws per pair on the GPU (Triton; few pairs): planes, then a tile of draws per pair group.

``_planes_kernel`` compacts each client's sign bits at the members of M_1 (M_2), in coordinate order, into
a bitstream ``plane[i]`` (client i's sign at the rank-th member is bit ``rank % 32`` of
``plane[i][rank // 32]``): the partition hashed once per block for all clients, the bits compressed by
Hacker's Delight's ``compress`` with masks computed once per block, and assembled into whole words in
registers (a block owns the words its bits fill; only its first and last can hold a neighbour's bits: one
atomic OR each per client and plane, and OR commutes). It also lists the bonus tasks. The draws
(``_draws_kernel``) then run on a persistent grid over that list: per group of ``_PAIRS`` pairs a program
loads a block of bonus tasks once and draws a [pairs, block] tile, two hashes, two ``umulhi`` ranks, two
lookups per draw, counting per lane and adding one total per pair, group and program. All programs walk
the groups in the same order, so the rows read at a time are a few pairs' (in L2).

Memory: the bonus list (4 bytes per bonus task) and the planes (n (m1 + m2) / 32 words).
"""

from __future__ import annotations

import numpy as np
import torch
import triton
import triton.language as tl

from ..intrinsics.triton import (as_uint32, coordinates, lanes_to_words, mix32, not32, on_interpreter, popcount32,
                                 program_cap, round_params)
from .triton_sets import exclusive_lane_ranks, member_lanes, plane_tile, set_offsets

_PAIRS = 4  # ordered pairs per draw tile: their 2 x 4 plane rows are what the programs read at a time


def _draw_block(t: torch.Tensor) -> int:
    """Bonus tasks per draw tile and pair."""
    return 1024 if on_interpreter(t) else 256


@triton.jit
def _compress_stage(mask, mk, SHIFT: tl.constexpr):
    """One stage of Hacker's Delight's ``compress`` (7-4): the bits it moves right by SHIFT."""
    mp = mk ^ (mk << 1)  # parallel suffix of mk
    mp = mp ^ (mp << 2)
    mp = mp ^ (mp << 4)
    mp = mp ^ (mp << 8)
    mp = mp ^ (mp << 16)
    move = mp & mask
    return move, (mask ^ move) | (move >> SHIFT), mk & not32(mp)


@triton.jit
def _plane_layout(member_words, start, BLOCK_WORDS: tl.constexpr):
    """Everything about one block's compaction into a plane that is the same for every client.

    ``member_words`` [BW] uint32: the members of M_1 (or M_2) per word. Returns the five move masks of
    ``compress`` (computed once, applied to every client's words), each word's left shift, and the
    one-hot maps of its low and high parts onto the block's output words (at most BW + 1): each word's
    members land at a bit offset that grows by at most 32 per word, so they fill at most two
    consecutive output words. ``last``: the block's last output word (-1 when it has no member).
    """
    move1, mask, mk = _compress_stage(member_words, not32(member_words) << 1, 1)
    move2, mask, mk = _compress_stage(mask, mk, 2)
    move4, mask, mk = _compress_stage(mask, mk, 4)
    move8, mask, mk = _compress_stage(mask, mk, 8)
    move16, mask, mk = _compress_stage(mask, mk, 16)
    per_word = popcount32(member_words).to(tl.int32)
    first_bit = (start & 31).to(tl.int32)
    bit = first_bit + tl.cumsum(per_word, axis=0) - per_word
    word = bit >> 5
    out = tl.arange(0, 2 * BLOCK_WORDS)
    to_low = word[:, None] == out[None, :]
    to_high = word[:, None] + 1 == out[None, :]
    last = (first_bit + tl.sum(per_word, axis=0) - 1) >> 5
    return move1, move2, move4, move8, move16, (bit & 31).to(tl.uint32), to_low, to_high, last


@triton.jit
def _write_compacted(plane_rows, signs, member_words, layout, start, row_ok, BLOCK_WORDS: tl.constexpr):
    """Write the members' sign bits of each client row of ``signs`` [C, BW] (uint32), compacted, at bit
    ``start`` of its plane row (``plane_rows`` [C] pointers); bits being disjoint, sums are ORs."""
    move1, move2, move4, move8, move16, shift, to_low, to_high, last = layout
    x = signs & member_words[None, :]
    t = x & move1[None, :]
    x = (x ^ t) | (t >> 1)
    t = x & move2[None, :]
    x = (x ^ t) | (t >> 2)
    t = x & move4[None, :]
    x = (x ^ t) | (t >> 4)
    t = x & move8[None, :]
    x = (x ^ t) | (t >> 8)
    t = x & move16[None, :]
    x = (x ^ t) | (t >> 16)
    shift = shift[None, :]
    low = x << shift
    high = tl.where(shift > 0, x >> ((32 - shift) & 31), tl.zeros_like(x))
    zero = tl.zeros((1, BLOCK_WORDS, 2 * BLOCK_WORDS), dtype=tl.uint32)
    assembled = tl.sum(tl.where(to_low[None, :, :], low[:, :, None], zero)
                       + tl.where(to_high[None, :, :], high[:, :, None], zero), axis=1)
    values = assembled.to(tl.int32, bitcast=True)
    out = tl.arange(0, 2 * BLOCK_WORDS)
    targets = plane_rows[:, None] + (start >> 5) + out[None, :]
    row_ok = row_ok[:, None]
    tl.store(targets, values, mask=row_ok & (out > 0)[None, :] & (out < last)[None, :])
    edge = ((out == 0) | (out == last)) & (out <= last)
    tl.atomic_or(targets, values, mask=row_ok & edge[None, :] & (values != 0))


@triton.jit
def _planes_kernel(signs_ptr, task_ptr, params_ptr, offsets_ptr, plane1_ptr, plane2_ptr, bonus_ptr,
                   n_clients, n_words, n_blocks, plane1_words, plane2_words, BLOCK_WORDS: tl.constexpr,
                   CLIENTS: tl.constexpr):
    block = tl.program_id(0)
    words = block * BLOCK_WORDS + tl.arange(0, BLOCK_WORDS)
    in_range = words < n_words
    task = tl.load(task_ptr + words, mask=in_range, other=0)
    in_bonus, in_m1, in_m2 = member_lanes(words, task, params_ptr)
    bonus_index = tl.load(offsets_ptr + block) + exclusive_lane_ranks(in_bonus.to(tl.int32)).to(tl.int64)
    tl.store(bonus_ptr + bonus_index, coordinates(words).to(tl.int32, bitcast=True), mask=in_bonus)
    m1 = as_uint32(lanes_to_words(in_m1))
    m2 = as_uint32(lanes_to_words(in_m2))
    start1 = tl.load(offsets_ptr + n_blocks + block)
    start2 = tl.load(offsets_ptr + 2 * n_blocks + block)
    layout1 = _plane_layout(m1, start1, BLOCK_WORDS)
    layout2 = _plane_layout(m2, start2, BLOCK_WORDS)
    for first in range(0, n_clients, CLIENTS):
        rows = first + tl.arange(0, CLIENTS)
        row_ok = rows < n_clients
        rows = rows.to(tl.int64)
        signs = as_uint32(tl.load(signs_ptr + rows[:, None] * n_words + words[None, :],
                                  mask=row_ok[:, None] & in_range[None, :], other=0))
        _write_compacted(plane1_ptr + rows * plane1_words, signs, m1, layout1, start1, row_ok, BLOCK_WORDS)
        _write_compacted(plane2_ptr + rows * plane2_words, signs, m2, layout2, start2, row_ok, BLOCK_WORDS)


@triton.jit
def _draws_kernel(bonus_ptr, plane1_ptr, plane2_ptr, pairs_ptr, keys_ptr, params_ptr, matches_ptr,
                  n_bonus, n_groups, plane1_words, plane2_words, BLOCK: tl.constexpr, PAIRS: tl.constexpr):
    program = tl.program_id(0)
    n_programs = tl.num_programs(0)
    m1 = tl.load(params_ptr + 3).to(tl.uint32)
    m2 = tl.load(params_ptr + 4).to(tl.uint32)
    draw2_salt = tl.load(params_ptr + 5).to(tl.uint32)
    n_blocks = (n_bonus + BLOCK - 1) // BLOCK
    for group in range(n_groups):
        pair = group * PAIRS + tl.arange(0, PAIRS)
        row1 = plane1_ptr + tl.load(pairs_ptr + 2 * pair).to(tl.int64) * plane1_words
        row2 = plane2_ptr + tl.load(pairs_ptr + 2 * pair + 1).to(tl.int64) * plane2_words
        pair_key = as_uint32(tl.load(keys_ptr + pair))
        # Per-lane counts (< 2**24: a lane counts at most one draw per block of its program): the tile is
        # reduced once per group, not per block.
        hits = tl.zeros((PAIRS, BLOCK), dtype=tl.int32)
        for block in range(program, n_blocks, n_programs):
            task_index = block * BLOCK + tl.arange(0, BLOCK)
            # The list is padded to whole blocks: an unmasked (vector) load; padding is never counted.
            coords = as_uint32(tl.load(bonus_ptr + task_index))
            u1 = mix32(coords[None, :] ^ pair_key[:, None])
            u2 = mix32(u1 ^ draw2_salt)
            rank1 = tl.umulhi(u1, m1)  # (u1 * m1) >> 32: always < m1, so every lookup is in its row
            rank2 = tl.umulhi(u2, m2)
            sign1 = as_uint32(tl.load(row1[:, None] + (rank1 >> 5))) >> (rank1 & 31)
            sign2 = as_uint32(tl.load(row2[:, None] + (rank2 >> 5))) >> (rank2 & 31)
            hits += ((((sign1 ^ sign2) & 1) == 0) & (task_index < n_bonus)[None, :]).to(tl.int32)
        tl.atomic_add(matches_ptr + pair, tl.sum(hits, axis=1).to(tl.int64))


def penalty_planes(signs: torch.Tensor, task: torch.Tensor, key: int, t_bonus: int, t_m1: int, sizes=None):
    """(bonus int32 [>= n_bonus], n_bonus, plane1 int32 [n, m1 // 32 + 1], plane2, m1, m2) on the device.

    ``bonus[:n_bonus]`` are the bonus tasks in increasing order (the list is zero-padded to whole draw
    blocks); bit r of ``plane1[i]`` is client i's sign at the r-th member of M_1. ``sizes``: what
    ``set_offsets`` returned for these words, if already known.
    """
    n_clients, n_words = signs.shape
    device = signs.device
    params = round_params(key, t_bonus, t_m1, device)
    block_words, clients = plane_tile(signs)
    offsets, n_bonus, m1, m2 = sizes or set_offsets(signs, task, params, block_words)
    draw_block = _draw_block(signs)
    bonus = torch.zeros(max((n_bonus + draw_block - 1) // draw_block, 1) * draw_block, dtype=torch.int32,
                        device=device)
    plane1 = torch.zeros((n_clients, m1 // 32 + 1), dtype=torch.int32, device=device)
    plane2 = torch.zeros((n_clients, m2 // 32 + 1), dtype=torch.int32, device=device)
    _planes_kernel[(offsets.shape[1],)](signs, task, params, offsets, plane1, plane2, bonus, n_clients, n_words,
                                        offsets.shape[1], plane1.shape[1], plane2.shape[1], BLOCK_WORDS=block_words,
                                        CLIENTS=clients, num_warps=4)
    return bonus, n_bonus, plane1, plane2, m1, m2


def per_pair_matches(signs, task, partition, sizes, params, pairs, keys) -> torch.Tensor:
    """``sampled_matches`` drawn per pair (``_draws_kernel``)."""
    device = signs.device
    n_pairs = len(pairs)
    bonus, n_bonus, plane1, plane2, m1, m2 = penalty_planes(signs, task, *partition, sizes)
    n_groups = (n_pairs + _PAIRS - 1) // _PAIRS
    # Padding pairs (client 0 with itself, key 0) only fill the last group; their counts are dropped.
    pair_table = np.zeros((n_groups * _PAIRS, 2), dtype=np.int32)
    pair_table[:n_pairs] = pairs
    key_table = np.zeros(n_groups * _PAIRS, dtype=np.uint32)
    key_table[:n_pairs] = keys
    matches = torch.zeros(n_groups * _PAIRS, dtype=torch.int64, device=device)
    draw_block = _draw_block(signs)
    n_programs = max(min(bonus.numel() // draw_block, program_cap(signs)), 1)
    _draws_kernel[(n_programs,)](bonus, plane1, plane2, torch.from_numpy(pair_table).to(device),
                                 torch.from_numpy(key_table.view(np.int32)).to(device), params, matches, n_bonus,
                                 n_groups, plane1.shape[1], plane2.shape[1], BLOCK=draw_block, PAIRS=_PAIRS,
                                 num_warps=4)
    return matches[:n_pairs]
