"""What the Triton kernels share: SWAR popcount, the partition hash, word/lane helpers, launch helpers.

The bit helpers work on ``tl.uint32`` so that ``>>`` is a logical shift (on signed types it is
arithmetic); callers bitcast int32 words first. Compiled for sm_90, ``popcount32`` becomes one
``popc.b32``; unlike ``libdevice.popc`` it also runs under ``TRITON_INTERPRET=1``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction

from kfca_llm.errors import BackendUnavailable


@triton.jit
def popcount32(x):
    """Number of set bits of each uint32 lane (returns uint32)."""
    x = x - ((x >> 1) & 0x55555555)
    x = (x & 0x33333333) + ((x >> 2) & 0x33333333)
    x = (x + (x >> 4)) & 0x0F0F0F0F
    return (x * 0x01010101) >> 24


@triton.jit
def mix32(x):
    """lowbias32 hash of each uint32 lane, identical to ``kfca_llm.partition.mix32`` (wrapping)."""
    x = x ^ (x >> 16)
    x = x * 0x7FEB352D
    x = x ^ (x >> 15)
    x = x * 0x846CA68B
    return x ^ (x >> 16)


@triton.jit
def as_uint32(words):
    """Reinterpret int32 words as uint32 (no value change), for logical shifts and popcount."""
    return words.to(tl.uint32, bitcast=True)


@triton.jit
def not32(x):
    """``~x`` of uint32 words, as ``x ^ 0xFFFFFFFF``: Triton 3.7's interpreter (what pip gives Python 3.13 beside
    torch 2.13) cannot build the all-ones uint32 that ``~`` takes under numpy >= 2.5."""
    return x ^ 0xFFFFFFFF


@triton.jit
def coordinates(words):
    """Task coordinates [BW, 32] (uint32) of the bits of the given word indices."""
    lanes = tl.arange(0, 32)
    return (words.to(tl.uint32) << 5)[:, None] | lanes.to(tl.uint32)[None, :]


@triton.jit
def lanes_to_words(bits):
    """Pack a [BW, 32] boolean tile into [BW] int32 words (bit lane of each word)."""
    lanes = tl.arange(0, 32)
    return tl.sum(bits.to(tl.int32) << lanes[None, :], axis=1)


# ----------------------------------------------------------------------------- launch helpers


def kernels_interpreted() -> bool:
    """Whether these kernels were defined under ``TRITON_INTERPRET=1`` (triton reads it when a kernel is
    decorated, so it is what this module's import saw, not what the environment says now)."""
    return isinstance(popcount32, InterpretedFunction)


def check_device(where: torch.Tensor | torch.device) -> None:
    """Interpreted kernels take CPU tensors, compiled ones CUDA tensors: anything else (a tensor or a device) is
    refused here (the interpreter would dereference a CUDA pointer as a host address and crash the process)."""
    device = where.device if isinstance(where, torch.Tensor) else torch.device(where)
    if kernels_interpreted():
        if device.type != "cpu":
            raise BackendUnavailable(
                f"the Triton kernels run under TRITON_INTERPRET=1 (on the CPU) but got tensors on {device}: "
                "unset TRITON_INTERPRET before anything imports triton to run them compiled on the GPU, or pass CPU "
                "tensors")
    elif device.type != "cuda":
        raise BackendUnavailable(
            f"the compiled Triton kernels need CUDA tensors, got tensors on {device}: set TRITON_INTERPRET=1 "
            "before anything imports triton to run them on the CPU (slow, for tests), or use backend='cpu'")


def on_interpreter(t: torch.Tensor) -> bool:
    """Whether ``t``'s kernels run interpreted (CPU tensors); a tensor on the wrong kind of device is refused."""
    check_device(t)
    return t.device.type == "cpu"


def program_cap(t: torch.Tensor) -> int:
    """Persistent-grid size: a few programs per SM on a GPU; few, long programs in the interpreter."""
    if on_interpreter(t):
        return 16
    return 4 * torch.cuda.get_device_properties(t.device).multi_processor_count


def round_params(key: int, t_bonus: int, t_m1: int, device, m1: int = 0, m2: int = 0,
                 draw2_salt: int = 0) -> torch.Tensor:
    """[partition key, t_bonus, t_m1, m1, m2, draw2 salt] as int64 on the device (loaded, never specialized).

    On a GPU the values go through pinned memory without blocking: a copy from pageable memory waits for the
    stream's queued kernels first, which left the GPU idle while the host launched the rest of a round."""
    values = torch.tensor([key, t_bonus, t_m1, m1, m2, draw2_salt], dtype=torch.int64)
    if torch.device(device).type != "cuda":
        return values.to(device)
    return values.pin_memory().to(device, non_blocking=True)
