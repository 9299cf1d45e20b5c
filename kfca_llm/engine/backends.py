"""Backend registry (in the manner of bitsandbytes): a CPU default that always works, GPU where present.

A backend owns the packed buffers of one scoring round and the operations on them: pack clients'
tensors (one at a time, in batches, or whole updates in padded flat buffers), count the integer
statistics (``RoundCounts``; per public stratum with ``stratum_counts``) and, for the paper's sampled
penalty, count the matches of the seeded draws. Every backend must produce exactly the words and
integers of the numpy references (``kfca_llm.kernels.<operation>.reference``).
"""

from __future__ import annotations

import warnings
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import InputError
from .layout import Layout
from .stats import RoundCounts


@dataclass
class PackedBuffers:
    """Backend-native arrays of one round (numpy arrays or torch tensors)."""

    layout: Layout
    signs: Any
    """int32 [n_clients, n_words]: bit set where the client's update is < 0."""
    task: Any
    """int32 [n_words]: bit set where any client's update is non-zero (the task mask)."""
    nonfinite: Any
    """int32 [n_clients, n_tensors]: non-zero where a tensor held NaN or Inf."""
    device: Any = None


def check_rows(buffers: PackedBuffers, rows: np.ndarray) -> np.ndarray:
    """``rows`` as int64, every one a client of the buffers (kernels write where they say: never out of range)."""
    rows = np.asarray(rows, dtype=np.int64)
    n_clients = buffers.nonfinite.shape[0]
    if rows.size and (rows.min() < 0 or rows.max() >= n_clients):
        raise InputError(f"client indices must lie in [0, {n_clients})")
    return rows


class Backend(ABC):
    name: str

    @abstractmethod
    def allocate(self, n_clients: int, layout: Layout, device=None) -> PackedBuffers: ...

    @abstractmethod
    def pack(self, buffers: PackedBuffers, client: int, tensor: int, values) -> None:
        """Pack one tensor (torch tensor or numpy array, any float dtype) of one client."""

    def pack_many(self, buffers: PackedBuffers, client: int, items: Sequence[tuple[int, Any]]) -> None:
        """Pack several (tensor index, values) of one client; backends may fuse them into one launch."""
        for tensor, values in items:
            self.pack(buffers, client, tensor, values)

    def pack_clients(self, buffers: PackedBuffers, items: Sequence[tuple[int, int, Any]]) -> None:
        """Pack (client index, tensor index, values) of several clients; backends may fuse them into one launch."""
        by_client: dict[int, list] = {}
        for client, tensor, values in items:
            by_client.setdefault(client, []).append((tensor, values))
        for client, client_items in by_client.items():
            self.pack_many(buffers, client, client_items)

    def pack_flat(self, buffers: PackedBuffers, clients: Sequence[int], flats: Sequence[Any]) -> None:
        """Pack whole updates held in padded flat buffers (``Layout.flat_buffer``; torch tensor or numpy array,
        one float dtype each) of the given clients; backends pack them with no per-tensor work."""
        from .layout import FlatUpdate

        self.pack_clients(buffers, [(client, k, view) for client, flat in zip(clients, flats)
                                    for k, view in enumerate(FlatUpdate(buffers.layout, flat).values())])

    @abstractmethod
    def nonfinite(self, buffers: PackedBuffers) -> np.ndarray:
        """bool [n_clients, n_tensors] on the host."""

    @abstractmethod
    def round_counts(self, buffers: PackedBuffers, seed: int, bonus_fraction: float,
                     pairs: np.ndarray | None = None) -> RoundCounts:
        """Counts of every pair, or at least of the diagonal and the given pairs ([P, 2], either order).

        With ``pairs`` a backend may leave the Gram entries of other pairs at 0: that is what lets a
        round with p peers per client cost O(n p) pair counts instead of O(n^2).
        """

    @abstractmethod
    def sampled_matches(self, buffers: PackedBuffers, seed: int, bonus_fraction: float,
                        pairs: np.ndarray) -> np.ndarray:
        """int64 [P]: penalty matches of each ordered pair (i, j) of ``pairs`` ([P, 2])."""

    def stratum_counts(self, buffers: PackedBuffers, seed: int, bonus_fraction: float,
                       planes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(negatives int64 [3, S, n], sizes int64 [3, S]) on the host: each client's negative count per task set
        and public stratum; ``planes`` int32 [P, n_words] (``engine.public``), S = 2 ** P."""
        raise InputError(f"backend {self.name!r} cannot condition on public steps (no stratum counts)")

    @abstractmethod
    def host_words(self, buffers: PackedBuffers) -> tuple[np.ndarray, np.ndarray]:
        """(signs, task) as int32 numpy arrays."""


_REGISTRY: dict[str, Callable[[], Backend]] = {}
_INSTANCES: dict[str, Backend] = {}
# Old name -> current name; the old one still works, with a DeprecationWarning.
_RENAMED = {"numpy": "cpu"}


def register_backend(name: str, factory: Callable[[], Backend]) -> Callable[[], Backend] | None:
    """Register (or replace) a backend; returns the factory it replaces, if any."""
    previous = _REGISTRY.get(name)
    _REGISTRY[name] = factory
    _INSTANCES.pop(name, None)
    return previous


def available_backends() -> tuple[str, ...]:
    return tuple(_REGISTRY)


def get_backend(name: str) -> Backend:
    """Backend by name; a backend that cannot run raises with the reason, never falls back."""
    if not isinstance(name, str) or name not in _REGISTRY and name not in _RENAMED:
        raise InputError(f"unknown backend {name!r}; choose one of {('auto',) + available_backends()}")
    if name not in _REGISTRY:
        warnings.warn(f"backend {name!r} is now called {_RENAMED[name]!r}; the old name will be removed",
                      DeprecationWarning, stacklevel=2)
        name = _RENAMED[name]
    if name not in _INSTANCES:
        _INSTANCES[name] = _REGISTRY[name]()
    return _INSTANCES[name]
