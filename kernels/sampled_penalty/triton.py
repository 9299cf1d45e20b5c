"""The paper's sampled penalty on the GPU (Triton): matches of the seeded (p1, p2) draws per ordered pair.

The partition is derived inside the kernels as in ``kfca_llm.kernels.pair_counts.triton``.

``sampled_matches`` (the paper's per-bonus-task draws): finding the rank-th member of M_1 (M_2)
is a select over a bitstream, which is slow when done per draw. Instead, once per call, each
client's sign bits at the members of M_1 (M_2) are compacted, in increasing coordinate order,
into a bitstream ``plane[i]`` of ``ceil(m / 32)`` words, so that the sign of client ``i`` at the
rank-th member is simply bit ``rank % 32`` of ``plane[i][rank // 32]``: one gather per draw.
Building the planes takes two launches plus a device cumsum (per-block member counts; then each
program compresses its block's bits per client, pext-style, and ORs the result at its bit offset
with at most two atomic ORs per source word; OR commutes, so it is deterministic). Memory: the two
planes hold n * (m1 + m2) / 32 int32 words, less than the sign buffer itself.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..intrinsics.triton import as_uint32, coordinates, mix32, on_interpreter, program_cap, round_params

_MAX_GRID_Y = 65535


@triton.jit
def _penalty_lanes(words, task, params_ptr):
    """Member lanes [BW, 32] of M_1 and M_2 (task coordinates only) of the given words."""
    key = tl.load(params_ptr).to(tl.uint32)
    t_bonus = tl.load(params_ptr + 1)
    t_m1 = tl.load(params_ptr + 2)
    lanes = tl.arange(0, 32)
    is_task = ((task[:, None] >> lanes[None, :]) & 1) != 0
    u = mix32(coordinates(words) ^ key).to(tl.int64)
    return is_task & (u >= t_bonus) & (u < t_m1), is_task & (u >= t_m1)


@triton.jit
def _penalty_count_kernel(task_ptr, params_ptr, counts_ptr, n_words, n_blocks,
                          BLOCK_WORDS: tl.constexpr):
    block = tl.program_id(0)
    words = block * BLOCK_WORDS + tl.arange(0, BLOCK_WORDS)
    task = tl.load(task_ptr + words, mask=words < n_words, other=0)
    in_m1, in_m2 = _penalty_lanes(words, task, params_ptr)
    tl.store(counts_ptr + block, tl.sum(tl.sum(in_m1.to(tl.int32), axis=1), axis=0).to(tl.int64))
    tl.store(counts_ptr + n_blocks + block,
             tl.sum(tl.sum(in_m2.to(tl.int32), axis=1), axis=0).to(tl.int64))


@triton.jit
def _or_compressed(plane_ptr, sign_lanes, member_lanes, dest_bit, valid):
    """OR each word's member sign bits, compressed (pext), at bit ``dest_bit`` of ``plane``."""
    rank = tl.cumsum(member_lanes, axis=1) - member_lanes
    compressed = as_uint32(tl.sum((sign_lanes & member_lanes) << rank, axis=1))
    shift = (dest_bit & 31).to(tl.uint32)
    word = dest_bit >> 5
    low = compressed << shift
    high = tl.where(shift > 0, compressed >> ((32 - shift) & 31), 0)
    tl.atomic_or(plane_ptr + word, low.to(tl.int32, bitcast=True), mask=valid & (low != 0))
    tl.atomic_or(plane_ptr + word + 1, high.to(tl.int32, bitcast=True), mask=valid & (high != 0))


