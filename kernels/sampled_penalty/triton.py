"""The paper's sampled penalty on the GPU (Triton): matches of the seeded (p1, p2) draws per ordered pair.

The work is fixed by the contract (``kfca_llm.partition``): one draw per bonus task c and ordered pair,
``u1 = mix32(c ^ key)``, ``u2 = mix32(u1 ^ salt)``, two ranks, and the two clients' signs at the drawn
members of M_1 and M_2. The partition is derived inside the kernels as in ``pair_counts.triton``. First
``_set_sizes_kernel`` counts the bonus, M_1 and M_2 members per block of words; a device cumsum gives
each block's offsets, and the totals (the one host sync) size the buffers. Then one of two ways:

**Per pair** (``_draws_kernel``; few pairs). ``_planes_kernel`` compacts each client's sign bits at the
members of M_1 (M_2), in coordinate order, into a bitstream ``plane[i]`` (client i's sign at the rank-th
member is bit ``rank % 32`` of ``plane[i][rank // 32]``): the partition hashed once per block for all
clients, the bits compressed by Hacker's Delight's ``compress`` with masks computed once per block, and
assembled into whole words in registers (a block owns the words its bits fill; only its first and last
can hold a neighbour's bits: one atomic OR each per client and plane, and OR commutes). It also lists
the bonus tasks. The draws then run on a persistent grid over that list: per group of ``_PAIRS`` pairs a
program loads a block of bonus tasks once and draws a [pairs, block] tile, two hashes, two ``umulhi``
ranks, two lookups per draw, counting per lane and adding one total per pair, group and program. All
programs walk the groups in the same order, so the rows read at a time are a few pairs' (in L2).

**Shared between pairs** (``_shared_draws_kernel``; many pairs). As c runs over the coordinates
[0, 2**s), ``v = c ^ key`` runs over the aligned block of 2**s values named by the key's bits above s:
pairs whose keys agree there draw from the same values. So each value is hashed once and its two
*columns* are loaded once (``_columns_kernel``: every client's signs at the r-th member of M_1, M_2, in
ceil(n / 32) words, stored at rank r: no atomics); each pair of the group then only tests, per lane,
bonus(v ^ key) & (sign_i == sign_j), reading the bonus bitmap in whole permuted blocks. Random lookups
fall from two per draw (n (n - 1) per bonus task) to two per value (at most 2**32 values in all).
``sampled_matches`` takes the way with fewer random lookups unless told.

Memory: per pair, the bonus list (4 bytes per bonus task) and the planes (n (m1 + m2) / 32 words);
shared, the columns ((m1 + m2) ceil(n / 32) words) and the bonus bitmap (one word per word of signs).
"""

from __future__ import annotations

import numpy as np
import torch
import triton
import triton.language as tl

from ..intrinsics.triton import (as_uint32, coordinates, lanes_to_words, mix32, not32, on_interpreter, popcount32,
                                 program_cap, round_params)

_PAIRS = 4  # ordered pairs per draw tile: their 2 x 4 plane rows are what the programs read at a time
# Shared draws keep a tile of columns in registers and pick two of their words per combination: up to
# 4 words (128 clients; 16 combinations unrolled). Larger rounds draw per pair.
MAX_SHARED_CLIENTS = 128


def _plane_tile(t: torch.Tensor) -> tuple[int, int]:
    """(words per block, clients per step) of the size and plane kernels.

    The interpreter prefers few programs doing wide numpy operations; a GPU many small programs.
    """
    return (64, 32) if on_interpreter(t) else (32, 1)


def _draw_block(t: torch.Tensor) -> int:
    """Bonus tasks per draw tile and pair."""
    return 1024 if on_interpreter(t) else 256


