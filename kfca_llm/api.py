"""Public scoring API: adapter updates (KFCA-QP), adapter checkpoints, and labels (KFCA-D)."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence

import numpy as np
import torch

from .checkpoints import AdapterFile, check_same_tensors, client_paths, open_adapter
from .engine.duplicates import DuplicateRule, check_duplicate_policy, find_duplicates
from .engine.labels import LabelRound
from .engine.layout import FlatUpdate, Layout
from .engine.public import PublicConditioning
from .engine.stats import PairPayment, label_pair_payments
from .errors import InputError
from .kernels.intrinsics import WORD_BITS
from .mechanism import check_num_labels
from .packer import SignPacker
from .partition import check_penalty, check_seed, peer_pairs
from .report import RewardReport

FLAT_UPDATE_NAME = "update"
MAX_LABELS = 1024
MAX_REPORT_CELLS = 1 << 27  # 1 GiB of float64 delta matrices


def _as_state_dict(client: str, update) -> Mapping:
    if isinstance(update, (torch.Tensor, np.ndarray)):
        return {FLAT_UPDATE_NAME: update.reshape(-1)}
    if isinstance(update, FlatUpdate):  # kept whole: packed as one buffer
        return update
    if isinstance(update, Mapping):
        if not update:
            raise InputError("empty update (no tensors)", client=client)
        return dict(update)
    raise InputError(f"an update must be a state dict, a tensor or a numpy array, got {type(update).__name__}",
                     client=client)


def _shared_shapes(state_dicts: Mapping[str, Mapping]) -> dict[str, tuple[int, ...]] | Layout:
    """The layout every client shares (that of the ``FlatUpdate``s when all are; no per-tensor check then)."""
    first = min(state_dicts)
    layout = getattr(state_dicts[first], "layout", None)
    if layout is not None and all(isinstance(u, FlatUpdate) and u.layout.same_as(layout) for u in state_dicts.values()):
        return layout
    for client, sd in state_dicts.items():  # shapes are read below: non-tensors first
        for name, t in sd.items():
            if not isinstance(t, (torch.Tensor, np.ndarray)):
                raise InputError(f"expected a tensor or numpy array, got {type(t).__name__}", client=client, tensor=name)
    shapes = {name: tuple(t.shape) for name, t in state_dicts[first].items()}
    for client, sd in state_dicts.items():
        for name in sorted(set(shapes) - set(sd)):
            raise InputError(f"tensor missing (present in {first!r})", client=client, tensor=name)
        for name in sorted(set(sd) - set(shapes)):
            raise InputError(f"unexpected tensor (absent from {first!r})", client=client, tensor=name)
    return shapes


def _device_of(state_dicts: Mapping[str, Mapping]):
    for sd in state_dicts.values():
        for t in (sd.buffer,) if isinstance(sd, FlatUpdate) else sd.values():
            if isinstance(t, torch.Tensor) and t.device.type == "cuda":
                return t.device
    return None


def score_updates(updates: Mapping[str, object], *, peers: int | None = None, seed: int = 0,
                  penalty: str = "expected", bonus_fraction: float = 0.5, backend: str = "auto",
                  pairs: Sequence[tuple[str, str]] | None = None, duplicates: str = "zero",
                  copy_candidates: Sequence[str] | None = None, public: Sequence[Mapping] | None = None,
                  conditioning: PublicConditioning = PublicConditioning()) -> RewardReport:
    """KFCA-QP rewards of adapter updates: each coordinate is a task, the report is its sign.

    ``updates`` maps client id -> state dict (name -> tensor, any float dtype, CPU or CUDA), ``FlatUpdate``
    (a whole update in one padded flat buffer: packed with no per-tensor work) or one flat tensor / numpy
    array (a single tensor named ``update``). Every client is scored against ``peers`` sampled peers (all other
    clients when None), or only the explicit ordered ``pairs`` (client, peer). ``backend="auto"``
    runs Triton on CUDA tensors (no host round trip) and the CPU engine otherwise. Copies among the
    clients are reported in ``report.duplicates``; ``duplicates`` is the payment policy for them
    (``"zero"``, the default: a group is paid nothing, since the detector cannot tell the original from
    the copy; ``"split"``: a group is paid as one client; ``"flag"``: report only). The rewards before
    the policy stay in ``report.unadjusted_rewards`` for review. ``copy_candidates`` restricts detection
    to those client ids (None: every client).

    ``public``: the public trajectory, the global adapter's recent steps (state dicts shaped like the updates,
    oldest first, the newest last). The penalty is then drawn within strata of what those steps say about each
    coordinate (``engine.public``; ``conditioning`` picks how many steps and magnitude buckets), so a report
    the trajectory predicts (a free rider's replay of it) earns 0 in expectation. Without ``public`` (or with
    an empty list) the rewards are those without conditioning, bit for bit.
    """
    return pack_updates(updates, backend=backend).score(
        peers=peers, seed=seed, penalty=penalty, bonus_fraction=bonus_fraction, pairs=pairs, duplicates=duplicates,
        copy_candidates=copy_candidates, public=public, conditioning=conditioning)


def pack_updates(updates: Mapping[str, object], *, backend: str = "auto") -> SignPacker:
    """``score_updates``' first half: the updates (as it takes them) packed into sign bits, ready to
    ``score`` (once or several times); timing the two halves apart says what packing costs."""
    if not isinstance(updates, Mapping):
        raise InputError("updates must be a mapping client id -> update")
    state_dicts = {str(c): _as_state_dict(str(c), u) for c, u in updates.items()}
    if len(state_dicts) != len(updates):
        raise InputError(f"client ids collide once converted to strings: {list(updates)}")
    if len(state_dicts) < 2:
        raise InputError(f"need at least two clients to score, got {len(state_dicts)}")
    packer = SignPacker(_shared_shapes(state_dicts), list(state_dicts), backend=backend,
                        device=_device_of(state_dicts))
    packer.add_clients(state_dicts)
    return packer


def score_checkpoints(paths: Sequence[str | os.PathLike] | Mapping[str, str | os.PathLike], *,
                      reference: str | os.PathLike | None = None, peers: int | None = None, seed: int = 0,
                      penalty: str = "expected", bonus_fraction: float = 0.5, backend: str = "auto",
                      device=None, pairs: Sequence[tuple[str, str]] | None = None,
                      duplicates: str = "zero", public: Sequence[str | os.PathLike] | None = None,
                      conditioning: PublicConditioning = PublicConditioning()) -> RewardReport:
    """KFCA-QP rewards of adapter checkpoints (PEFT directories or .safetensors files).

    With ``reference`` (the previous global adapter) a client's update is its adapter minus the
    reference; without it the files hold the updates. All headers are validated first; then each
    client's file is read in one sweep into one padded flat buffer (the reference's once) and packed as
    one batch, so peak memory is the packed bits plus one client's adapter (and the reference's).
    ``device="cuda"`` streams them to the GPU. ``duplicates``: as in ``score_updates`` (two paths to one
    file are caught as identical reports). Without ``reference``, inputs that are all copies of each other
    (full adapters trained from one global adapter keep its signs almost everywhere) are scored as such, with
    a warning in ``report.warnings`` that names the reference as the likely fix.

    ``public``: earlier global adapters (oldest first) before ``reference``; the public steps are the differences of
    consecutive globals ending at ``reference`` (the newest step: ``reference`` minus the last of ``public``), and
    the penalty is conditioned on them as in ``score_updates`` (``conditioning``).
    """
    files, ref, earlier, shapes = _open_checkpoints(paths, reference, public)
    packer = SignPacker(shapes, [f.client for f in files], backend=backend, device=device)
    base = _read_reference(ref, packer.layout, device) if ref is not None else None
    _add_client_updates(packer, files, base, device)
    steps = _public_steps(earlier, ref, base, packer.layout, device, conditioning) if earlier else None
    report = packer.score(peers=peers, seed=seed, penalty=penalty, bonus_fraction=bonus_fraction, pairs=pairs,
                          duplicates=duplicates, public=steps, conditioning=conditioning)
    return _warn_if_all_copies(report, with_reference=ref is not None)


def _open_checkpoints(paths, reference, public):
    """(the clients' files, the reference's or None, the earlier globals', the tensors' shapes), every header read
    and checked (at least two clients, the public globals only with a reference, every file's tensors alike)."""
    files = [open_adapter(path, client) for client, path in client_paths(paths).items()]
    if len(files) < 2:
        raise InputError(f"need at least two clients to score, got {len(files)}")
    ref = open_adapter(reference, "<reference>") if reference is not None else None
    if public and ref is None:
        raise InputError("public (earlier global adapters) needs the reference: the global the clients trained from")
    earlier = [open_adapter(path, f"<public {i}>") for i, path in enumerate(public or ())]
    shapes = check_same_tensors(files, ref)
    if earlier:
        check_same_tensors(earlier, ref)
    return files, ref, earlier, shapes


def _read_reference(ref: AdapterFile, layout: Layout, device) -> Mapping[str, torch.Tensor]:
    """The reference's tensors, read as a client's are; refused if any holds NaN or Inf."""
    with open(ref.path, "rb") as handle:
        base = _read_update(ref, handle, layout, device)
    _check_finite_reference(ref, base)
    return base


def _add_client_updates(packer: SignPacker, files: Sequence[AdapterFile], base, device) -> None:
    """Each client's update (its adapter minus ``base`` when given) packed, one client's tensors in memory at a time."""
    for file in files:
        with open(file.path, "rb") as handle:
            update = _read_update(file, handle, packer.layout, device)
        if base is not None:
            if isinstance(update, FlatUpdate) and isinstance(base, FlatUpdate):
                update = FlatUpdate(packer.layout, update_from_reference(update.buffer, base.buffer))
            else:
                update = {name: update_from_reference(update[name], base[name]) for name in update}
        packer.add_many(file.client, update)
        del update


def _public_steps(earlier: Sequence[AdapterFile], ref: AdapterFile, base, layout: Layout, device,
                  conditioning: PublicConditioning) -> list[dict[str, torch.Tensor]]:
    """The steps between consecutive globals (oldest first) ending at the reference; only the newest
    ``conditioning.steps`` earlier globals are read."""
    globals_ = []
    for file in list(earlier)[len(earlier) - min(conditioning.steps, len(earlier)):]:
        with open(file.path, "rb") as handle:
            adapter = _read_update(file, handle, layout, device)
        _check_finite_reference(file, adapter)
        globals_.append(adapter)
    globals_.append(base)
    return [{slot.name: update_from_reference(new[slot.name], old[slot.name]) for slot in layout.slots}
            for old, new in zip(globals_, globals_[1:])]


def _warn_if_all_copies(report: RewardReport, *, with_reference: bool) -> RewardReport:
    """Updates of different clients disagree on a good part of their signs; adapters fine-tuned from one
    global adapter share its signs almost everywhere and are all found to be copies of each other. So do their
    differences from another round's global adapter (round 10's clients against round 1's): what the global adapter
    moved in between is common to all of them and outweighs each client's own step."""
    everyone = set(report.rewards)
    group = next((g for g in report.duplicates if set(g.clients) == everyone), None)
    if group is None:
        return report
    lowest = min(p.agreement for p in group.pairs)
    found = f"all {len(everyone)} inputs are copies of each other (sign agreement {lowest:.4f} or more)"
    if with_reference:
        warning = (f"{found} after subtracting the reference: it does not look like the global adapter they were "
                   "trained from (another round's?); pass that round's global adapter as --reference")
    else:
        warning = (f"{found}: they look like full adapters, not updates; pass the global adapter they were trained "
                   "from as the reference (kfca-llm score --reference GLOBAL) to score their updates")
    return dataclasses.replace(report, warnings=(*report.warnings, warning))


def _read_update(file: AdapterFile, handle, layout: Layout, device) -> Mapping[str, torch.Tensor]:
    """One client's tensors, read in one sweep: into a padded flat buffer (``FlatUpdate``, packed with no
    per-tensor work) when the file holds one dtype, else tensor by tensor; on ``device``."""
    dtype = file.dtype
    if dtype is None:
        return {slot.name: file.read(handle, slot.name).to(device or "cpu") for slot in layout.slots}
    on_gpu = device is not None and torch.device(device).type == "cuda"
    buffer = layout.flat_buffer(dtype, pin_memory=on_gpu)
    raw = memoryview(buffer.view(torch.uint8).numpy())
    size = buffer.element_size()
    for slot in layout.slots:
        start = slot.word_offset * WORD_BITS * size
        file.read_into(handle, slot.name, raw[start:start + slot.numel * size])
    return FlatUpdate(layout, buffer.to(device or "cpu", non_blocking=True))


def _check_finite_reference(ref: AdapterFile, base: Mapping[str, torch.Tensor]) -> None:
    values = [base.buffer] if isinstance(base, FlatUpdate) else base.values()
    if all(bool(torch.isfinite(v).all()) for v in values):
        return
    for name, tensor in base.items():  # name the first tensor at fault
        if not bool(torch.isfinite(tensor).all()):
            raise InputError("reference holds NaN or Inf values", client=ref.client, tensor=name)


def update_from_reference(adapter: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
    """``adapter - reference`` in the wider of the two float dtypes.

    Both convert exactly to that dtype, and an IEEE difference (with gradual underflow) rounds to the
    sign of the exact difference and is zero only when the two are equal, so every report (negative,
    zero, positive) is exact. A float32 difference would turn ``1 + 1e-12`` minus ``1`` in float64 into 0.
    """
    dtype = torch.promote_types(adapter.dtype, reference.dtype)
    return adapter.to(dtype) - reference.to(dtype)


def score_labels(labels: Mapping[str, object], *, num_labels: int, peers: int | None = None, seed: int = 0,
                 penalty: str = "expected", bonus_fraction: float = 0.5, duplicates: str = "zero") -> RewardReport:
    """KFCA-D: rewards of clients' predicted labels on a shared data set (one task per example).

    ``duplicates`` as in ``score_updates``; for labels only identical reports and pairs agreeing on
    all but ``DuplicateRule.max_disagreement`` of the examples are copies (the excess-correlation rule
    is for sign reports).
    """
    seed = check_seed(seed)
    check_penalty(penalty)
    check_duplicate_policy(duplicates)
    clients, rows = _label_rows(labels, num_labels)
    index_pairs = peer_pairs(len(clients), peers, seed)
    if (len(index_pairs) + 1) * num_labels ** 2 > MAX_REPORT_CELLS:
        raise InputError(f"{len(index_pairs)} pairs x {num_labels}^2 labels is too large a report (one L x L delta "
                         "matrix per pair); use fewer labels, peers or clients")
    round_labels = LabelRound(rows, num_labels, seed=seed, bonus_fraction=bonus_fraction)
    groups = find_duplicates(clients, round_labels.disagreements(), round_labels.n_tasks,
                             DuplicateRule(excess_correlation=False))
    counts = round_labels.round_counts(index_pairs, penalty)
    payments, bonuses, penalties = (v.tolist() for v in label_pair_payments(counts))
    keys = [(clients[i], clients[j]) for i, j in index_pairs.tolist()]
    terms = {key: PairPayment(*values) for key, *values in zip(keys, payments, bonuses, penalties)}
    return RewardReport.from_pairs(
        terms, dict(zip(keys, counts.joints)), seed=seed, penalty=penalty, bonus_fraction=bonus_fraction,
        backend="labels", labels=tuple(str(k) for k in range(num_labels)), tasks={"tasks": round_labels.n_tasks},
        duplicates=groups, duplicate_policy=duplicates,
    )


def _label_rows(labels: Mapping[str, object], num_labels: int) -> tuple[list[str], list[np.ndarray]]:
    """(client ids in sorted order, their label arrays), every one checked: 1-D integers in [0, num_labels)."""
    if not isinstance(labels, Mapping) or len(labels) < 2:
        raise InputError("labels must map at least two client ids to label arrays")
    as_str = {str(c): v for c, v in labels.items()}
    if len(as_str) != len(labels):
        raise InputError(f"client ids collide once converted to strings: {list(labels)}")
    check_num_labels(num_labels)
    if num_labels > MAX_LABELS:
        raise InputError(f"num_labels {num_labels} is above {MAX_LABELS}: the report holds an L x L delta "
                         "matrix per scored pair; group the labels or score the examples in smaller label sets")
    clients = sorted(as_str)
    rows = []
    for client in clients:
        r = np.asarray(as_str[client])
        if r.ndim != 1 or r.size == 0:
            raise InputError("labels must be a non-empty 1-D array", client=client)
        if not np.issubdtype(r.dtype, np.integer):
            raise InputError(f"labels must be integers, got dtype {r.dtype}", client=client)
        if r.min() < 0 or r.max() >= num_labels:
            raise InputError(f"labels must lie in [0, {num_labels})", client=client)
        rows.append(r)
    sizes = {r.size for r in rows}
    if len(sizes) != 1:
        raise InputError(f"every client must label the same tasks; got lengths {sorted(sizes)}")
    return clients, rows
