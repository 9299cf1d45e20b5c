"""Streaming API: clients' updates arrive tensor by tensor and are packed as they come.

    packer = SignPacker({"lora_A": (8, 64), "lora_B": (64, 8)}, clients=["alice", "bob", "carol"])
    packer.add("alice", "lora_A", tensor)   # any float dtype, CPU or CUDA
    packer.add_many("bob", state_dict)      # a client's tensors in one batch
    packer.add_flat("carol", flat)          # a whole update in one padded flat buffer (Layout.flat_buffer)
    ...
    report = packer.score(seed=7)

Only the packed bits (1 bit per coordinate per client, plus the shared task mask) are kept; a
tensor can be freed as soon as ``add`` returns. Batches cost the host far less than tensor-by-tensor
calls, and a flat buffer (or a ``FlatUpdate``) costs it the same whatever the number of tensors.
"""

from __future__ import annotations

import dataclasses
import gc
from collections.abc import Mapping, Sequence

import numpy as np
import torch

from .engine.backends import Backend, PackedBuffers, get_backend
from .engine.duplicates import DuplicateGroup, DuplicateRule, check_duplicate_policy, disagreement_counts, find_duplicates
from .engine.layout import FlatUpdate, Layout
from .engine.public import OFF, PublicConditioning, PublicPlanes, public_planes
from .engine.stats import PairPayment, joint_tables, pair_payments
from .errors import InputError
from .partition import check_bonus_fraction, check_penalty, check_seed, peer_pairs
from .report import RewardReport
from .tensors import is_float

SIGN_LABELS = ("negative", "non-negative")


def resolve_backend(backend: str, device) -> Backend:
    """``auto``: Triton when the data lives on a CUDA device, the CPU backend otherwise."""
    if backend == "auto":
        on_cuda = device is not None and torch.device(device).type == "cuda"
        backend = "triton" if on_cuda else "cpu"
    return get_backend(backend)


