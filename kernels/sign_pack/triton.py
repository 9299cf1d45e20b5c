"""Sign packing on the GPU (Triton): any number of clients' tensors in two launches per float format.

Bit ``e % 32`` of word ``word_offset + e // 32`` for element ``e`` of a tensor: in the client's row of
the sign plane, set where the value is ``< 0`` (sign bit set, magnitude non-zero, not NaN: ``-0.0`` and
NaN are non-negative exactly as in ``x < 0``); in the task plane, shared by all clients, OR-ed with the
non-zero bits; the non-finite flag of (client, tensor) set to 1 where an exponent field is all ones.

Two kernels, both driven by a layout's ``PackPlan`` (``plan.py``, on the device once per layout):

* ``_pack_words_kernel``: one program per block of whole words of one tensor, looping over the launch's
  clients; the block's task words are OR-ed in registers across clients and read-OR-written once per
  launch. The mask is per word (never per element) and every client's address is 16-byte aligned
  (``tl.multiple_of`` on the pointer after the cast), so elements are read as 16-byte vectors; 16-bit
  floats are read as int32 pairs and classified two at a time (SWAR). Element loads are ``evict_first``
  (each is read once; it is also how ``benchmarks/inspect_kernels.py`` tells them from table loads).
* ``_pack_tails_kernel``: the partial last word of each tensor whose size is not a multiple of 32, element
  by element (at most one word per tensor).

Where a client's data comes from: ``FLAT``: one flat buffer per client in layout order, each tensor padded
to whole words (tensor t starts at element ``32 * word_offset[t]``; the padding is never read), one
address per client; otherwise an address per (client, tensor) (the pointer table: the grouped-GEMM
pattern). An address of 0 means "this client sends no such tensor in this launch" (nothing written).
The launcher ``pack`` takes those tables ready-made on the device: the backend builds them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import triton
import triton.language as tl

from ..intrinsics.triton import check_device, not32
from .plan import PackPlan


@dataclass(frozen=True)
class RawFormat:
    """How a float dtype is read: whole words as ``word_dtype`` lanes, tails element by element as ``raw``."""

    raw: torch.dtype
    exp_mask: int
    words_as: tl.dtype
    lanes: int
    """lanes of ``words_as`` per 32-element word (16: two 16-bit floats per int32 lane)."""
    tail_as: tl.dtype


RAW_FORMATS: dict[torch.dtype, RawFormat] = {
    torch.float16: RawFormat(torch.int16, 0x7C00, tl.int32, 16, tl.int16),
    torch.bfloat16: RawFormat(torch.int16, 0x7F80, tl.int32, 16, tl.int16),
    torch.float32: RawFormat(torch.int32, 0x7F800000, tl.int32, 32, tl.int32),
    torch.float64: RawFormat(torch.int64, 0x7FF0000000000000, tl.int64, 32, tl.int64),
}
SUPPORTED_DTYPES = tuple(RAW_FORMATS)

# Words per program: 128 words (4,096 elements, 8 KiB of bf16 per client) with 4 warps gives each thread four
# (bf16) to sixteen (fp64) 16-byte loads per client, no spills, ~18 static SASS instructions per bf16 element
# (64 words: ~25; 256: ~16 but twice the padding waste per tensor; benchmarks/inspect_kernels.py), and still
# ~20,000 programs for a rank-32 Qwen2.5-7B adapter. Chosen from the compiled code, not yet timed on a GPU.
# The interpreter runs programs one after another, so it gets larger blocks to cut Python overhead.
GPU_BLOCK_WORDS = 128
INTERPRETER_BLOCK_WORDS = 512
TAIL_BLOCK = 32
NUM_WARPS = 4


def block_words_for(device: torch.device) -> int:
    return INTERPRETER_BLOCK_WORDS if device.type == "cpu" else GPU_BLOCK_WORDS


@triton.jit
def _two_bits(v):
    """Bits 15 and 31 of each uint32 lane -> bits 0 and 1 (the signs of its two 16-bit halves)."""
    return ((v >> 15) & 1) | ((v >> 30) & 2)


@triton.jit
def _classify_chunk(x, PAIRS: tl.constexpr, EXP_MASK: tl.constexpr):
    """[BW, C] raw lanes, one 16-byte vector of each word -> (sign bits, non-zero bits, non-finite) of its elements:
    int32 [BW] x 2 with the chunk's elements in the low bits (2 per lane with PAIRS), bool [BW]."""
    if PAIRS:
        # Two 16-bit floats per lane. Per half, magnitude m = h & 0x7FFF: m + 0x7FFF reaches bit 15 iff m != 0,
        # m + (0x7FFF - EXP) iff m > EXP (NaN), m + (0x8000 - EXP) iff m >= EXP (NaN or Inf); no sum carries
        # into the other half.
        u = x.to(tl.uint32, bitcast=True)
        m = u & 0x7FFF7FFF
        nonzero = (m + 0x7FFF7FFF) & 0x80008000
        nan = (m + (0x7FFF - EXP_MASK) * 0x00010001) & 0x80008000
        nonfinite = (m + (0x8000 - EXP_MASK) * 0x00010001) & 0x80008000
        negative = u & nonzero & not32(nan)
        shift = (2 * tl.arange(0, x.shape[1])).to(tl.uint32)[None, :]
        sign_bits = tl.sum(_two_bits(negative) << shift, axis=1).to(tl.int32, bitcast=True)
        nonzero_bits = tl.sum(_two_bits(nonzero) << shift, axis=1).to(tl.int32, bitcast=True)
        bad = tl.max(nonfinite, axis=1) != 0
    else:
        magnitude = x & ~(tl.full((), 1, x.dtype) << (x.dtype.primitive_bitwidth - 1))
        nonzero = magnitude != 0
        negative = (x < 0) & nonzero & (magnitude <= EXP_MASK)
        lanes = tl.arange(0, x.shape[1])[None, :]
        sign_bits = tl.sum(negative.to(tl.int32) << lanes, axis=1)  # disjoint lanes: the sum is the OR
        nonzero_bits = tl.sum(nonzero.to(tl.int32) << lanes, axis=1)
        bad = tl.max((magnitude >= EXP_MASK).to(tl.int32), axis=1) != 0
    return sign_bits, nonzero_bits, bad


