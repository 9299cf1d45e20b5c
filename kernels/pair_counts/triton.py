"""Binary Gram counts over packed sign words on the GPU (Triton): ``popcount(s_i & s_j & set)`` per task set.

Partition: the class of coordinate ``c = 32 * w + lane`` is derived from the counter hash of
``kfca_llm.partition`` (``u = mix32(c ^ key)``, bonus if ``u < t_bonus``, M_1 if ``u < t_m1``, else M_2),
so no index array of size d is ever built. The kernels take those integers as they are:
``kfca_llm.partition.partition_params`` derives them from a seed.

Two launches:

* ``_set_planes_kernel`` hashes every coordinate once and writes the three set planes (a set's member word
  is its class's lanes AND-ed with the task word: 3 words per word of signs) and adds up the set sizes.
  Hashing 32 lanes per word costs ~10x a word's popcounts, so it is done once per round, not once per pair;
  each thread builds whole words, lane by lane, with 32-bit compares.
* ``_gram_tiles_kernel`` counts. A program owns one tile pair (``TILE`` row clients x ``TILE`` column
  clients, ``ti < tj``) or one diagonal tile, and one contiguous range of words. Each thread holds one word
  per client of the tile(s) and the three set words, and keeps its counters in registers across the whole
  range (no reduction inside the loop): per word and pair, one 3-input AND, one ``popc`` and one add per
  set, so the loop runs at the popcount unit's rate. The counters are summed across threads once, at the
  end. A diagonal tile counts only its ``TILE (TILE + 1) / 2`` pairs: its words against themselves (the
  diagonal), against the tile rotated by one client (``TILE`` pairs, for ``TILE = 4``) and its first half
  against its second (``TILE / 2``): 10 popcounts per set for a tile of 4 where a tile pair takes 16, so 20
  clients count the 210 pairs they need, not 240. Programs are numbered tile pair first, so the programs
  resident at one time read the same range of words, which stays in L2 while every tile reads it.

Every program adds its int64 counts to the totals with integer atomics: exact, and the same whatever order
they land in (no float), with no partial sums to reduce afterwards.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import torch
import triton
import triton.language as tl

from ..intrinsics.triton import as_uint32, mix32, on_interpreter, popcount32, round_params

_SETS = 3


@triton.jit
def _set_planes_kernel(task_ptr, params_ptr, planes_ptr, sizes_ptr, n_words, BLOCK_WORDS: tl.constexpr):
    """planes [3, n_words]: bonus, M_1 and M_2 member words (class lanes & task); sizes [3]: their members, added."""
    pid = tl.program_id(0)
    key = tl.load(params_ptr).to(tl.uint32)
    t_bonus = tl.load(params_ptr + 1)
    t_m1 = tl.load(params_ptr + 2)
    words = pid * BLOCK_WORDS + tl.arange(0, BLOCK_WORDS)
    in_range = words < n_words
    task = tl.load(task_ptr + words, mask=in_range, other=0)
    first = words.to(tl.uint32) << 5
    # u < t on uint32 (one compare, not three 64-bit ones); a threshold of 2^32 takes every u.
    below_bonus = tl.minimum(t_bonus, 0xFFFFFFFF).to(tl.uint32)
    below_m1 = tl.minimum(t_m1, 0xFFFFFFFF).to(tl.uint32)
    all_bonus = t_bonus > 0xFFFFFFFF
    all_m1 = t_m1 > 0xFFFFFFFF
    in_bonus = tl.zeros((BLOCK_WORDS,), dtype=tl.int32)
    in_m1_or_bonus = tl.zeros((BLOCK_WORDS,), dtype=tl.int32)
    # Lane by lane, so that each thread builds its own words (a sum over a lane axis crosses threads).
    for lane in tl.static_range(32):
        u = mix32((first | lane) ^ key)
        in_bonus |= ((u < below_bonus) | all_bonus).to(tl.int32) << lane
        in_m1_or_bonus |= ((u < below_m1) | all_m1).to(tl.int32) << lane
    bonus = in_bonus & task
    m1 = in_m1_or_bonus & ~in_bonus & task
    m2 = ~in_m1_or_bonus & task
    tl.store(planes_ptr + words, bonus, mask=in_range)
    tl.store(planes_ptr + n_words + words, m1, mask=in_range)
    tl.store(planes_ptr + 2 * n_words + words, m2, mask=in_range)
    tl.atomic_add(sizes_ptr, tl.sum(popcount32(as_uint32(bonus)).to(tl.int64)), sem="relaxed")
    tl.atomic_add(sizes_ptr + 1, tl.sum(popcount32(as_uint32(m1)).to(tl.int64)), sem="relaxed")
    tl.atomic_add(sizes_ptr + 2, tl.sum(popcount32(as_uint32(m2)).to(tl.int64)), sem="relaxed")


@triton.jit
def _set_words(planes_ptr, words, in_range, n_words):
    """The bonus, M_1 and M_2 member words of ``words`` (uint32; 0 outside ``in_range``)."""
    bonus = as_uint32(tl.load(planes_ptr + words, mask=in_range, other=0))
    m1 = as_uint32(tl.load(planes_ptr + n_words + words, mask=in_range, other=0))
    m2 = as_uint32(tl.load(planes_ptr + 2 * n_words + words, mask=in_range, other=0))
    return bonus, m1, m2


@triton.jit
def _count_tile_pair(signs_ptr, planes_ptr, tiles_ptr, out, pair, n_clients, n_words, start, stop,
                     TILE: tl.constexpr, BLOCK: tl.constexpr):
    """out [3, TILE, TILE] int64 += the counts of tile pair ``pair`` (``ti < tj``) over words ``[start, stop)``."""
    ti = tl.load(tiles_ptr + 2 * pair)
    tj = tl.load(tiles_ptr + 2 * pair + 1)
    rows = ti * TILE + tl.arange(0, TILE)
    cols = tj * TILE + tl.arange(0, TILE)
    row_base = rows.to(tl.int64) * n_words
    col_base = cols.to(tl.int64) * n_words
    acc_bonus = tl.zeros((TILE, TILE, BLOCK), dtype=tl.int32)
    acc_m1 = tl.zeros((TILE, TILE, BLOCK), dtype=tl.int32)
    acc_m2 = tl.zeros((TILE, TILE, BLOCK), dtype=tl.int32)
    for offset in range(start, stop, BLOCK):
        words = offset + tl.arange(0, BLOCK)
        in_range = words < stop
        bonus, m1, m2 = _set_words(planes_ptr, words, in_range, n_words)
        row_words = tl.load(signs_ptr + row_base[:, None] + words[None, :],
                            mask=(rows[:, None] < n_clients) & in_range[None, :], other=0)
        col_words = tl.load(signs_ptr + col_base[:, None] + words[None, :],
                            mask=(cols[:, None] < n_clients) & in_range[None, :], other=0)
        both = as_uint32(row_words)[:, None, :] & as_uint32(col_words)[None, :, :]
        acc_bonus += popcount32(both & bonus[None, None, :]).to(tl.int32)
        acc_m1 += popcount32(both & m1[None, None, :]).to(tl.int32)
        acc_m2 += popcount32(both & m2[None, None, :]).to(tl.int32)
    tile = tl.arange(0, TILE)[:, None] * TILE + tl.arange(0, TILE)[None, :]
    # A thread's counter is at most 32 x (range / BLOCK); summed over the BLOCK threads in int64.
    tl.atomic_add(out + tile, tl.sum(acc_bonus.to(tl.int64), axis=2), sem="relaxed")
    tl.atomic_add(out + TILE * TILE + tile, tl.sum(acc_m1.to(tl.int64), axis=2), sem="relaxed")
    tl.atomic_add(out + 2 * TILE * TILE + tile, tl.sum(acc_m2.to(tl.int64), axis=2), sem="relaxed")


@triton.jit
def _store_diagonal_block(out, own, following, half, diagonal, upper, lower, lanes, TILE: tl.constexpr):
    """One set's TILE x TILE block of a diagonal tile += the three groups of per-thread counters."""
    tl.atomic_add(out + diagonal, tl.sum(own.to(tl.int64), axis=1), sem="relaxed")
    if TILE == 4:
        rotated = tl.sum(following.to(tl.int64), axis=1)
        tl.atomic_add(out + lanes * TILE + (lanes + 1) % TILE, rotated, sem="relaxed")
        tl.atomic_add(out + ((lanes + 1) % TILE) * TILE + lanes, rotated, sem="relaxed")
    halves = tl.sum(half.to(tl.int64), axis=1)
    tl.atomic_add(out + upper, halves, sem="relaxed")
    tl.atomic_add(out + lower, halves, sem="relaxed")