@triton.jit
def _member_lanes(words, task, params_ptr):
    """Lanes [BW, 32] of the bonus set, M_1 and M_2 (task coordinates only) of the given words."""
    key = tl.load(params_ptr).to(tl.uint32)
    t_bonus = tl.load(params_ptr + 1)
    t_m1 = tl.load(params_ptr + 2)
    lanes = tl.arange(0, 32)
    is_task = ((task[:, None] >> lanes[None, :]) & 1) != 0
    u = mix32(coordinates(words) ^ key).to(tl.int64)
    return is_task & (u < t_bonus), is_task & (u >= t_bonus) & (u < t_m1), is_task & (u >= t_m1)


@triton.jit
def _lane_count(lanes):
    return tl.sum(tl.sum(lanes.to(tl.int32), axis=1), axis=0).to(tl.int64)


@triton.jit
def _set_sizes_kernel(task_ptr, params_ptr, sizes_ptr, n_words, n_blocks, BLOCK_WORDS: tl.constexpr):
    block = tl.program_id(0)
    words = block * BLOCK_WORDS + tl.arange(0, BLOCK_WORDS)
    task = tl.load(task_ptr + words, mask=words < n_words, other=0)
    in_bonus, in_m1, in_m2 = _member_lanes(words, task, params_ptr)
    tl.store(sizes_ptr + block, _lane_count(in_bonus))
    tl.store(sizes_ptr + n_blocks + block, _lane_count(in_m1))
    tl.store(sizes_ptr + 2 * n_blocks + block, _lane_count(in_m2))


@triton.jit
def _exclusive_lane_ranks(member):
    """Per member lane [BW, 32] (int32 0/1): members before it in the block, in coordinate order."""
    per_word = tl.sum(member, axis=1)
    return (tl.cumsum(per_word, axis=0) - per_word)[:, None] + tl.cumsum(member, axis=1) - member


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
    in_bonus, in_m1, in_m2 = _member_lanes(words, task, params_ptr)
    bonus_index = tl.load(offsets_ptr + block) + _exclusive_lane_ranks(in_bonus.to(tl.int32)).to(tl.int64)
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


@triton.jit
def _columns_kernel(signs_ptr, task_ptr, params_ptr, offsets_ptr, column1_ptr, column2_ptr, bonus_words_ptr,
                    n_clients, n_words, n_blocks, BLOCK_WORDS: tl.constexpr, COLUMN_WORDS: tl.constexpr):
    """Per block of words: its bonus words, and at each member of M_1 (M_2) every client's sign bit in one
    column of COLUMN_WORDS words, stored at the member's rank (each rank written once: no atomics)."""
    block = tl.program_id(0)
    words = block * BLOCK_WORDS + tl.arange(0, BLOCK_WORDS)
    in_range = words < n_words
    task = tl.load(task_ptr + words, mask=in_range, other=0)
    in_bonus, in_m1, in_m2 = _member_lanes(words, task, params_ptr)
    tl.store(bonus_words_ptr + words, lanes_to_words(in_bonus), mask=in_range)
    rank1 = tl.load(offsets_ptr + n_blocks + block) + _exclusive_lane_ranks(in_m1.to(tl.int32)).to(tl.int64)
    rank2 = tl.load(offsets_ptr + 2 * n_blocks + block) + _exclusive_lane_ranks(in_m2.to(tl.int32)).to(tl.int64)
    lanes = tl.arange(0, 32)
    sign_row = signs_ptr  # advances one client at a time through both loops
    for column_word in range(COLUMN_WORDS):
        column = tl.zeros((BLOCK_WORDS, 32), dtype=tl.int32)
        for bit in range(0, tl.minimum(n_clients - column_word * 32, 32)):
            sign_words = tl.load(sign_row + words, mask=in_range, other=0)
            column |= ((sign_words[:, None] >> lanes[None, :]) & 1) << bit
            sign_row += n_words
        tl.store(column1_ptr + rank1 * COLUMN_WORDS + column_word, column, mask=in_m1)
        tl.store(column2_ptr + rank2 * COLUMN_WORDS + column_word, column, mask=in_m2)