@triton.jit
def _pack_words_kernel(table_ptr, subset_ptr, block_tensor_ptr, block_word_ptr, full_words_ptr, word_offsets_ptr,
                       signs_ptr, task_ptr, flags_ptr, n_sources, n_columns, n_subset, row_words, n_tensors,
                       FLAT: tl.constexpr, SUBSET: tl.constexpr, RAW: tl.constexpr, LANES: tl.constexpr,
                       EXP_MASK: tl.constexpr, BLOCK_WORDS: tl.constexpr):
    """Words ``[block_word, block_word + BLOCK_WORDS)`` (cut at the tensor's full words) of one tensor, every source.

    ``table``: int64 [rows of the sources' clients (n_sources) | addresses]; ``subset`` (SUBSET): int64 [block ids
    (n_subset) | column of each block's tensor in the address table].
    """
    pid = tl.program_id(0)
    if SUBSET:
        block = tl.load(subset_ptr + pid)
    else:
        block = pid
    tensor = tl.load(block_tensor_ptr + block)
    if SUBSET:
        column = tl.load(subset_ptr + n_subset + pid)
    else:
        column = tensor
    offset = tl.load(word_offsets_ptr + tensor)
    words = tl.load(block_word_ptr + block) + tl.arange(0, BLOCK_WORDS)
    full = tl.load(full_words_ptr + tensor)
    in_words = words < full
    CHUNK: tl.constexpr = 128 // RAW.primitive_bitwidth  # lanes of one 16-byte vector
    BITS: tl.constexpr = 32 // (LANES // CHUNK)  # elements of one 16-byte vector
    elements = words[:, None] * LANES + tl.arange(0, CHUNK)[None, :]
    task_words = tl.zeros((BLOCK_WORDS,), dtype=tl.int32)
    for source in range(n_sources):
        row = tl.load(table_ptr + source)
        if FLAT:
            address = tl.load(table_ptr + n_sources + source)
        else:
            address = tl.load(table_ptr + n_sources + source * n_columns + column)
        # A word mask, never an element mask: loads stay 16-byte vectors. (Not ``in_words & (address != 0)``:
        # the interpreter types a block & scalar-comparison mask as int32.)
        keep = words < tl.where(address != 0, full, 0)
        base = tl.multiple_of(address.to(tl.pointer_type(RAW)), 16)
        if FLAT:
            base += offset * LANES
        sign_words = tl.zeros((BLOCK_WORDS,), dtype=tl.int32)
        nonzero_words = tl.zeros((BLOCK_WORDS,), dtype=tl.int32)
        bad = tl.zeros((BLOCK_WORDS,), dtype=tl.int1)
        # A word's 16-byte vectors one at a time: each [BLOCK_WORDS, CHUNK] load gives a thread whole rows, so the
        # bits of a word are gathered in one thread's registers (one [BLOCK_WORDS, LANES] load spread a word over
        # 4-8 threads, whose bits then met through shuffles).
        for chunk in tl.static_range(LANES // CHUNK):
            x = tl.load(base + elements + chunk * CHUNK, mask=keep[:, None], other=0, eviction_policy="evict_first")
            chunk_signs, chunk_nonzero, chunk_bad = _classify_chunk(x, LANES == 16, EXP_MASK)
            sign_words |= chunk_signs << (chunk * BITS)
            nonzero_words |= chunk_nonzero << (chunk * BITS)
            bad |= chunk_bad
        tl.store(signs_ptr + row * row_words + offset + words, sign_words, mask=keep)
        task_words |= nonzero_words
        # Every word that saw a NaN/Inf stores the same 1: no reduction over the block needed.
        tl.store(flags_ptr + row * n_tensors + tensor + 0 * words, tl.full((BLOCK_WORDS,), 1, tl.int32),
                 mask=keep & bad)
    old = tl.load(task_ptr + offset + words, mask=in_words, other=0)
    tl.store(task_ptr + offset + words, old | task_words, mask=in_words)


@triton.jit
def _pack_tails_kernel(table_ptr, subset_ptr, tail_tensors_ptr, full_words_ptr, word_offsets_ptr, numels_ptr,
                       signs_ptr, task_ptr, flags_ptr, n_sources, n_columns, n_tails, subset_start, row_words,
                       n_tensors, FLAT: tl.constexpr, SUBSET: tl.constexpr, RAW: tl.constexpr,
                       EXP_MASK: tl.constexpr, TAIL_BLOCK: tl.constexpr):
    """The partial last word of ``TAIL_BLOCK`` tensors, every source (elements read one by one).

    SUBSET: ``subset[subset_start:]`` holds [tail tensor ids (n_tails) | their columns in the address table].
    """
    index = tl.program_id(0) * TAIL_BLOCK + tl.arange(0, TAIL_BLOCK)
    valid = index < n_tails
    if SUBSET:
        tensor = tl.load(subset_ptr + subset_start + index, mask=valid, other=0)
        column = tl.load(subset_ptr + subset_start + n_tails + index, mask=valid, other=0)
    else:
        tensor = tl.load(tail_tensors_ptr + index, mask=valid, other=0).to(tl.int64)
        column = tensor
    full = tl.load(full_words_ptr + tensor, mask=valid, other=0)
    count = tl.load(numels_ptr + tensor, mask=valid, other=0) - 32 * full
    offset = tl.load(word_offsets_ptr + tensor, mask=valid, other=0)
    lanes = tl.arange(0, 32)
    in_tail = valid[:, None] & (lanes[None, :] < count[:, None])
    elements = (32 * full)[:, None] + lanes[None, :]
    if FLAT:
        elements += (32 * offset)[:, None]
    task_words = tl.zeros((TAIL_BLOCK,), dtype=tl.int32)
    for source in range(n_sources):
        row = tl.load(table_ptr + source)
        if FLAT:
            address = tl.load(table_ptr + n_sources + source) + 0 * index
        else:
            address = tl.load(table_ptr + n_sources + source * n_columns + column, mask=valid, other=0)
        present = valid & (address != 0)
        x = tl.load(address.to(tl.pointer_type(RAW))[:, None] + elements, mask=in_tail & present[:, None], other=0,
                    eviction_policy="evict_first")
        if RAW.primitive_bitwidth == 16:
            x = x.to(tl.int32)  # sign-extends: sign and magnitude bits unchanged
            magnitude = x & 0x7FFF
        else:
            magnitude = x & ~(tl.full((), 1, x.dtype) << (x.dtype.primitive_bitwidth - 1))
        nonzero = magnitude != 0
        negative = (x < 0) & nonzero & (magnitude <= EXP_MASK)
        sign_words = tl.sum(negative.to(tl.int32) << lanes[None, :], axis=1)
        task_words |= tl.sum(nonzero.to(tl.int32) << lanes[None, :], axis=1)
        tl.store(signs_ptr + row * row_words + offset + full, sign_words, mask=present)
        bad = tl.max((magnitude >= EXP_MASK).to(tl.int32), axis=1) != 0
        tl.store(flags_ptr + row * n_tensors + tensor, tl.full((TAIL_BLOCK,), 1, tl.int32), mask=present & bad)
    old = tl.load(task_ptr + offset + full, mask=valid, other=0)
    tl.store(task_ptr + offset + full, old | task_words, mask=valid)


@dataclass(frozen=True)
class DevicePlan:
    """A ``PackPlan``'s tables on one device (uploaded once per layout and device)."""

    plan: PackPlan
    block_tensor: torch.Tensor
    block_word: torch.Tensor
    full_words: torch.Tensor
    word_offsets: torch.Tensor
    numels: torch.Tensor
    tail_tensors: torch.Tensor

    @classmethod
    def upload(cls, plan: PackPlan, device: torch.device) -> "DevicePlan":
        arrays = (plan.block_tensor, plan.block_word, plan.full_words, plan.word_offsets, plan.numels,
                  plan.tail_tensors)
        return cls(plan, *(torch.from_numpy(np.ascontiguousarray(a)).to(device) for a in arrays))


@dataclass(frozen=True)
class Subset:
    """The blocks and tails of some of a layout's tensors, as one int64 device tensor ``tables``:
    [block ids | their columns | tail tensor ids | their columns] (``n_blocks``, ``n_tails`` long)."""

    tables: torch.Tensor
    n_blocks: int
    n_tails: int


def subset_tables(plan: PackPlan, tensors: np.ndarray) -> np.ndarray:
    """Host tables of a launch over ``tensors`` (layout indices; column c of the address table is tensors[c])."""
    blocks, block_columns = plan.blocks_of(tensors)
    tails = np.flatnonzero(plan.tails[tensors])
    return np.concatenate([blocks, block_columns, tensors[tails].astype(np.int64), tails]), blocks.size, tails.size


def pack(dtype: torch.dtype, plan: DevicePlan, table: torch.Tensor, n_sources: int, signs: torch.Tensor,
         task: torch.Tensor, flags: torch.Tensor, *, flat: bool, subset: Subset | None = None) -> None:
    """Pack ``n_sources`` clients' tensors of one float ``dtype`` (two launches, queued; nothing read back).

    ``table``: int64 on the device, [row of each source's client | addresses]: one per source (``flat``: the
    client's padded flat buffer) or one per source and tensor (the tensors of ``subset`` in its column order,
    or every tensor of the layout), 16-byte aligned, 0 where the source lacks that tensor. ``signs`` int32
    [n_clients, n_words] and ``task`` int32 [n_words] contiguous, ``flags`` int32 [n_clients, n_tensors] (rows
    may be strided), all on the table's device.
    """
    check_device(signs)
    fmt = RAW_FORMATS[dtype]
    p = plan.plan
    n_columns = 1 if flat else (table.numel() - n_sources) // n_sources
    n_blocks = p.block_tensor.size if subset is None else subset.n_blocks
    n_tails = p.tail_tensors.size if subset is None else subset.n_tails
    subset_ptr = table if subset is None else subset.tables
    common = (signs, task, flags, n_sources, n_columns)
    if n_blocks:
        _pack_words_kernel[(n_blocks,)](
            table, subset_ptr, plan.block_tensor, plan.block_word, plan.full_words, plan.word_offsets, *common,
            n_blocks, signs.stride(0), flags.stride(0), FLAT=flat, SUBSET=subset is not None, RAW=fmt.words_as,
            LANES=fmt.lanes, EXP_MASK=fmt.exp_mask, BLOCK_WORDS=p.block_words, num_warps=NUM_WARPS)
    if n_tails:
        _pack_tails_kernel[(-(-n_tails // TAIL_BLOCK),)](
            table, subset_ptr, plan.tail_tensors, plan.full_words, plan.word_offsets, plan.numels, *common,
            n_tails, 2 * n_blocks, signs.stride(0), flags.stride(0), FLAT=flat, SUBSET=subset is not None,
            RAW=fmt.tail_as, EXP_MASK=fmt.exp_mask, TAIL_BLOCK=TAIL_BLOCK, num_warps=NUM_WARPS)


def sign_pack(values: torch.Tensor, signs: torch.Tensor, task: torch.Tensor, flags: torch.Tensor, *,
              client: int, tensor: int, word_offset: int) -> None:
    """Pack one tensor of one client (any shape; fp16/bf16/fp32/fp64 on the buffers' device) in place.

    Writes words ``[word_offset, word_offset + ceil(numel / 32))`` of row ``client``, ORs the same words of
    ``task``, sets ``flags[client, tensor]`` if it holds NaN/Inf. A one-tensor plan: for tests and one-off use
    (the backends pack through a layout's cached plan).
    """
    if values.dtype not in RAW_FORMATS:
        raise TypeError(f"sign_pack supports {SUPPORTED_DTYPES}, got {values.dtype}")
    check_device(signs)
    raw = values.detach().contiguous()
    if raw.data_ptr() % 16:
        raw = raw.clone()
    device = signs.device
    plan = PackPlan.build([raw.numel()], [word_offset], block_words_for(device))
    table = torch.tensor([client, raw.data_ptr()], dtype=torch.int64).to(device)
    # A one-tensor layout: its flags column 0 is column ``tensor`` of ``flags``.
    pack(values.dtype, DevicePlan.upload(plan, device), table, 1, signs, task, flags[:, tensor:], flat=False)