@triton.jit
def _compact_kernel(signs_ptr, task_ptr, params_ptr, offsets_ptr, plane1_ptr, plane2_ptr,
                    n_clients, n_words, n_blocks, plane1_words, plane2_words,
                    BLOCK_WORDS: tl.constexpr):
    block = tl.program_id(0)
    words = block * BLOCK_WORDS + tl.arange(0, BLOCK_WORDS)
    in_range = words < n_words
    task = tl.load(task_ptr + words, mask=in_range, other=0)
    in_m1, in_m2 = _penalty_lanes(words, task, params_ptr)
    m1_lanes = in_m1.to(tl.int32)
    m2_lanes = in_m2.to(tl.int32)
    count1 = tl.sum(m1_lanes, axis=1)
    count2 = tl.sum(m2_lanes, axis=1)
    dest1 = tl.load(offsets_ptr + block) + (tl.cumsum(count1, axis=0) - count1).to(tl.int64)
    dest2 = tl.load(offsets_ptr + n_blocks + block) + (tl.cumsum(count2, axis=0) - count2).to(tl.int64)
    lanes = tl.arange(0, 32)
    # Row pointers advance by one row per client (no 32-bit row * stride product).
    sign_row = signs_ptr
    plane1_row = plane1_ptr
    plane2_row = plane2_ptr
    for _ in range(n_clients):
        sign_words = tl.load(sign_row + words, mask=in_range, other=0)
        sign_lanes = (sign_words[:, None] >> lanes[None, :]) & 1
        _or_compressed(plane1_row, sign_lanes, m1_lanes, dest1, in_range)
        _or_compressed(plane2_row, sign_lanes, m2_lanes, dest2, in_range)
        sign_row += n_words
        plane1_row += plane1_words
        plane2_row += plane2_words


@triton.jit
def _draw_signs(plane_ptr, rank):
    """Sign bit (0/1, int32) at the rank-th member, from a compacted plane."""
    words = tl.load(plane_ptr + (rank >> 5), mask=rank >= 0, other=0)
    return ((as_uint32(words) >> (rank & 31).to(tl.uint32)) & 1).to(tl.int32)


@triton.jit
def _sampled_kernel(task_ptr, params_ptr, plane1_ptr, plane2_ptr, pairs_ptr, keys_ptr, partial_ptr,
                    pair_base, n_words, plane1_words, plane2_words, blocks_per_program,
                    BLOCK_WORDS: tl.constexpr):
    pid = tl.program_id(0)
    pair = pair_base + tl.program_id(1)
    i = tl.load(pairs_ptr + 2 * pair).to(tl.int64)
    j = tl.load(pairs_ptr + 2 * pair + 1).to(tl.int64)
    pair_key = tl.load(keys_ptr + pair).to(tl.uint32)
    key = tl.load(params_ptr).to(tl.uint32)
    t_bonus = tl.load(params_ptr + 1)
    m1 = tl.load(params_ptr + 3).to(tl.uint64)
    m2 = tl.load(params_ptr + 4).to(tl.uint64)
    draw2_salt = tl.load(params_ptr + 5).to(tl.uint32)
    lanes = tl.arange(0, 32)
    matches = tl.zeros((), dtype=tl.int64)
    for k in range(blocks_per_program):
        words = (pid * blocks_per_program + k) * BLOCK_WORDS + tl.arange(0, BLOCK_WORDS)
        task = tl.load(task_ptr + words, mask=words < n_words, other=0)
        coords = coordinates(words)
        is_bonus = (((task[:, None] >> lanes[None, :]) & 1) != 0) & (
            mix32(coords ^ key).to(tl.int64) < t_bonus)
        u1 = mix32(coords ^ pair_key)
        u2 = mix32(u1 ^ draw2_salt)
        rank1 = tl.where(is_bonus, ((u1.to(tl.uint64) * m1) >> 32).to(tl.int64), -1)
        rank2 = tl.where(is_bonus, ((u2.to(tl.uint64) * m2) >> 32).to(tl.int64), -1)
        sign1 = _draw_signs(plane1_ptr + i * plane1_words, rank1)
        sign2 = _draw_signs(plane2_ptr + j * plane2_words, rank2)
        hit = is_bonus & (sign1 == sign2)
        matches += tl.sum(tl.sum(hit.to(tl.int32), axis=1), axis=0).to(tl.int64)
    tl.store(partial_ptr + pair.to(tl.int64) * tl.num_programs(0) + pid, matches)


