"""GPU backend ("triton"): torch buffers on the device, the Triton kernels of ``kfca_llm.kernels``
(``<operation>/triton.py``). The registry imports this module only when the backend is first asked for
(``kfca_llm.engine``): triton is optional (Linux only) and slow to import.

Tensors stream in one at a time (a CPU tensor is copied to the device, packed, and can be freed);
only 1 bit per coordinate per client plus the shared task mask stay resident. Without a CUDA
device the same kernels run under ``TRITON_INTERPRET=1`` on CPU tensors (slow; used by tests).
"""

from __future__ import annotations

import os

import numpy as np
import torch

from ..errors import InputError
from ..kernels.pair_counts import triton as pair_counts
from ..kernels.sampled_penalty import triton as sampled_penalty
from ..kernels.sign_pack import triton as sign_pack
from ..partition import DRAW2_SALT, MAX_CLIENTS, pair_keys, partition_params
from .backends import Backend, BackendUnavailable, PackedBuffers
from .layout import Layout
from .stats import RoundCounts


def _interpreter_enabled() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


class TritonBackend(Backend):
    name = "triton"

    def __init__(self):
        if not torch.cuda.is_available() and not _interpreter_enabled():
            raise BackendUnavailable(
                "the triton backend needs a CUDA device (torch.cuda.is_available() is False); "
                "set TRITON_INTERPRET=1 before importing triton to run its kernels on the CPU "
                "(slow, for tests), or use backend='cpu'")

    def _device(self, device) -> torch.device:
        if device is None:
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        device = torch.device(device)
        if device.type == "cuda" and not torch.cuda.is_available():
            raise BackendUnavailable(f"device {device} requested but CUDA is not available")
        if device.type == "cpu" and not _interpreter_enabled():
            raise BackendUnavailable("CPU tensors need TRITON_INTERPRET=1 for the triton backend")
        if device.type not in ("cuda", "cpu"):
            raise BackendUnavailable(f"the triton backend runs on CUDA devices, not {device}")
        return device

    def allocate(self, n_clients: int, layout: Layout, device=None) -> PackedBuffers:
        if not 2 <= n_clients <= MAX_CLIENTS:
            raise InputError(f"need between 2 and {MAX_CLIENTS} clients, got {n_clients}")
        device = self._device(device)
        return PackedBuffers(
            layout=layout,
            signs=torch.zeros((n_clients, layout.n_words), dtype=torch.int32, device=device),
            task=torch.zeros(layout.n_words, dtype=torch.int32, device=device),
            nonfinite=torch.zeros((n_clients, len(layout.slots)), dtype=torch.int32, device=device),
            device=device,
        )

    def _device_tensor(self, buffers: PackedBuffers, tensor: int, values) -> torch.Tensor:
        slot = buffers.layout.slots[tensor]
        if isinstance(values, np.ndarray):
            values = torch.from_numpy(np.ascontiguousarray(values))
        if not isinstance(values, torch.Tensor):
            raise InputError(f"expected a torch tensor or numpy array, got {type(values).__name__}",
                             tensor=slot.name)
        if values.dtype not in sign_pack.SUPPORTED_DTYPES:
            raise InputError(f"dtype {values.dtype} is not one of {sign_pack.SUPPORTED_DTYPES}",
                             tensor=slot.name)
        if values.numel() != slot.numel:
            raise InputError(f"expected {slot.numel} values, got {values.numel()}", tensor=slot.name)
        # One tensor at a time: this is where a checkpoint streams from host memory to the device.
        return values.to(buffers.device)

    def pack(self, buffers: PackedBuffers, client: int, tensor: int, values) -> None:
        values = self._device_tensor(buffers, tensor, values)
        sign_pack.sign_pack(values, buffers.signs, buffers.task, buffers.nonfinite,
                                  client=client, tensor=tensor, word_offset=buffers.layout.slots[tensor].word_offset)

    def pack_many(self, buffers: PackedBuffers, client: int, items) -> None:
        """One launch per float dtype for a client's tensors (instead of one per tensor)."""
        groups: dict[torch.dtype, list[tuple[int, torch.Tensor]]] = {}
        for tensor, values in items:
            values = self._device_tensor(buffers, tensor, values)
            groups.setdefault(values.dtype, []).append((tensor, values))
        for group in groups.values():
            sign_pack.sign_pack_many(
                [v for _, v in group], buffers.signs, buffers.task, buffers.nonfinite, client=client,
                tensors=[t for t, _ in group], word_offsets=[buffers.layout.slots[t].word_offset for t, _ in group])

    def nonfinite(self, buffers: PackedBuffers) -> np.ndarray:
        return buffers.nonfinite.cpu().numpy() != 0

    def round_counts(self, buffers: PackedBuffers, seed: int, bonus_fraction: float,
                     pairs: np.ndarray | None = None) -> RoundCounts:
        # The tiled kernel counts every pair in one pass (a superset of ``pairs``).
        gram, sizes = pair_counts.binary_gram(buffers.signs, buffers.task, *partition_params(seed, bonus_fraction))
        return RoundCounts(gram.cpu().numpy(), sizes.cpu().numpy())

    def sampled_matches(self, buffers: PackedBuffers, seed: int, bonus_fraction: float,
                        pairs: np.ndarray) -> np.ndarray:
        pairs = np.asarray(pairs, dtype=np.int64).reshape(-1, 2)
        n_clients = buffers.signs.shape[0]
        if pairs.size and (pairs.min() < 0 or pairs.max() >= n_clients):
            raise InputError(f"pair indices must lie in [0, {n_clients})")
        try:
            matches = sampled_penalty.sampled_matches(buffers.signs, buffers.task, *partition_params(seed, bonus_fraction),
                                                      pairs, pair_keys(seed, pairs), DRAW2_SALT)
        except ValueError as error:  # the kernels know no client or tensor: this round has too few tasks
            raise InputError(str(error)) from error
        return matches.cpu().numpy()

    def host_words(self, buffers: PackedBuffers) -> tuple[np.ndarray, np.ndarray]:
        return buffers.signs.cpu().numpy(), buffers.task.cpu().numpy()