@triton.jit
def _count_diagonal_tile(signs_ptr, out, planes_ptr, t, n_clients, n_words, start, stop,
                         TILE: tl.constexpr, BLOCK: tl.constexpr):
    """out [3, TILE, TILE] int64 += the counts of the pairs inside tile ``t`` (TILE 2 or 4) over words ``[start, stop)``.

    A thread's words of the tile against themselves (the diagonal), against the tile rotated by one client (pairs
    (0, 1), (1, 2), (2, 3), (3, 0) of a tile of 4) and the first half against the second ((0, 2), (1, 3)): every
    unordered pair once, each written to both of its cells.
    """
    tl.static_assert(TILE == 2 or TILE == 4, "the diagonal kernel covers tiles of 2 or 4 clients")
    HALF: tl.constexpr = TILE // 2
    lanes = tl.arange(0, TILE)
    halves = tl.arange(0, HALF)
    own_base = (t * TILE + lanes).to(tl.int64) * n_words
    next_base = (t * TILE + (lanes + 1) % TILE).to(tl.int64) * n_words
    first_base = (t * TILE + halves).to(tl.int64) * n_words
    second_base = (t * TILE + HALF + halves).to(tl.int64) * n_words
    own_valid = t * TILE + lanes < n_clients
    next_valid = t * TILE + (lanes + 1) % TILE < n_clients
    first_valid = t * TILE + halves < n_clients
    second_valid = t * TILE + HALF + halves < n_clients
    own_bonus = tl.zeros((TILE, BLOCK), dtype=tl.int32)
    own_m1 = tl.zeros((TILE, BLOCK), dtype=tl.int32)
    own_m2 = tl.zeros((TILE, BLOCK), dtype=tl.int32)
    next_bonus = tl.zeros((TILE, BLOCK), dtype=tl.int32)
    next_m1 = tl.zeros((TILE, BLOCK), dtype=tl.int32)
    next_m2 = tl.zeros((TILE, BLOCK), dtype=tl.int32)
    half_bonus = tl.zeros((HALF, BLOCK), dtype=tl.int32)
    half_m1 = tl.zeros((HALF, BLOCK), dtype=tl.int32)
    half_m2 = tl.zeros((HALF, BLOCK), dtype=tl.int32)
    for offset in range(start, stop, BLOCK):
        words = offset + tl.arange(0, BLOCK)
        in_range = words < stop
        bonus, m1, m2 = _set_words(planes_ptr, words, in_range, n_words)
        own = as_uint32(tl.load(signs_ptr + own_base[:, None] + words[None, :],
                                mask=own_valid[:, None] & in_range[None, :], other=0))
        own_bonus += popcount32(own & bonus[None, :]).to(tl.int32)
        own_m1 += popcount32(own & m1[None, :]).to(tl.int32)
        own_m2 += popcount32(own & m2[None, :]).to(tl.int32)
        if TILE == 4:  # with 2 clients the rotation repeats the halves' pair
            following = as_uint32(tl.load(signs_ptr + next_base[:, None] + words[None, :],
                                          mask=next_valid[:, None] & in_range[None, :], other=0))
            both = own & following
            next_bonus += popcount32(both & bonus[None, :]).to(tl.int32)
            next_m1 += popcount32(both & m1[None, :]).to(tl.int32)
            next_m2 += popcount32(both & m2[None, :]).to(tl.int32)
        first = tl.load(signs_ptr + first_base[:, None] + words[None, :],
                        mask=first_valid[:, None] & in_range[None, :], other=0)
        second = tl.load(signs_ptr + second_base[:, None] + words[None, :],
                         mask=second_valid[:, None] & in_range[None, :], other=0)
        both = as_uint32(first) & as_uint32(second)
        half_bonus += popcount32(both & bonus[None, :]).to(tl.int32)
        half_m1 += popcount32(both & m1[None, :]).to(tl.int32)
        half_m2 += popcount32(both & m2[None, :]).to(tl.int32)
    diagonal = lanes * TILE + lanes
    upper = halves * TILE + HALF + halves
    lower = (HALF + halves) * TILE + halves
    _store_diagonal_block(out, own_bonus, next_bonus, half_bonus, diagonal, upper, lower, lanes, TILE)
    _store_diagonal_block(out + TILE * TILE, own_m1, next_m1, half_m1, diagonal, upper, lower, lanes, TILE)
    _store_diagonal_block(out + 2 * TILE * TILE, own_m2, next_m2, half_m2, diagonal, upper, lower, lanes, TILE)