class SignPacker:
    """Packs the signs of several clients' updates and scores them with KFCA-QP."""

    def __init__(self, shapes: Mapping[str, Sequence[int]] | Layout, clients: Sequence[str], *,
                 backend: str = "auto", device=None):
        if isinstance(clients, (str, bytes)) or not isinstance(clients, Sequence):
            raise InputError(f"clients must be a list of client ids, got {clients!r}")
        ids = [str(c) for c in clients]
        if len(set(ids)) != len(ids):
            raise InputError(f"client ids must be unique (as strings), got {ids}")
        device = _check_device(device)
        if len(ids) < 2:
            raise InputError(f"need at least two clients to score, got {len(ids)}")
        self.clients: tuple[str, ...] = tuple(sorted(ids))
        self.layout = shapes if isinstance(shapes, Layout) else Layout.from_shapes(shapes)
        self.backend = resolve_backend(backend, device)
        self.buffers: PackedBuffers = self.backend.allocate(len(self.clients), self.layout, device)
        self._index = {c: i for i, c in enumerate(self.clients)}
        self._tensor_index = {s.name: k for k, s in enumerate(self.layout.slots)}
        self._packed = np.zeros((len(self.clients), len(self.layout.slots)), dtype=bool)

    @classmethod
    def from_words(cls, shapes: Mapping[str, Sequence[int]] | Layout, words: Mapping[str, np.ndarray],
                   task: np.ndarray) -> "SignPacker":
        """A CPU packer holding already packed sign words (client -> int32 words of this layout) and the round's task
        words, as ``words()`` gave them: a round kept as bits (``fl.pool_settle``) scored again."""
        packer = cls(shapes, list(words), backend="cpu")
        n_words = packer.layout.n_words
        for client, row in words.items():
            row = np.asarray(row)
            if row.dtype != np.int32 or row.shape != (n_words,):
                raise InputError(f"sign words of shape {row.shape} ({row.dtype}); the layout has ({n_words},) int32",
                                 client=client)
            packer.buffers.signs[packer._index[str(client)], :n_words] = row
        task = np.asarray(task)
        if task.dtype != np.int32 or task.shape != (n_words,):
            raise InputError(f"task words of shape {task.shape} ({task.dtype}); the layout has ({n_words},) int32")
        packer.buffers.task[:n_words] = task
        packer._packed[:] = True
        return packer

    def add(self, client: str, name: str, tensor) -> None:
        """Pack one tensor of one client (validated: known name, exact shape, float dtype)."""
        self.add_many(client, {name: tensor})

    def add_many(self, client: str, tensors: Mapping[str, object]) -> None:
        """Pack several tensors of one client at once (one pass per float format); a ``FlatUpdate`` of this
        layout goes to ``add_flat``."""
        self.add_clients({client: tensors})

    def add_flat(self, client: str, buffer) -> None:
        """Pack a client's whole update held in one padded flat buffer of this layout (``layout.flat_buffer``: a
        1-D float tensor or numpy array, tensors in layout order from element ``32 * word_offset``, padding
        ignored) or a ``FlatUpdate``: O(1) host work whatever the number of tensors."""
        self.add_clients({client: buffer if isinstance(buffer, FlatUpdate) else _FlatBuffer(buffer)})

    def add_clients(self, updates: Mapping[str, object]) -> None:
        """Pack several clients' updates at once: state dicts (name -> tensor), ``FlatUpdate``s of this layout, or
        flat buffers given through ``add_flat``; each kind in one pass per float format for all of them."""
        # A round of separate tensors makes a tuple per tensor: with the garbage collector on, its full passes
        # over every live object made the per-client cost grow with the round (0.6 ms -> 1.5 ms per client of
        # 392 tensors from 20 to 100 clients, benchmarks/bench_host.py). Nothing here makes cycles.
        enabled = gc.isenabled()
        gc.disable()
        try:
            self._add_clients(updates)
        finally:
            if enabled:
                gc.enable()

    def _add_clients(self, updates: Mapping[str, object]) -> None:
        items, flat_rows, flats = [], [], []
        for client, update in updates.items():
            i = self._client_index(client)
            flat = self._flat(client, update)
            if flat is not None:
                if self._packed[i].any():
                    raise InputError("a whole update was given for a client with tensors already added", client=client)
                flat_rows.append(i)
                flats.append(flat)
                continue
            if not isinstance(update, Mapping):
                raise InputError(f"an update must be a state dict or a flat buffer, got {type(update).__name__}",
                                 client=client)
            for name, tensor in update.items():
                items.append((i, self._validate(client, name, tensor), tensor))
        if flats:
            self.backend.pack_flat(self.buffers, flat_rows, flats)
            self._packed[flat_rows] = True
        if items:
            self.backend.pack_clients(self.buffers, items)
            rows, tensors, _ = zip(*items)
            self._packed[list(rows), list(tensors)] = True

    def _client_index(self, client: str) -> int:
        if client not in self._index:
            raise InputError(f"unknown client; expected one of {list(self.clients)}", client=client)
        return self._index[client]

    def _flat(self, client: str, update):
        """The flat buffer of ``update`` if it is one (validated), else None."""
        if isinstance(update, FlatUpdate):
            if not update.layout.same_as(self.layout):
                raise InputError("the flat update's layout differs from the one every client shares", client=client)
            buffer = update.buffer
        elif isinstance(update, _FlatBuffer):
            buffer = update.buffer
        else:
            return None
        if not isinstance(buffer, (torch.Tensor, np.ndarray)):
            raise InputError(f"a flat buffer must be a tensor or numpy array, got {type(buffer).__name__}",
                             client=client)
        if isinstance(buffer, torch.Tensor) and (buffer.layout != torch.strided or buffer.device.type == "meta"):
            raise InputError(f"expected a dense tensor with data, got layout {buffer.layout} on {buffer.device}",
                             client=client)
        if buffer.ndim != 1 or buffer.shape[0] != self.layout.padded_numel:
            raise InputError(f"a flat buffer of this layout has shape ({self.layout.padded_numel},) "
                             f"(Layout.flat_buffer), got {tuple(buffer.shape)}", client=client)
        if buffer.dtype not in PACKABLE_DTYPES:
            raise InputError(f"dtype {buffer.dtype} is not supported; use float16, bfloat16, float32 or float64 "
                             "(native byte order)", client=client)
        return buffer

    def _validate(self, client: str, name: str, tensor) -> int:
        """The tensor's layout index once it is checked (a few attribute reads when it is fine: this runs per tensor)."""
        k = self._tensor_index.get(name)
        if k is None:
            raise InputError("tensor is not in the layout every client shares", client=client, tensor=name)
        if self._packed[self._index[client], k]:
            raise InputError("tensor was already added", client=client, tensor=name)
        if isinstance(tensor, torch.Tensor):
            if tensor.layout is not torch.strided or tensor.is_meta:
                raise InputError(f"expected a dense tensor with data, got layout {tensor.layout} on {tensor.device}",
                                 client=client, tensor=name)
        elif not isinstance(tensor, np.ndarray):
            raise InputError(f"expected a tensor or numpy array, got {type(tensor).__name__}", client=client,
                             tensor=name)
        shape = self.layout.slots[k].shape
        if tensor.shape != shape:  # torch.Size is a tuple
            raise InputError(f"shape {tuple(tensor.shape)} differs from the shared shape {shape}", client=client,
                             tensor=name)
        if tensor.dtype not in _PACKABLE:
            if not is_float(tensor):
                raise InputError(f"dtype {tensor.dtype} is not a floating-point type", client=client, tensor=name)
            raise InputError(f"dtype {tensor.dtype} is not supported; use float16, bfloat16, float32 or float64 "
                             "(native byte order)", client=client, tensor=name)
        return k

    def words(self) -> tuple[np.ndarray, np.ndarray]:
        """(sign words [n_clients, n_words], task words [n_words]) as int32 host arrays."""
        return self.backend.host_words(self.buffers)

    def score(self, *, peers: int | None = None, seed: int = 0, penalty: str = "expected",
              bonus_fraction: float = 0.5, pairs: Sequence[tuple[str, str]] | None = None,
              duplicates: str = "zero", duplicate_rule: DuplicateRule = DuplicateRule(),
              copy_candidates: Sequence[str] | None = None, public: Sequence[Mapping] | PublicPlanes | None = None,
              conditioning: PublicConditioning = PublicConditioning()) -> RewardReport:
        """Rewards of every client against ``peers`` (all others when None) or the explicit ``pairs``.

        ``public``: the global's recent steps (state dicts of this layout, oldest first, the newest last) or their
        packed ``PublicPlanes``; the expected penalty is then drawn within strata of that public information
        (``engine.public``, ``conditioning``), so a report the public steps predict earns 0 in expectation.
        Without steps (or ``conditioning.steps == 0``) the rewards are those of no ``public`` bit for bit.

        Copies among the clients (``engine.duplicates``) are listed in ``report.duplicates``;
        ``duplicates="zero"`` (default) pays each group of copies nothing (the detector cannot tell the
        original from the copy, and a copy must never be paid), ``"split"`` pays each group as one client,
        ``"flag"`` only reports them; ``report.unadjusted_rewards`` keeps the rewards before the policy, so
        an operator can review a group and release the original's pay. ``copy_candidates`` restricts
        detection to those clients (None: all), e.g. to leave out hypothetical alternatives of one client.
        """
        seed = check_seed(seed)
        penalty = check_penalty(penalty)
        bonus_fraction = check_bonus_fraction(bonus_fraction)
        duplicates = check_duplicate_policy(duplicates)
        self._check_complete()
        index_pairs = self._scored_pairs(peers, seed, pairs)
        # Every pair is counted, not only the scored ones: copy detection compares each client with all
        # others (a copier need not be drawn as its victim's peer to be paid for the copy).
        planes = self.public_planes(public, conditioning)
        if planes is not None and penalty == "sampled":
            raise InputError('penalty="sampled" draws its penalty tasks from the whole of M_1 and M_2; with public '
                             'steps use penalty="expected" (the draws within a stratum are not implemented)')
        counts = self.backend.round_counts(self.buffers, seed, bonus_fraction)
        if planes is not None:
            negatives, sizes = self.backend.stratum_counts(self.buffers, seed, bonus_fraction, planes.words)
            counts = dataclasses.replace(counts, strata_negatives=negatives, strata_sizes=sizes)
        groups = self._duplicates(counts, duplicate_rule, copy_candidates)
        matches = None
        if penalty == "sampled":
            matches = self.backend.sampled_matches(self.buffers, seed, bonus_fraction, index_pairs)
        # Whole arrays of pairs at once: a round of n clients and p peers costs no per-pair numpy call.
        payment, bonus, penalty_agreement = pair_payments(counts, index_pairs, matches)
        keys = [(self.clients[i], self.clients[j]) for i, j in index_pairs.tolist()]
        terms = dict(zip(keys, map(PairPayment, payment.tolist(), bonus.tolist(), penalty_agreement.tolist())))
        joints = dict(zip(keys, joint_tables(counts, index_pairs)))
        sizes = [int(v) for v in counts.sizes]
        return RewardReport.from_pairs(
            terms, joints, seed=seed, penalty=penalty, bonus_fraction=bonus_fraction,
            backend=self.backend.name, labels=SIGN_LABELS,
            tasks={"coordinates": self.layout.n_coords, "tasks": sum(sizes), "bonus": sizes[0],
                   "penalty_1": sizes[1], "penalty_2": sizes[2],
                   **({} if planes is None else {"public_steps": planes.steps, "public_strata": 1 << planes.n_planes})},
            duplicates=groups, duplicate_policy=duplicates,
        )

    def public_planes(self, public, conditioning: PublicConditioning = PublicConditioning(),
                      gaps: Sequence[int] = (), changes: Mapping[int, Mapping] | None = None
                      ) -> PublicPlanes | None:
        """``public`` (steps, oldest first, or already packed planes) as the planes ``score`` counts strata with;
        None when there is nothing to condition on. ``gaps``: the participants' reception gaps, spans of planes of
        their own (``engine.public.public_spans``); ``changes``: the global's change over each gap longer than the
        steps (``engine.public.public_planes``)."""
        if not isinstance(conditioning, PublicConditioning):
            raise InputError(f"conditioning must be a PublicConditioning, got {type(conditioning).__name__}")
        if isinstance(public, PublicPlanes):  # packed already: conditioned when they were built
            return public if public.n_planes else None
        if public is None or conditioning == OFF or not conditioning.enabled:
            return None
        return public_planes(self.layout, public, conditioning, self.buffers.device, gaps, changes)

    def find_duplicates(self, rule: DuplicateRule = DuplicateRule(),
                        copy_candidates: Sequence[str] | None = None) -> tuple[DuplicateGroup, ...]:
        """Groups of clients whose packed reports are copies of each other (no rewards computed)."""
        self._check_complete()
        # The disagreement counts sum the three task sets, so they do not depend on the partition seed.
        return self._duplicates(self.backend.round_counts(self.buffers, 0, 0.5), rule, copy_candidates)

    def _duplicates(self, counts, rule: DuplicateRule, candidates: Sequence[str] | None) -> tuple[DuplicateGroup, ...]:
        """Detection on the candidates' rows and columns of the disagreement counts (all clients when None)."""
        if candidates is None:
            chosen = list(range(len(self.clients)))
        else:
            if isinstance(candidates, (str, bytes)) or not isinstance(candidates, Sequence):
                raise InputError(f"copy_candidates must be a list of client ids, got {candidates!r}")
            for c in candidates:
                if str(c) not in self._index:
                    raise InputError("unknown client in copy_candidates", client=str(c))
            chosen = sorted({self._index[str(c)] for c in candidates})
        if len(chosen) < 2:
            return ()
        disagreements = disagreement_counts(counts)[np.ix_(chosen, chosen)]
        return find_duplicates([self.clients[i] for i in chosen], disagreements, int(counts.sizes.sum()), rule)

    def _check_complete(self) -> None:
        missing = np.argwhere(~self._packed)
        if missing.size:
            i, k = missing[0]
            raise InputError("tensor is missing from the update", client=self.clients[i],
                             tensor=self.layout.slots[k].name)
        bad = np.argwhere(self.backend.nonfinite(self.buffers))
        if bad.size:
            i, k = bad[0]
            raise InputError("update holds NaN or Inf values", client=self.clients[i],
                             tensor=self.layout.slots[k].name)

    def _scored_pairs(self, peers, seed, pairs) -> np.ndarray:
        if pairs is None:
            return peer_pairs(len(self.clients), peers, seed)
        if peers is not None:
            raise InputError("give either peers or pairs, not both")
        out = []
        for pair in pairs:
            if isinstance(pair, (str, bytes)) or not isinstance(pair, Sequence) or len(pair) != 2:
                raise InputError(f"each pair must be (client, peer), got {pair!r}")
            client, peer = (str(c) for c in pair)
            for who in (client, peer):
                if who not in self._index:
                    raise InputError("unknown client in pairs", client=who)
            if client == peer:
                raise InputError("a client cannot be its own peer", client=client)
            out.append((self._index[client], self._index[peer]))
        if not out:
            raise InputError("pairs is empty")
        return np.array(out, dtype=np.int64)


PACKABLE_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64,
                   np.dtype("=f2"), np.dtype("=f4"), np.dtype("=f8"))
# A set for the per-tensor check: ``in`` on the tuple compares torch dtypes with numpy ones (slow) one by one.
_PACKABLE = frozenset(PACKABLE_DTYPES)


class _FlatBuffer:
    """Marks a buffer handed to ``add_flat`` (a bare tensor is otherwise not an update)."""

    def __init__(self, buffer):
        self.buffer = buffer


def _check_device(device):
    if device is None:
        return None
    try:
        return torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise InputError(f"device {device!r} is not a torch device ({exc})") from None