@triton.jit
def _column_word(columns, word, COLUMN_WORDS: tl.constexpr):
    """Word ``word`` (a constant) of each column: [TW, 32, COLUMN_WORDS] -> [TW, 32] uint32."""
    if COLUMN_WORDS == 1:
        selected = tl.sum(columns, axis=2)  # one word per column: nothing to select
    else:
        selected = tl.sum(tl.where(tl.arange(0, COLUMN_WORDS)[None, None, :] == word, columns, 0), axis=2)
    return as_uint32(selected)


@triton.jit
def _shared_draws_kernel(bonus_words_ptr, column1_ptr, column2_ptr, groups_ptr, table_ptr, params_ptr,
                         matches_ptr, n_words, n_tiles, TILE_WORDS: tl.constexpr, COLUMN_WORDS: tl.constexpr):
    """Draws shared between the pairs of a group (their keys agree above the span of the coordinates).

    A tile is 32 * TILE_WORDS consecutive values v of the group's block: each is hashed once
    (``u1 = mix32(v)``, ``u2``, both ranks) and its two columns (every client's sign at the drawn members)
    are loaded once. Then, for each pair of the group, v is the draw of bonus task ``c = v ^ key``: the
    tile maps onto an aligned block of coordinates (``key`` permutes the words and the bits within
    them), so the pair reads its bonus words in whole blocks and counts, per lane, bonus & (sign_i ==
    sign_j). A group's pairs come sorted by the column words they read (i // 32, j // 32), one range per
    combination, so each range reads two words picked once per tile. Tiles no pair of the group has
    coordinates in are skipped. ``groups_ptr`` rows: the block's first value, then COLUMN_WORDS**2 + 1
    range bounds into the pair table (rows i, j, key).
    """
    row = groups_ptr + tl.program_id(0).to(tl.int64) * (COLUMN_WORDS * COLUMN_WORDS + 2)
    base = tl.load(row)
    first = tl.load(row + 1)
    stop = tl.load(row + 1 + COLUMN_WORDS * COLUMN_WORDS)
    m1 = tl.load(params_ptr + 3).to(tl.uint32)
    m2 = tl.load(params_ptr + 4).to(tl.uint32)
    draw2_salt = tl.load(params_ptr + 5).to(tl.uint32)
    lanes = tl.arange(0, 32)
    cw = tl.arange(0, COLUMN_WORDS)
    n_tile_coords = (n_words + TILE_WORDS - 1) // TILE_WORDS
    for tile in range(tl.program_id(1), n_tiles, tl.num_programs(1)):
        used = 0
        for p in range(first, stop):
            # The pair's coordinates for this tile: n_tiles is a power of two, the key's higher bits cancel.
            pair_tile = tile ^ (((tl.load(table_ptr + 3 * p + 2) >> 5) // TILE_WORDS) & (n_tiles - 1))
            used += (pair_tile < n_tile_coords).to(tl.int32)
        if used > 0:
            value_words = (base >> 5) + tile * TILE_WORDS + tl.arange(0, TILE_WORDS)
            values = (value_words.to(tl.uint32) << 5)[:, None] | lanes.to(tl.uint32)[None, :]
            u1 = mix32(values)
            u2 = mix32(u1 ^ draw2_salt)
            rank1 = tl.umulhi(u1, m1).to(tl.int64)
            rank2 = tl.umulhi(u2, m2).to(tl.int64)
            columns1 = tl.load(column1_ptr + (rank1 * COLUMN_WORDS)[:, :, None] + cw[None, None, :])
            columns2 = tl.load(column2_ptr + (rank2 * COLUMN_WORDS)[:, :, None] + cw[None, None, :])
            for word1 in tl.static_range(COLUMN_WORDS):
                signs1 = _column_word(columns1, word1, COLUMN_WORDS)
                for word2 in tl.static_range(COLUMN_WORDS):
                    signs2 = _column_word(columns2, word2, COLUMN_WORDS)
                    bounds = row + 1 + word1 * COLUMN_WORDS + word2
                    for p in range(tl.load(bounds), tl.load(bounds + 1)):
                        i = tl.load(table_ptr + 3 * p)
                        j = tl.load(table_ptr + 3 * p + 1)
                        pair_key = tl.load(table_ptr + 3 * p + 2)
                        coord_words = value_words ^ (pair_key >> 5)  # the key's bits above the span cancel
                        in_words = coord_words < n_words
                        bonus = as_uint32(tl.load(bonus_words_ptr + coord_words, mask=in_words, other=0))
                        bonus_bit = bonus[:, None] >> (lanes ^ (pair_key & 31).to(tl.int32)).to(tl.uint32)[None, :]
                        differ = (signs1 >> (i & 31).to(tl.uint32)) ^ (signs2 >> (j & 31).to(tl.uint32))
                        hits = (bonus_bit & not32(differ) & 1).to(tl.int32)
                        tl.atomic_add(matches_ptr + p, tl.sum(tl.sum(hits, axis=1), axis=0).to(tl.int64),
                                      mask=tl.sum(in_words.to(tl.int32), axis=0) > 0)


def _set_offsets(signs: torch.Tensor, task: torch.Tensor, params: torch.Tensor, block_words: int):
    """(offsets int64 [3, n_blocks]: bonus, M_1 and M_2 members before each block; n_bonus, m1, m2)."""
    n_words = signs.shape[1]
    n_blocks = max((n_words + block_words - 1) // block_words, 1)
    sizes = torch.empty((3, n_blocks), dtype=torch.int64, device=signs.device)
    _set_sizes_kernel[(n_blocks,)](task, params, sizes, n_words, n_blocks, BLOCK_WORDS=block_words, num_warps=4)
    ends = torch.cumsum(sizes, dim=1)
    n_bonus, m1, m2 = (int(v) for v in ends[:, -1].tolist())  # the one host sync: sizes pick the buffers
    return (ends - sizes).contiguous(), n_bonus, m1, m2


def penalty_planes(signs: torch.Tensor, task: torch.Tensor, key: int, t_bonus: int, t_m1: int, sizes=None):
    """(bonus int32 [>= n_bonus], n_bonus, plane1 int32 [n, m1 // 32 + 1], plane2, m1, m2) on the device.

    ``bonus[:n_bonus]`` are the bonus tasks in increasing order (the list is zero-padded to whole draw
    blocks); bit r of ``plane1[i]`` is client i's sign at the r-th member of M_1. ``sizes``: what
    ``_set_offsets`` returned for these words, if already known.
    """
    n_clients, n_words = signs.shape
    device = signs.device
    params = round_params(key, t_bonus, t_m1, device)
    block_words, clients = _plane_tile(signs)
    offsets, n_bonus, m1, m2 = sizes or _set_offsets(signs, task, params, block_words)
    draw_block = _draw_block(signs)
    bonus = torch.zeros(max((n_bonus + draw_block - 1) // draw_block, 1) * draw_block, dtype=torch.int32,
                        device=device)
    plane1 = torch.zeros((n_clients, m1 // 32 + 1), dtype=torch.int32, device=device)
    plane2 = torch.zeros((n_clients, m2 // 32 + 1), dtype=torch.int32, device=device)
    _planes_kernel[(offsets.shape[1],)](signs, task, params, offsets, plane1, plane2, bonus, n_clients, n_words,
                                        offsets.shape[1], plane1.shape[1], plane2.shape[1], BLOCK_WORDS=block_words,
                                        CLIENTS=clients, num_warps=4)
    return bonus, n_bonus, plane1, plane2, m1, m2


def penalty_columns(signs: torch.Tensor, task: torch.Tensor, key: int, t_bonus: int, t_m1: int, sizes=None):
    """(bonus words int32 [n_words], column1 int32 [m1, CW], column2 [m2, CW], m1, m2) on the device.

    Bit b of word ``bonus_words[w]``: coordinate 32 w + b is a bonus task. Bit i % 32 of
    ``column1[r, i // 32]``: client i's sign at the r-th member of M_1 (CW = ceil(n / 32) words per rank).
    """
    n_clients, n_words = signs.shape
    device = signs.device
    params = round_params(key, t_bonus, t_m1, device)
    block_words, _ = _plane_tile(signs)
    offsets, _, m1, m2 = sizes or _set_offsets(signs, task, params, block_words)
    column_words = 1 << max(n_clients - 1, 1).bit_length() - 5 if n_clients > 32 else 1
    bonus_words = torch.empty(n_words, dtype=torch.int32, device=device)
    column1 = torch.empty((max(m1, 1), column_words), dtype=torch.int32, device=device)
    column2 = torch.empty((max(m2, 1), column_words), dtype=torch.int32, device=device)
    _columns_kernel[(offsets.shape[1],)](signs, task, params, offsets, column1, column2, bonus_words, n_clients,
                                         n_words, offsets.shape[1], BLOCK_WORDS=block_words,
                                         COLUMN_WORDS=column_words, num_warps=4)
    return bonus_words, column1, column2, m1, m2


def _shared_groups(keys: np.ndarray, n_words: int, tile_bits: int, pairs: np.ndarray | None = None,
                   column_words: int = 1):
    """Pairs grouped by their key's bits above ``span_bits``: (span_bits, order, bounds, bases).

    A pair draws for bonus task c from ``mix32(c ^ key)``: as c runs over the coordinates [0, 2**span_bits),
    ``v = c ^ key`` runs over the aligned block of 2**span_bits values that the key's high bits name. Pairs
    whose keys share those bits hash and look up the same values v: the shared kernel does each once.
    ``order`` sorts the pairs by group, then by the column words they read (with ``pairs``);
    ``bounds[g]``: the group's column_words**2 + 1 range bounds into ``order``; ``bases[g]``: its first value.
    """
    span_bits = max((32 * n_words - 1).bit_length(), tile_bits)
    high = keys.astype(np.int64) >> span_bits
    combination = np.zeros_like(high) if pairs is None else (pairs[:, 0] // 32) * column_words + pairs[:, 1] // 32
    order = np.lexsort((combination, high))
    groups = np.unique(high)
    starts = np.searchsorted(high[order] * column_words**2 + combination[order],
                             groups[:, None] * column_words**2 + np.arange(column_words**2 + 1)[None, :])
    return span_bits, order, starts, groups << span_bits


def _shared_tile_words(t: torch.Tensor, column_words: int) -> int:
    """Words (of 32 hashed values) per tile of the shared kernel: on a GPU, two [tile, 32, column_words]
    tiles of columns held in registers by 4 warps without spilling."""
    return 512 if on_interpreter(t) else 128 // column_words


def lookup_pairs(n_pairs: int, n_bonus: int, keys: np.ndarray, n_words: int) -> tuple[int, int]:
    """(shared, per pair): the random lookup pairs (one into M_1's members, one into M_2's) of each draw way.
    Shared: the values each group of pairs covers (at most its block, at most its pairs' coordinates); per
    pair: one per pair and bonus task. The draw contract needs at least the smaller of the two."""
    span_bits, _, bounds, _ = _shared_groups(keys, n_words, 0)
    per_group = bounds[:, -1] - bounds[:, 0]
    values = np.minimum(per_group * 32 * n_words, 1 << span_bits).sum()
    return int(values), n_pairs * n_bonus


def shared_draws_pay_off(n_pairs: int, n_bonus: int, keys: np.ndarray, n_words: int) -> bool:
    """Whether hashing and looking up each shared value once (``_shared_draws_kernel``) costs fewer random
    lookups than drawing per pair."""
    shared, per_pair = lookup_pairs(n_pairs, n_bonus, keys, n_words)
    return shared < per_pair


def draws_shared(n_clients: int, n_pairs: int, n_bonus: int, keys: np.ndarray, n_words: int) -> bool:
    """The way ``sampled_matches`` draws when not told: shared between pairs where the shared kernel takes the
    round (up to ``MAX_SHARED_CLIENTS`` clients) and it needs fewer random lookups (``shared_draws_pay_off``)."""
    return n_clients <= MAX_SHARED_CLIENTS and shared_draws_pay_off(n_pairs, n_bonus, keys, n_words)


def sampled_matches(signs: torch.Tensor, task: torch.Tensor, key: int, t_bonus: int, t_m1: int,
                    pairs, pair_keys, draw2_salt: int, shared: bool | None = None) -> torch.Tensor:
    """int64 [P] on the device: matches of the seeded (p1, p2) draws of each ordered pair (i, j).

    ``pair_keys[k]`` is the draw key of ``pairs[k]``. ``shared``: draw with values shared between pairs
    (``_shared_draws_kernel``, up to ``MAX_SHARED_CLIENTS`` clients) or per pair (``_draws_kernel``); None
    chooses the one with fewer random lookups. Raises ``ValueError`` when M_1 or M_2 is empty.
    """
    pairs = np.asarray(pairs, dtype=np.int64).reshape(-1, 2)
    keys = np.asarray(pair_keys, dtype=np.int64).reshape(-1)
    device = signs.device
    n_pairs = len(pairs)
    if not n_pairs:
        return torch.zeros(0, dtype=torch.int64, device=device)
    sizes = _set_offsets(signs, task, round_params(key, t_bonus, t_m1, device), _plane_tile(signs)[0])
    _, n_bonus, m1, m2 = sizes
    if m1 == 0 or m2 == 0:
        raise ValueError(f"too few informative coordinates to form non-empty penalty sets (M_1 {m1}, M_2 {m2})")
    params = round_params(key, t_bonus, t_m1, device, m1, m2, draw2_salt)
    if shared is None:
        shared = draws_shared(signs.shape[0], n_pairs, n_bonus, keys, signs.shape[1])
    elif shared and signs.shape[0] > MAX_SHARED_CLIENTS:
        raise ValueError(f"shared draws take at most {MAX_SHARED_CLIENTS} clients, got {signs.shape[0]}")
    if shared:
        return _shared_matches(signs, task, (key, t_bonus, t_m1), sizes, params, pairs, keys)
    bonus, n_bonus, plane1, plane2, m1, m2 = penalty_planes(signs, task, key, t_bonus, t_m1, sizes)
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


def _shared_matches(signs, task, partition, sizes, params, pairs, keys) -> torch.Tensor:
    device = signs.device
    n_words = signs.shape[1]
    bonus_words, column1, column2, _, _ = penalty_columns(signs, task, *partition, sizes)
    tile_words = _shared_tile_words(signs, column1.shape[1])
    span_bits, order, bounds, bases = _shared_groups(keys, n_words, (tile_words * 32 - 1).bit_length(), pairs,
                                                     column1.shape[1])
    groups = torch.from_numpy(np.concatenate([bases[:, None], bounds], axis=1).astype(np.int64)).to(device)
    table = torch.from_numpy(np.concatenate([pairs[order], keys[order, None]], axis=1).astype(np.int64)).to(device)
    matches = torch.zeros(len(keys), dtype=torch.int64, device=device)
    tiles = (1 << span_bits) // (32 * tile_words)
    per_group = max(min(tiles, program_cap(signs) // len(bases)), 1)
    _shared_draws_kernel[(len(bases), per_group)](
        bonus_words, column1, column2, groups, table, params, matches, n_words, tiles,
        TILE_WORDS=tile_words, COLUMN_WORDS=column1.shape[1], num_warps=4)
    out = torch.empty_like(matches)
    out[torch.from_numpy(order).to(device)] = matches
    return out
