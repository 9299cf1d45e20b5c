"""The sampled penalty's draws shared between pairs on the GPU (Triton; many pairs): columns, then one hash per value.

As c runs over the coordinates [0, 2**s), ``v = c ^ key`` runs over the aligned block of 2**s values named
by the key's bits above s: pairs whose keys agree there draw from the same values. So each value is hashed
once and its two *columns* are loaded once (``_columns_kernel``: every client's signs at the r-th member of
M_1, M_2, in ceil(n / 32) words, stored at rank r: no atomics); each pair of the group then only tests, per
lane, bonus(v ^ key) & (sign_i == sign_j), reading the bonus bitmap in whole permuted blocks
(``_shared_draws_kernel``). Random lookups fall from two per draw (n (n - 1) per bonus task) to two per
value (at most 2**32 values in all).

Memory: the columns ((m1 + m2) ceil(n / 32) words) and the bonus bitmap (one word per word of signs).
"""

from __future__ import annotations

import numpy as np
import torch
import triton
import triton.language as tl

from ..intrinsics.triton import as_uint32, lanes_to_words, mix32, not32, on_interpreter, program_cap, round_params
from .triton_sets import exclusive_lane_ranks, member_lanes, plane_tile, set_offsets

# Shared draws keep a tile of columns in registers and pick two of their words per combination: up to
# 4 words (128 clients; 16 combinations unrolled). Larger rounds draw per pair.
MAX_SHARED_CLIENTS = 128


@triton.jit
def _columns_kernel(signs_ptr, task_ptr, params_ptr, offsets_ptr, column1_ptr, column2_ptr, bonus_words_ptr,
                    n_clients, n_words, n_blocks, BLOCK_WORDS: tl.constexpr, COLUMN_WORDS: tl.constexpr):
    """Per block of words: its bonus words, and at each member of M_1 (M_2) every client's sign bit in one
    column of COLUMN_WORDS words, stored at the member's rank (each rank written once: no atomics)."""
    block = tl.program_id(0)
    words = block * BLOCK_WORDS + tl.arange(0, BLOCK_WORDS)
    in_range = words < n_words
    task = tl.load(task_ptr + words, mask=in_range, other=0)
    in_bonus, in_m1, in_m2 = member_lanes(words, task, params_ptr)
    tl.store(bonus_words_ptr + words, lanes_to_words(in_bonus), mask=in_range)
    rank1 = tl.load(offsets_ptr + n_blocks + block) + exclusive_lane_ranks(in_m1.to(tl.int32)).to(tl.int64)
    rank2 = tl.load(offsets_ptr + 2 * n_blocks + block) + exclusive_lane_ranks(in_m2.to(tl.int32)).to(tl.int64)
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


def penalty_columns(signs: torch.Tensor, task: torch.Tensor, key: int, t_bonus: int, t_m1: int, sizes=None):
    """(bonus words int32 [n_words], column1 int32 [m1, CW], column2 [m2, CW], m1, m2) on the device.

    Bit b of word ``bonus_words[w]``: coordinate 32 w + b is a bonus task. Bit i % 32 of
    ``column1[r, i // 32]``: client i's sign at the r-th member of M_1 (CW = ceil(n / 32) words per rank).
    """
    n_clients, n_words = signs.shape
    device = signs.device
    params = round_params(key, t_bonus, t_m1, device)
    block_words, _ = plane_tile(signs)
    offsets, _, m1, m2 = sizes or set_offsets(signs, task, params, block_words)
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


def shared_matches(signs, task, partition, sizes, params, pairs, keys) -> torch.Tensor:
    """``sampled_matches`` drawn shared between pairs (``_shared_draws_kernel``)."""
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
