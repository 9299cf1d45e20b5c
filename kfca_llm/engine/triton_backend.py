"""GPU backend ("triton"): torch buffers on the device, the Triton kernels of ``kfca_llm.kernels``
(``<operation>/triton.py``). The registry imports this module only when the backend is first asked for
(``kfca_llm.engine``): triton is optional (Linux only) and slow to import.

Packing costs the host a fixed amount per launch, not per tensor: the layout's packing plan (block and
tail tables, ``kernels/sign_pack/plan.py``) is built once with numpy and kept on the device with the
layout; a launch then needs one small int64 table (each client's row and addresses), copied to the device
asynchronously. Whole updates in padded flat buffers (``FlatUpdate``, ``pack_flat``) need one address per
client; separate tensors one address per (client, tensor), gathered once per call. Every call packs all
its clients with two launches per float format (whole words, then tails), the shared task words kept in
registers across its clients. Flat buffers in host memory stream to the device in chunks of clients
through one staging buffer (pinned host buffers copy asynchronously): rounds larger than the device fit.

Only 1 bit per coordinate per client plus the shared task mask stay resident. With ``TRITON_INTERPRET=1``
the same kernels run on CPU tensors (slow; used by tests); kernels and tensors on different kinds of
device are refused with ``BackendUnavailable`` (``intrinsics.triton.check_device``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from ..errors import BackendUnavailable, InputError, NoTasksError
from ..kernels.intrinsics.triton import check_device, kernels_interpreted
from ..kernels.pair_counts import triton as pair_counts
from ..kernels.sampled_penalty import triton as sampled_penalty
from ..kernels.sign_pack import triton as sign_pack
from ..kernels.sign_pack.plan import PackPlan
from ..kernels.stratum_counts import triton as stratum_counts
from ..partition import DRAW2_SALT, MAX_CLIENTS, pair_keys, partition_params
from .backends import Backend, PackedBuffers, check_rows
from .layout import Layout
from .stats import RoundCounts

# Device memory for host-resident flat buffers on their way to the kernels: a 500-client round of a
# 161 MB adapter streams through it in chunks of ~6 clients.
STAGING_BYTES = 1 << 30


def _as_tensor(values, name: str | None = None) -> torch.Tensor:
    """A torch view of ``values`` (only addresses are taken: no detach needed)."""
    if isinstance(values, np.ndarray):
        values = torch.from_numpy(np.ascontiguousarray(values))
    if not isinstance(values, torch.Tensor):
        raise InputError(f"expected a torch tensor or numpy array, got {type(values).__name__}", tensor=name)
    if values.dtype not in sign_pack.RAW_FORMATS:
        raise InputError(f"dtype {values.dtype} is not one of {sign_pack.SUPPORTED_DTYPES}", tensor=name)
    return values


class TritonBackend(Backend):
    name = "triton"

    def __init__(self):
        if not kernels_interpreted() and not torch.cuda.is_available():
            raise BackendUnavailable(
                "the triton backend needs a CUDA device (torch.cuda.is_available() is False); "
                "set TRITON_INTERPRET=1 before importing triton to run its kernels on the CPU "
                "(slow, for tests), or use backend='cpu'")

    def _device(self, device) -> torch.device:
        device = torch.device(("cpu" if kernels_interpreted() else "cuda") if device is None else device)
        if device.type not in ("cuda", "cpu"):
            raise BackendUnavailable(f"the triton backend runs on CUDA devices, not {device}")
        if device.type == "cuda" and not torch.cuda.is_available():
            raise BackendUnavailable(f"device {device} requested but CUDA is not available")
        check_device(device)
        if device.type == "cuda" and device.index is None:  # so that tensor.device == buffers.device
            device = torch.device("cuda", torch.cuda.current_device())
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

    @staticmethod
    def plan(layout: Layout, device: torch.device) -> sign_pack.DevicePlan:
        """The layout's packing plan on ``device``, built and uploaded once per (layout, device)."""
        def build():
            plan = PackPlan.build(layout.numels, layout.word_offsets, sign_pack.block_words_for(device))
            return sign_pack.DevicePlan.upload(plan, device)
        return layout.cached(("triton plan", device), build)

    @staticmethod
    def _upload(table: np.ndarray, device: torch.device) -> torch.Tensor:
        """An int64 host table on the device, copied asynchronously (through pinned memory) on CUDA."""
        host = torch.from_numpy(table)
        if device.type == "cpu":
            return host
        return host.pin_memory().to(device, non_blocking=True)

    def _launch(self, buffers: PackedBuffers, dtype: torch.dtype, rows: np.ndarray, addresses: np.ndarray, *,
                flat: bool, tensors: np.ndarray | None = None) -> None:
        """One pack of ``rows``' data (``addresses``: [rows] flat buffers, or [rows, tensors] tensors)."""
        layout, device = buffers.layout, buffers.device
        plan = self.plan(layout, device)
        subset = None
        if tensors is not None and tensors.size != len(layout.slots):
            tables, n_blocks, n_tails = sign_pack.subset_tables(plan.plan, tensors)
            subset = sign_pack.Subset(self._upload(tables, device), n_blocks, n_tails)
        table = self._upload(np.concatenate([check_rows(buffers, rows), addresses.reshape(-1)]), device)
        sign_pack.pack(dtype, plan, table, rows.size, buffers.signs, buffers.task, buffers.nonfinite, flat=flat,
                       subset=subset)

    def pack(self, buffers: PackedBuffers, client: int, tensor: int, values) -> None:
        self.pack_clients(buffers, [(client, tensor, values)])

    def pack_many(self, buffers: PackedBuffers, client: int, items) -> None:
        self.pack_clients(buffers, [(client, tensor, values) for tensor, values in items])

    def pack_clients(self, buffers: PackedBuffers, items) -> None:
        """Separate tensors: one pointer gather and one pack per float format for all the given clients.

        Tensors elsewhere than the buffers' device are copied there one by one (the host-to-device stream)."""
        layout, device = buffers.layout, buffers.device
        numels = layout.cached("numels list", lambda: layout.numels.tolist())
        here = device.index if device.type == "cuda" else -1  # what Tensor.get_device() says for the buffers
        groups: dict[torch.dtype, tuple[list, list, list]] = {}
        for client, tensor, values in items:  # per tensor: a few attribute reads in the common case
            if type(values) is not torch.Tensor or values.dtype not in sign_pack.RAW_FORMATS \
                    or values.get_device() != here:
                values = self._on_device(_as_tensor(values, layout.slots[tensor].name), device)
            if values.numel() != numels[tensor]:
                raise InputError(f"expected {numels[tensor]} values, got {values.numel()}",
                                 tensor=layout.slots[tensor].name)
            if not values.is_contiguous():
                values = values.contiguous()
            group = groups.get(values.dtype)
            if group is None:
                group = groups[values.dtype] = ([], [], [])
            group[0].append(client)
            group[1].append(tensor)
            group[2].append(values)
        for dtype, (rows, tensors, kept) in groups.items():
            addresses = self._aligned_addresses(kept)
            row_ids, row_of = np.unique(np.asarray(rows, dtype=np.int64), return_inverse=True)
            columns, column_of = np.unique(np.asarray(tensors, dtype=np.int64), return_inverse=True)
            table = np.zeros((row_ids.size, columns.size), dtype=np.int64)  # 0: that client sent no such tensor
            table[row_of, column_of] = addresses
            self._launch(buffers, dtype, row_ids, table, flat=False, tensors=columns)

    def pack_flat(self, buffers: PackedBuffers, clients: Sequence[int], flats: Sequence) -> None:
        """Whole updates in padded flat buffers: one address per client, one pack per float format (per chunk of
        clients when the buffers live in host memory and the kernels on a GPU)."""
        layout, device = buffers.layout, buffers.device
        resident: dict[torch.dtype, tuple[list, list]] = {}
        streamed: dict[torch.dtype, tuple[list, list]] = {}
        for client, flat in zip(clients, flats):
            flat = _as_tensor(flat)
            if flat.dim() != 1 or flat.numel() != layout.padded_numel:
                raise InputError(f"a flat update is a 1-D buffer of {layout.padded_numel} elements "
                                 f"(Layout.flat_buffer), got shape {tuple(flat.shape)}")
            target = streamed if device.type == "cuda" and flat.device.type == "cpu" else resident
            rows, kept = target.setdefault(flat.dtype, ([], []))
            rows.append(client)
            kept.append(flat if target is streamed else self._on_device(flat, device).contiguous())
        for dtype, (rows, kept) in resident.items():
            self._launch(buffers, dtype, np.asarray(rows, dtype=np.int64), self._aligned_addresses(kept), flat=True)
        for dtype, (rows, kept) in streamed.items():
            self.stream_flat(buffers, rows, kept)

    def stream_flat(self, buffers: PackedBuffers, clients: Sequence[int], flats: Sequence[torch.Tensor]) -> None:
        """Flat buffers of one dtype from anywhere (host memory: pinned ones copy asynchronously) -> one device
        staging buffer of ``STAGING_BYTES``, a chunk of clients at a time, each chunk packed in one pass (the
        task words read and written once per chunk). Launches queue behind their copies on the stream, so the
        staging buffer is reused safely. ``pack_flat`` takes this path for host buffers and GPU kernels."""
        rows, dtype = list(clients), flats[0].dtype
        padded = buffers.layout.padded_numel
        if any(f.dtype != dtype or f.shape != (padded,) for f in flats):
            raise InputError(f"stream_flat takes flat buffers of {padded} elements, all of one dtype")
        row_bytes = padded * flats[0].element_size()
        chunk = max(1, min(len(flats), STAGING_BYTES // row_bytes))
        staging = torch.empty((chunk, padded), dtype=dtype, device=buffers.device)
        starts = staging.data_ptr() + np.arange(chunk, dtype=np.int64) * row_bytes
        for first in range(0, len(flats), chunk):
            part = flats[first:first + chunk]
            for slot, flat in enumerate(part):
                staging[slot].copy_(flat, non_blocking=True)
            self._launch(buffers, dtype, np.asarray(rows[first:first + chunk], dtype=np.int64), starts[:len(part)],
                         flat=True)

    @staticmethod
    def _on_device(values: torch.Tensor, device: torch.device) -> torch.Tensor:
        if values.device == device:
            return values
        if values.device.type == "cuda" and device.type == "cpu":
            check_device(values)  # kernels run interpreted: refuse CUDA data with the reason
        return values.to(device)

    @staticmethod
    def _aligned_addresses(kept: list[torch.Tensor]) -> np.ndarray:
        """Each tensor's address; the few not 16-byte aligned (views at odd offsets) are copied (and replaced in
        ``kept``, which holds them until the launch is queued) so the kernels' 16-byte loads stay legal."""
        addresses = np.fromiter((t.data_ptr() for t in kept), dtype=np.int64, count=len(kept))
        for i in np.flatnonzero(addresses % 16):
            kept[i] = kept[i].clone()
            addresses[i] = kept[i].data_ptr()
        return addresses

    def nonfinite(self, buffers: PackedBuffers) -> np.ndarray:
        return buffers.nonfinite.cpu().numpy() != 0

    def round_counts(self, buffers: PackedBuffers, seed: int, bonus_fraction: float,
                     pairs: np.ndarray | None = None) -> RoundCounts:
        # The tiled kernel counts every pair in one pass (a superset of ``pairs``).
        gram, sizes = pair_counts.binary_gram(buffers.signs, buffers.task, *partition_params(seed, bonus_fraction))
        counts = torch.cat([gram.view(-1), sizes]).cpu().numpy()  # one copy to the host: one wait for the device
        return RoundCounts(counts[:gram.numel()].reshape(gram.shape), counts[gram.numel():])

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
            raise NoTasksError(str(error)) from error
        return matches.cpu().numpy()

    def stratum_counts(self, buffers: PackedBuffers, seed: int, bonus_fraction: float,
                       planes) -> tuple[np.ndarray, np.ndarray]:
        planes = torch.as_tensor(planes).to(device=buffers.device, dtype=torch.int32)
        n_words = buffers.layout.n_words
        if planes.dim() != 2 or planes.shape[1] != n_words:
            raise InputError(f"public planes of shape {tuple(planes.shape)}; the layout has (P, {n_words}) words")
        negatives, sizes = stratum_counts.stratum_counts(buffers.signs, buffers.task, planes.contiguous(),
                                                         *partition_params(seed, bonus_fraction))
        return negatives.cpu().numpy(), sizes.cpu().numpy()

    def host_words(self, buffers: PackedBuffers) -> tuple[np.ndarray, np.ndarray]:
        return buffers.signs.cpu().numpy(), buffers.task.cpu().numpy()