@triton.jit
def _gram_tiles_kernel(signs_ptr, planes_ptr, tiles_ptr, blocks_ptr, n_pairs, n_clients, n_words,
                       words_per_program, TILE: tl.constexpr, BLOCK: tl.constexpr):
    """blocks [tile pairs + tiles, 3, TILE, TILE] int64 += this program's counts of its tile pair (the first
    ``n_pairs`` programs of a part) or diagonal tile (the rest) over its range of words."""
    program = tl.program_id(0)
    part = tl.program_id(1)
    start = part * words_per_program
    stop = tl.minimum(start + words_per_program, n_words)
    out = blocks_ptr + program * (3 * TILE * TILE)
    # One launch for both kinds: the programs resident at one time share their word range in L2.
    if program < n_pairs:
        _count_tile_pair(signs_ptr, planes_ptr, tiles_ptr, out, program, n_clients, n_words, start, stop, TILE, BLOCK)
    else:
        _count_diagonal_tile(signs_ptr, out, planes_ptr, program - n_pairs, n_clients, n_words, start, stop, TILE,
                             BLOCK)


@dataclass(frozen=True)
class GramConfig:
    """How ``binary_gram`` tiles a round: clients per tile side, warps per program, programs to aim at."""

    tile: int
    num_warps: int
    target_programs: int
    planes_block: int

    @property
    def block(self) -> int:
        """Words per pass of a program's loop: one per thread."""
        return 32 * self.num_warps


