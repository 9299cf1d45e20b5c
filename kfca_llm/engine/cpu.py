"""CPU backend ("cpu"): numpy buffers, the numba kernels of ``kfca_llm.kernels`` (``<operation>/cpu.py``).

Why numba: packing must read each client's update once and emit sign and non-zero bits in one
fused, multi-threaded pass (``np.packbits`` needs a boolean temporary per plane and runs on one
thread), and counting needs LLVM's ``ctpop`` on 64-bit words with the seeded partition generated
on the fly. numba gives both without a compiler at install time.
"""

from __future__ import annotations

import numpy as np

from ..errors import InputError, NoTasksError
from ..kernels.pair_counts import cpu as pair_counts
from ..kernels.sampled_penalty import cpu as sampled_penalty
from ..kernels.sign_pack import cpu as sign_pack
from ..kernels.stratum_counts import cpu as stratum_counts
from ..partition import DRAW2_SALT, MAX_CLIENTS, pair_keys, partition_params
from .backends import Backend, PackedBuffers, check_rows
from .layout import Layout
from .stats import RoundCounts


def _unique_pairs(pairs: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(rows, cols) of the distinct unordered pairs i < j of ``pairs``, sorted by row then column."""
    low, high = pairs.min(axis=1), pairs.max(axis=1)
    flat = np.unique(low[low != high] * n + high[low != high])
    return flat // n, flat % n


class CpuBackend(Backend):
    name = "cpu"

    def allocate(self, n_clients: int, layout: Layout, device=None) -> PackedBuffers:
        if not 2 <= n_clients <= MAX_CLIENTS:
            raise InputError(f"need between 2 and {MAX_CLIENTS} clients, got {n_clients}")
        # Rows padded to an even number of words (zeros: never tasks) so counting can use uint64.
        padded = layout.n_words + layout.n_words % 2
        return PackedBuffers(
            layout=layout,
            signs=np.zeros((n_clients, padded), dtype=np.int32),
            task=np.zeros(padded, dtype=np.int32),
            nonfinite=np.zeros((n_clients, len(layout.slots)), dtype=np.int32),
            device="cpu",
        )

    def pack(self, buffers: PackedBuffers, client: int, tensor: int, values) -> None:
        self.pack_clients(buffers, [(client, tensor, values)])

    def pack_many(self, buffers: PackedBuffers, client: int, items) -> None:
        self.pack_clients(buffers, [(client, tensor, values) for tensor, values in items])

    def pack_clients(self, buffers: PackedBuffers, items) -> None:
        """One kernel launch per float format for every client's tensors (read by address)."""
        slots = buffers.layout.slots
        groups: dict[tuple, dict[int, list]] = {}
        check_rows(buffers, [client for client, _, _ in items])
        for client, tensor, values in items:
            raw, exp_mask = sign_pack.raw_view(values)
            if raw.numel() != slots[tensor].numel:
                raise InputError(f"expected {slots[tensor].numel} values, got {raw.numel()}", tensor=slots[tensor].name)
            groups.setdefault((raw.dtype, exp_mask), {}).setdefault(tensor, []).append((client, raw))
        row_words = buffers.signs.shape[1]
        signs, task = buffers.signs.view(np.uint32).reshape(-1), buffers.task.view(np.uint32)
        for (_, exp_mask), by_tensor in groups.items():
            tensors = [(slots[tensor].word_offset,
                        [(client * row_words + slots[tensor].word_offset, raw) for client, raw in copies])
                       for tensor, copies in by_tensor.items()]
            bad = sign_pack.sign_pack(tensors, signs, task, exp_mask)
            clients = [client for copies in by_tensor.values() for client, _ in copies]
            tensor_ids = [tensor for tensor, copies in by_tensor.items() for _ in copies]
            buffers.nonfinite[clients, tensor_ids] = bad != 0

    def pack_flat(self, buffers: PackedBuffers, clients, flats) -> None:
        """Whole updates in padded flat buffers: one pass per float format, tables built with numpy."""
        layout = buffers.layout
        groups: dict[tuple, tuple[list, list]] = {}
        for client, flat in zip(clients, flats):
            raw, exp_mask = sign_pack.raw_view(flat)
            if raw.dim() != 1 or raw.numel() != layout.padded_numel:
                raise InputError(f"a flat update is a 1-D buffer of {layout.padded_numel} elements "
                                 f"(Layout.flat_buffer), got shape {tuple(raw.shape)}")
            rows, raws = groups.setdefault((raw.dtype, exp_mask), ([], []))
            rows.append(client)
            raws.append(raw)
        row_words = buffers.signs.shape[1]
        signs, task = buffers.signs.view(np.uint32).reshape(-1), buffers.task.view(np.uint32)
        for (_, exp_mask), (rows, raws) in groups.items():
            bad = sign_pack.sign_pack_flat(layout.numels, layout.word_offsets, raws, check_rows(buffers, rows) * row_words,
                                           signs, task, exp_mask)
            buffers.nonfinite[rows] = bad != 0

    def nonfinite(self, buffers: PackedBuffers) -> np.ndarray:
        return buffers.nonfinite != 0

    def round_counts(self, buffers: PackedBuffers, seed: int, bonus_fraction: float,
                     pairs: np.ndarray | None = None) -> RoundCounts:
        key, t_bonus, t_m1 = (np.uint32(v) for v in partition_params(seed, bonus_fraction))
        n = buffers.signs.shape[0]
        if pairs is None:
            rows, cols = np.triu_indices(n, 1)
        else:  # each unordered pair once, as (smaller, larger); the diagonal is always counted
            pairs = np.asarray(pairs, dtype=np.int64).reshape(-1, 2)
            rows, cols = _unique_pairs(pairs, n)
        diagonal, counts, sizes = pair_counts.count_pairs(buffers.signs.view(np.uint64), buffers.task.view(np.uint64),
                                                          key, t_bonus, t_m1, rows, cols)
        # np.zeros maps untouched pages lazily: only the diagonal and the scored pairs are written.
        gram = np.zeros((3, n, n), dtype=np.int64)
        clients = np.arange(n)
        gram[:, clients, clients] = diagonal
        gram[:, rows, cols] = counts
        gram[:, cols, rows] = counts
        return RoundCounts(gram, sizes)

    def sampled_matches(self, buffers: PackedBuffers, seed: int, bonus_fraction: float,
                        pairs: np.ndarray) -> np.ndarray:
        key, t_bonus, t_m1 = (np.uint32(v) for v in partition_params(seed, bonus_fraction))
        bonus_coords, plane1, plane2, m1, m2 = sampled_penalty.penalty_planes(
            buffers.signs.view(np.uint32), buffers.task.view(np.uint32), key, t_bonus, t_m1)
        if m1 == 0 or m2 == 0:
            raise NoTasksError("too few informative coordinates to form non-empty penalty sets")
        pairs = np.ascontiguousarray(pairs, dtype=np.int64).reshape(-1, 2)
        return sampled_penalty.draw_matches(bonus_coords, plane1, plane2, pairs, pair_keys(seed, pairs), DRAW2_SALT,
                                            m1, m2)

    def host_words(self, buffers: PackedBuffers) -> tuple[np.ndarray, np.ndarray]:
        n_words = buffers.layout.n_words
        return buffers.signs[:, :n_words], buffers.task[:n_words]

    def stratum_counts(self, buffers: PackedBuffers, seed: int, bonus_fraction: float,
                       planes) -> tuple[np.ndarray, np.ndarray]:
        planes = np.asarray(planes, dtype=np.int32)
        n_words = buffers.layout.n_words
        if planes.ndim != 2 or planes.shape[1] != n_words:
            raise InputError(f"public planes of shape {planes.shape}; the layout has (P, {n_words}) words")
        padded = np.zeros((planes.shape[0], buffers.task.size), dtype=np.int32)  # rows as the signs: uint64 lanes
        padded[:, :n_words] = planes
        key, t_bonus, t_m1 = (np.uint32(v) for v in partition_params(seed, bonus_fraction))
        return stratum_counts.stratum_counts(buffers.signs.view(np.uint64), buffers.task.view(np.uint64),
                                             padded.view(np.uint64), key, t_bonus, t_m1)