def penalty_planes(signs: torch.Tensor, task: torch.Tensor, key: int, t_bonus: int,
                   t_m1: int) -> tuple[torch.Tensor, torch.Tensor, int, int]:
    """(plane1 int32 [n, ceil(m1/32)], plane2 int32 [n, ceil(m2/32)], m1, m2): compacted signs."""
    n_clients, n_words = signs.shape
    params = round_params(key, t_bonus, t_m1, signs.device)
    block_words = 1024 if on_interpreter(signs) else 64
    n_blocks = triton.cdiv(n_words, block_words)
    counts = torch.empty((2, n_blocks), dtype=torch.int64, device=signs.device)
    _penalty_count_kernel[(n_blocks,)](task, params, counts, n_words, n_blocks,
                                       BLOCK_WORDS=block_words, num_warps=4)
    ends = torch.cumsum(counts, dim=1)
    m1, m2 = (int(v) for v in ends[:, -1].tolist())  # one host sync: sizes pick the plane lengths
    offsets = (ends - counts).contiguous()
    w1, w2 = max(triton.cdiv(m1, 32), 1), max(triton.cdiv(m2, 32), 1)
    plane1 = torch.zeros((n_clients, w1), dtype=torch.int32, device=signs.device)
    plane2 = torch.zeros((n_clients, w2), dtype=torch.int32, device=signs.device)
    _compact_kernel[(n_blocks,)](signs, task, params, offsets, plane1, plane2, n_clients, n_words,
                                 n_blocks, w1, w2, BLOCK_WORDS=block_words, num_warps=4)
    return plane1, plane2, m1, m2


def sampled_matches(signs: torch.Tensor, task: torch.Tensor, key: int, t_bonus: int, t_m1: int,
                    pairs, pair_keys, draw2_salt: int) -> torch.Tensor:
    """int64 [P] on the device: matches of the seeded (p1, p2) draws of each ordered pair (i, j).

    ``pair_keys[k]`` is the draw key of ``pairs[k]``. Raises ``ValueError`` when M_1 or M_2 is empty.
    """
    pairs_list = [(int(i), int(j)) for i, j in pairs]
    n_clients, n_words = signs.shape
    device = signs.device
    if not pairs_list:
        return torch.zeros(0, dtype=torch.int64, device=device)
    plane1, plane2, m1, m2 = penalty_planes(signs, task, key, t_bonus, t_m1)
    if m1 == 0 or m2 == 0:
        raise ValueError(f"too few informative coordinates to form non-empty penalty sets (M_1 {m1}, M_2 {m2})")
    params = round_params(key, t_bonus, t_m1, device, m1, m2, draw2_salt)
    pair_tensor = torch.tensor(pairs_list, dtype=torch.int32, device=device)
    keys = torch.as_tensor([int(k) for k in pair_keys], dtype=torch.int64, device=device)
    block_words = 1024 if on_interpreter(signs) else 32
    n_blocks = triton.cdiv(n_words, block_words)
    per_program = triton.cdiv(n_blocks, min(n_blocks, program_cap(signs)))
    n_programs = triton.cdiv(n_blocks, per_program)
    partial = torch.empty((len(pairs_list), n_programs), dtype=torch.int64, device=device)
    for base in range(0, len(pairs_list), _MAX_GRID_Y):
        count = min(_MAX_GRID_Y, len(pairs_list) - base)
        _sampled_kernel[(n_programs, count)](
            task, params, plane1, plane2, pair_tensor, keys, partial, base, n_words,
            plane1.shape[1], plane2.shape[1], per_program, BLOCK_WORDS=block_words, num_warps=4)
    return partial.sum(dim=1)