def gram_config(n_clients: int, t: torch.Tensor) -> GramConfig:
    """The default tiling: tiles of 4 clients (3 x 16 counters per thread fit in registers beside the words),
    2 for two clients; on a GPU ~64 programs per SM (many waves, so the last one's idle tail is small), in
    the interpreter a few programs with wide numpy operations."""
    tile = 2 if n_clients <= 2 else 4
    if on_interpreter(t):
        return GramConfig(tile=tile, num_warps=32, target_programs=8, planes_block=1024)
    sms = torch.cuda.get_device_properties(t.device).multi_processor_count
    return GramConfig(tile=tile, num_warps=4, target_programs=64 * sms, planes_block=256)


@lru_cache(maxsize=64)
def _tile_pairs(n_tiles: int, device: torch.device) -> torch.Tensor:
    """[P, 2] int32 (ti, tj), ti < tj, row-major over the upper triangle (diagonal tiles have their own code path).
    Cached per device: a round's launches then need no copy from the host."""
    ti, tj = np.triu_indices(n_tiles, 1)
    return torch.from_numpy(np.stack([ti, tj], axis=1).astype(np.int32)).to(device)


@lru_cache(maxsize=64)
def _gram_index(n_clients: int, tile: int, device: torch.device) -> torch.Tensor:
    """[3, n, n] int64: where count (set, i, j) lies in the flat [tile pairs + tiles, 3, TILE, TILE] totals, so that
    one gather assembles the Gram matrices (the lower triangle read from the upper's transposed block)."""
    n_tiles = -(-n_clients // tile)
    pair_of = np.full((n_tiles, n_tiles), -1, dtype=np.int64)
    ti, tj = np.triu_indices(n_tiles, 1)
    pair_of[ti, tj] = np.arange(ti.size)
    pair_of[np.arange(n_tiles), np.arange(n_tiles)] = ti.size + np.arange(n_tiles)  # diagonal tiles come last
    i, j = np.meshgrid(np.arange(n_clients), np.arange(n_clients), indexing="ij")
    upper = i // tile <= j // tile
    row = np.where(upper, i, j)  # (row, col) of the count in the upper triangle of tiles
    col = np.where(upper, j, i)
    block = pair_of[row // tile, col // tile]
    cell = (row % tile) * tile + col % tile
    index = (block * _SETS)[None] * tile * tile + np.arange(_SETS)[:, None, None] * tile * tile + cell[None]
    return torch.from_numpy(index).to(device)


def set_planes(task: torch.Tensor, key: int, t_bonus: int, t_m1: int,
               block_words: int = 256) -> tuple[torch.Tensor, torch.Tensor]:
    """(planes int32 [3, n_words], sizes int64 [3]): each task set's member words and member counts."""
    n_words = task.numel()
    params = round_params(key, t_bonus, t_m1, task.device)
    planes = torch.empty((_SETS, n_words), dtype=torch.int32, device=task.device)
    sizes = torch.zeros(_SETS, dtype=torch.int64, device=task.device)
    _set_planes_kernel[(triton.cdiv(n_words, block_words),)](task, params, planes, sizes, n_words,
                                                             BLOCK_WORDS=block_words, num_warps=4)
    return planes, sizes


def binary_gram(signs: torch.Tensor, task: torch.Tensor, key: int, t_bonus: int, t_m1: int,
                config: GramConfig | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(gram int64 [3, n, n], sizes int64 [3]) on the device: co-negative counts per task set.

    ``config`` overrides the default tiling (``gram_config``): the benchmark compares tilings with it.
    """
    n_clients, n_words = signs.shape
    config = config or gram_config(n_clients, signs)
    device = signs.device
    if n_words == 0 or n_clients == 0:
        return (torch.zeros((_SETS, n_clients, n_clients), dtype=torch.int64, device=device),
                torch.zeros(_SETS, dtype=torch.int64, device=device))
    planes, sizes = set_planes(task, key, t_bonus, t_m1, config.planes_block)
    tile, block = config.tile, config.block
    n_tiles = -(-n_clients // tile)
    tiles = _tile_pairs(n_tiles, device)
    n_pairs = tiles.shape[0]
    n_blocks = -(-n_words // block)
    parts = min(max(-(-config.target_programs // (n_pairs + n_tiles)), 1), n_blocks)
    words_per_program = -(-n_blocks // parts) * block
    parts = -(-n_words // words_per_program)
    blocks = torch.zeros((n_pairs + n_tiles, _SETS, tile, tile), dtype=torch.int64, device=device)
    # One tile: no tile pairs; a non-empty int32 buffer stands in for the empty table (never read).
    _gram_tiles_kernel[(n_pairs + n_tiles, parts)](signs, planes, tiles if n_pairs else planes, blocks, n_pairs,
                                                   n_clients, n_words, words_per_program, TILE=tile, BLOCK=block,
                                                   num_warps=config.num_warps)
    return blocks.view(-1)[_gram_index(n_clients, tile, device)], sizes
