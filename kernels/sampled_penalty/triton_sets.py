"""The partition's sets on the GPU (Triton), what both draw ways start from: the bonus set, M_1 and M_2.

The partition is derived inside the kernels as in ``pair_counts.triton``. ``_set_sizes_kernel`` counts
the bonus, M_1 and M_2 members per block of words; a device cumsum gives each block's offsets, and the
totals (the one host sync) size the buffers of the draw way that follows.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..intrinsics.triton import coordinates, mix32, on_interpreter


def plane_tile(t: torch.Tensor) -> tuple[int, int]:
    """(words per block, clients per step) of the size and plane kernels.

    The interpreter prefers few programs doing wide numpy operations; a GPU many small programs.
    """
    return (64, 32) if on_interpreter(t) else (32, 1)


@triton.jit
def member_lanes(words, task, params_ptr):
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
    in_bonus, in_m1, in_m2 = member_lanes(words, task, params_ptr)
    tl.store(sizes_ptr + block, _lane_count(in_bonus))
    tl.store(sizes_ptr + n_blocks + block, _lane_count(in_m1))
    tl.store(sizes_ptr + 2 * n_blocks + block, _lane_count(in_m2))


@triton.jit
def exclusive_lane_ranks(member):
    """Per member lane [BW, 32] (int32 0/1): members before it in the block, in coordinate order."""
    per_word = tl.sum(member, axis=1)
    return (tl.cumsum(per_word, axis=0) - per_word)[:, None] + tl.cumsum(member, axis=1) - member


def set_offsets(signs: torch.Tensor, task: torch.Tensor, params: torch.Tensor, block_words: int):
    """(offsets int64 [3, n_blocks]: bonus, M_1 and M_2 members before each block; n_bonus, m1, m2)."""
    n_words = signs.shape[1]
    n_blocks = max((n_words + block_words - 1) // block_words, 1)
    sizes = torch.empty((3, n_blocks), dtype=torch.int64, device=signs.device)
    _set_sizes_kernel[(n_blocks,)](task, params, sizes, n_words, n_blocks, BLOCK_WORDS=block_words, num_warps=4)
    ends = torch.cumsum(sizes, dim=1)
    n_bonus, m1, m2 = (int(v) for v in ends[:, -1].tolist())  # the one host sync: sizes pick the buffers
    return (ends - sizes).contiguous(), n_bonus, m1, m2
