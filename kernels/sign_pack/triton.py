"""Stream one float tensor into packed sign bits (one launch per tensor).

The kernel reads the tensor's raw bits (the launcher views bf16/fp16 as int16, fp32 as int32 and
fp64 as int64, so neither the interpreter nor the compiler ever sees bf16 arithmetic) and writes,
for the element ``e`` of the tensor, bit ``e % 32`` of word ``word_offset + e // 32``:

* sign plane (the client's row): set where the value is ``< 0`` (sign bit set, magnitude non-zero,
  not NaN), so ``-0.0`` and NaN are non-negative exactly as in ``x < 0``;
* task plane (shared by all clients): OR-ed with the non-zero bits (magnitude bits non-zero);
* non-finite flag of (client, tensor): set to 1 where any exponent field is all ones (NaN/Inf).
  Nothing is read back per tensor: the packer checks all flags once before scoring.

Padding bits past the tensor's last element are 0 in both planes. Each program owns its words,
so the task plane is a plain read-OR-write; launches on one stream never overlap.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# Raw-bit view and (exponent mask, mantissa mask) of each supported float dtype.
_RAW_FORMAT: dict[torch.dtype, tuple[torch.dtype, int, int]] = {
    torch.float16: (torch.int16, 0x7C00, 0x03FF),
    torch.bfloat16: (torch.int16, 0x7F80, 0x007F),
    torch.float32: (torch.int32, 0x7F800000, 0x007FFFFF),
    torch.float64: (torch.int64, 0x7FF0000000000000, 0x000FFFFFFFFFFFFF),
}
SUPPORTED_DTYPES = tuple(_RAW_FORMAT)

# Words per program: 128 words = 4096 elements (8 KiB of bf16) keeps every load a 16-byte vector
# and gives enough programs to fill an H100 with one LoRA tensor. The interpreter runs programs
# one after another, so it gets large blocks to cut Python overhead.
_GPU_BLOCK_WORDS = 128
_INTERPRETER_BLOCK_WORDS = 1024


@triton.jit
def _pack_block(raw_ptr, first_word, numel, signs_ptr, task_ptr, flags_ptr, sign_base, task_base, flag_index,
                BLOCK_WORDS: tl.constexpr, EXP_MASK: tl.constexpr, MANT_MASK: tl.constexpr, WIDEN: tl.constexpr):
    """Pack words [first_word, first_word + BLOCK_WORDS) of one tensor (masked at its end)."""
    lanes = tl.arange(0, 32)
    words = first_word + tl.arange(0, BLOCK_WORDS)
    elems = words[:, None] * 32 + lanes[None, :]
    in_tensor = elems < numel
    x = tl.load(raw_ptr + elems, mask=in_tensor, other=0)
    if WIDEN:
        x = x.to(tl.int32)  # sign-extends the 16-bit pattern; low 15 bits unchanged
    exponent = x & EXP_MASK
    mantissa = x & MANT_MASK
    nonzero = (exponent | mantissa) != 0
    all_ones = exponent == EXP_MASK
    is_nan = all_ones & (mantissa != 0)
    negative = (x < 0) & nonzero & (is_nan == 0)
    # Disjoint lanes: the int32 sum equals the OR (lane 31 wraps into the sign bit as intended).
    sign_words = tl.sum(negative.to(tl.int32) << lanes[None, :], axis=1)
    nonzero_words = tl.sum(nonzero.to(tl.int32) << lanes[None, :], axis=1)
    in_words = words < (numel + 31) // 32
    tl.store(signs_ptr + sign_base + words, sign_words, mask=in_words)
    task_old = tl.load(task_ptr + task_base + words, mask=in_words, other=0)
    tl.store(task_ptr + task_base + words, task_old | nonzero_words, mask=in_words)
    bad = tl.max(all_ones.to(tl.int32))
    tl.store(flags_ptr + flag_index, bad, mask=bad != 0)


@triton.jit(do_not_specialize=["numel", "sign_base", "task_base", "flag_index"])
def _sign_pack_kernel(raw_ptr, signs_ptr, task_ptr, flags_ptr, numel, sign_base, task_base, flag_index,
                      BLOCK_WORDS: tl.constexpr, EXP_MASK: tl.constexpr, MANT_MASK: tl.constexpr,
                      WIDEN: tl.constexpr):
    first_word = tl.program_id(0).to(tl.int64) * BLOCK_WORDS
    _pack_block(raw_ptr, first_word, numel, signs_ptr, task_ptr, flags_ptr, sign_base, task_base, flag_index,
                BLOCK_WORDS, EXP_MASK, MANT_MASK, WIDEN)


@triton.jit(do_not_specialize=["sign_row", "flag_row"])
def _sign_pack_grouped_kernel(addresses_ptr, numels_ptr, word_offsets_ptr, tensor_ids_ptr, block_member_ptr,
                              block_word_ptr, signs_ptr, task_ptr, flags_ptr, sign_row, flag_row,
                              RAW_DTYPE: tl.constexpr, BLOCK_WORDS: tl.constexpr, EXP_MASK: tl.constexpr,
                              MANT_MASK: tl.constexpr, WIDEN: tl.constexpr):
    """Many tensors of one client in one launch: program -> (member tensor, first word) from a table.

    Tensors are separate allocations, so their addresses come in as int64 and are cast to pointers
    (the grouped-GEMM pattern); every member has the same float format.
    """
    pid = tl.program_id(0)
    member = tl.load(block_member_ptr + pid)
    first_word = tl.load(block_word_ptr + pid)
    raw_ptr = tl.load(addresses_ptr + member).to(tl.pointer_type(RAW_DTYPE))
    numel = tl.load(numels_ptr + member)
    word_offset = tl.load(word_offsets_ptr + member)
    flag_index = flag_row + tl.load(tensor_ids_ptr + member)
    _pack_block(raw_ptr, first_word, numel, signs_ptr, task_ptr, flags_ptr, sign_row + word_offset, word_offset,
                flag_index, BLOCK_WORDS, EXP_MASK, MANT_MASK, WIDEN)


def _launch_sign_pack(raw: torch.Tensor, exp_mask: int, mant_mask: int, signs: torch.Tensor,
                      task: torch.Tensor, flags: torch.Tensor, sign_base: int, task_base: int,
                      flag_index: int) -> None:
    numel = raw.numel()
    block_words = _INTERPRETER_BLOCK_WORDS if raw.device.type == "cpu" else _GPU_BLOCK_WORDS
    grid = (triton.cdiv(numel, 32 * block_words),)
    _sign_pack_kernel[grid](raw, signs, task, flags, numel, sign_base, task_base, flag_index,
                            BLOCK_WORDS=block_words, EXP_MASK=exp_mask, MANT_MASK=mant_mask,
                            WIDEN=raw.element_size() == 2, num_warps=4)


def sign_pack(values: torch.Tensor, signs: torch.Tensor, task: torch.Tensor, flags: torch.Tensor, *,
              client: int, tensor: int, word_offset: int) -> None:
    """Pack ``values`` (any shape; fp16/bf16/fp32/fp64, same device as the buffers) in place.

    ``signs`` int32 [n_clients, n_words], ``task`` int32 [n_words], ``flags`` int32
    [n_clients, n_tensors], all contiguous. Writes words ``[word_offset, word_offset +
    ceil(numel / 32))`` of row ``client``, ORs the same words of ``task``, flags (client, tensor).
    """
    try:
        raw_dtype, exp_mask, mant_mask = _RAW_FORMAT[values.dtype]
    except KeyError:
        raise TypeError(f"sign_pack supports {SUPPORTED_DTYPES}, got {values.dtype}") from None
    # One tensor at a time: a non-contiguous view costs one copy of this tensor only.
    raw = values.contiguous().view(-1).view(raw_dtype)
    n_words = signs.shape[1]
    _launch_sign_pack(raw, exp_mask, mant_mask, signs, task, flags,
                      sign_base=client * n_words + word_offset, task_base=word_offset,
                      flag_index=client * flags.shape[1] + tensor)


_TL_RAW = {torch.int16: tl.int16, torch.int32: tl.int32, torch.int64: tl.int64}


def sign_pack_many(values: list[torch.Tensor], signs: torch.Tensor, task: torch.Tensor, flags: torch.Tensor, *,
                   client: int, tensors: list[int], word_offsets: list[int]) -> None:
    """Pack several tensors of one client, all of one float dtype, in a single launch.

    Same effect as ``sign_pack`` on each ``(values[m], tensors[m], word_offsets[m])``; saves the
    per-tensor launch cost that dominates for a LoRA state dict of hundreds of small tensors.
    """
    dtype = values[0].dtype
    if any(v.dtype != dtype for v in values) or dtype not in _RAW_FORMAT:
        raise TypeError(f"sign_pack_many needs tensors of one dtype among {SUPPORTED_DTYPES}")
    raw_dtype, exp_mask, mant_mask = _RAW_FORMAT[dtype]
    # Keep the (possibly copied) contiguous views alive until the launch is queued.
    raws = [v.contiguous().view(-1).view(raw_dtype) for v in values]
    device = signs.device
    block_words = _INTERPRETER_BLOCK_WORDS if device.type == "cpu" else _GPU_BLOCK_WORDS
    numels = [r.numel() for r in raws]
    blocks = [triton.cdiv(triton.cdiv(n, 32), block_words) for n in numels]
    block_member = torch.repeat_interleave(torch.arange(len(raws)), torch.tensor(blocks))
    first_block = torch.tensor([0] + blocks[:-1]).cumsum(0)
    block_word = (torch.arange(int(sum(blocks))) - first_block[block_member]) * block_words
    table = torch.tensor([[r.data_ptr() for r in raws], numels, list(word_offsets), list(tensors)],
                         dtype=torch.int64)
    table, block_member, block_word = (t.to(device, non_blocking=True) for t in (table, block_member, block_word))
    _sign_pack_grouped_kernel[(int(sum(blocks)),)](
        table[0], table[1], table[2], table[3], block_member, block_word, signs, task, flags,
        client * signs.shape[1], client * flags.shape[1], RAW_DTYPE=_TL_RAW[raw_dtype], BLOCK_WORDS=block_words,
        EXP_MASK=exp_mask, MANT_MASK=mant_mask, WIDEN=raws[0].element_size() == 2,
        num_warps=4)
