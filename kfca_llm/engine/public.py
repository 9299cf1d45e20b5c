"""Public strata: what the global model's recent steps already say about each coordinate (issue 43).

The server knows every global it sent, so it knows the public trajectory. A report that is a function of it
(the last step's signs, a sum of the last few, their negation) agrees with honest peers only because honest
updates follow the trajectory too; KFCA should not pay for that. So every coordinate gets a *stratum* of
public information, and the penalty task pairs are drawn within the bonus task's stratum (the Peer Truth
Serum's idea: pay agreement beyond what the public prior predicts). A report constant within each stratum
then earns exactly its expected penalty on the bonus tasks, 0 in expectation.

A coordinate's stratum, from the newest steps ``g_1`` (newest), ``g_2``, ...:

* ``K`` sign bits at doubling spans: bit ``k`` is set where ``g_1 + ... + g_(s_k) < 0`` with ``s_k = 2**k`` (the
  reports' convention: -0.0 and 0 are not negative), so the global's change over the last 1, 2, 4, ... rounds is
  constant within a stratum, and a change over a span in between (a client sampled every 10 rounds replays the
  change since it was last sampled) is nearly so. Early in a run, with ``L < 2**(K-1)`` steps, the spans are
  ``min(2**k, L)`` without repeats: every step known counts;
* where the server knows when it sent each participant of the round a global (``KFCAStrategy``, ``simulate``), the
  participants' *reception gaps* take sign planes of their own: the change over the steps since each one's previous
  global, what a free rider replays, so its replay is constant within the strata whoever it meets (two free riders
  with gaps of 7 and 5 rounds share the change over the 5 newest steps, which no doubling span holds, and are paid
  for it without the gaps' planes). The planes stay ``K``: each gap replaces the doubling span nearest it
  (``public_spans``). A gap longer than the steps kept takes the global's change since that participant's previous
  global where the server kept it (``changes``: the global a node last received, kept until it returns), else it is
  clipped to the steps kept;
* ``log2(Q)`` magnitude bits: the bucket of ``|g_1|`` among ``Q`` quantile buckets of its tensor (bucket
  ``b`` counts the thresholds ``|g_1|`` reaches; threshold ``q`` is the ``floor(q n / Q)``-th smallest value,
  an element of the tensor, so no interpolation and no float that a device could round differently).

The planes are packed like the sign words (``engine.layout``): plane ``p`` is bit ``p`` of the stratum.
Everything is elementwise float64 arithmetic, a sort and comparisons: the same bits on every device.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from ..errors import InputError
from ..kernels.intrinsics import WORD_BITS
from .layout import Layout

MAX_STEPS = 5
MAX_PLANES = 6  # 64 strata: the CPU kernel's masks per chunk of words stay within 1.5 MiB


@dataclass(frozen=True)
class PublicConditioning:
    """How scoring conditions on the public trajectory: ``steps`` sign planes of the global's change over the last
    1, 2, 4, ... ``2**(steps-1)`` rounds (0: off, the paper's rewards bit for bit) and ``magnitude_buckets`` quantile
    buckets of the newest step's magnitude."""

    steps: int = 5
    magnitude_buckets: int = 2

    def __post_init__(self):
        if isinstance(self.steps, bool) or not isinstance(self.steps, (int, np.integer)) \
                or not 0 <= self.steps <= MAX_STEPS:
            raise InputError(f"public steps must be an integer in [0, {MAX_STEPS}], got {self.steps!r}")
        q = self.magnitude_buckets
        if isinstance(q, bool) or not isinstance(q, (int, np.integer)) or q < 1 or q & (q - 1):
            raise InputError(f"magnitude buckets must be a power of two (1, 2, 4, ...), got {q!r}")
        if self.steps + self.magnitude_bits > MAX_PLANES:
            raise InputError(f"public steps + log2(magnitude buckets) must be at most {MAX_PLANES} "
                             f"(2**{MAX_PLANES} strata), got {self.steps} + {self.magnitude_bits}")

    @property
    def magnitude_bits(self) -> int:
        return int(math.log2(self.magnitude_buckets))

    @property
    def enabled(self) -> bool:
        return self.steps > 0

    @property
    def history(self) -> int:
        """How many of the newest global steps the planes read (the longest span; 0 when off)."""
        return 1 << (self.steps - 1) if self.steps else 0


OFF = PublicConditioning(steps=0, magnitude_buckets=1)


@dataclass(frozen=True)
class PublicPlanes:
    """The packed strata of one round: ``words`` int32 [P, n_words] (numpy or torch), plane p = stratum bit p."""

    words: object
    steps: int
    """How many sign planes (spans) there are: fewer than asked for early in a run."""
    magnitude_bits: int
    spans: tuple[int, ...] = ()
    """The span of each sign plane (newest steps summed), in plane order; () where not known (planes read back)."""

    @property
    def n_planes(self) -> int:
        return self.steps + self.magnitude_bits

    def host_words(self) -> np.ndarray:
        words = self.words
        return words.cpu().numpy() if isinstance(words, torch.Tensor) else np.asarray(words, dtype=np.int32)


def check_public_steps(layout: Layout, steps: Sequence[Mapping]) -> list[Mapping]:
    """The public steps (oldest first) validated like updates: each a state dict of this layout's tensors, exact
    shapes, floating point, finite; errors name the step (``public[i]``) and the tensor."""
    if isinstance(steps, (Mapping, str, bytes)) or not isinstance(steps, Sequence):
        raise InputError(f"public must be a list of steps (state dicts, oldest first), got {type(steps).__name__}")
    return [_checked_step(layout, step, f"public[{index}]") for index, step in enumerate(steps)]


def check_long_changes(layout: Layout, changes: Mapping[int, Mapping], n_steps: int) -> dict[int, Mapping]:
    """``public_planes``' ``changes`` validated: span (an integer above ``n_steps``) -> a state dict checked like a
    step; errors name the change (``changes[span]``) and the tensor."""
    if not isinstance(changes, Mapping):
        raise InputError(f"changes must map spans to state dicts, got {type(changes).__name__}")
    out = {}
    for span, change in changes.items():
        if isinstance(span, bool) or not isinstance(span, (int, np.integer)) or span <= n_steps:
            raise InputError(f"a change's span must be an integer above the {n_steps} steps given, got {span!r}")
        out[int(span)] = _checked_step(layout, change, f"changes[{span}]")
    return out


def _checked_step(layout: Layout, step: Mapping, who: str) -> Mapping:
    if not isinstance(step, Mapping):
        raise InputError(f"a public step must be a state dict, got {type(step).__name__}", client=who)
    for name in sorted(set(layout.names) - set(step)):
        raise InputError("tensor missing from the public step", client=who, tensor=name)
    for name in sorted(set(step) - set(layout.names)):
        raise InputError("tensor is not in the updates' layout", client=who, tensor=name)
    for slot in layout.slots:
        t = step[slot.name]
        if isinstance(t, np.ndarray):
            if not np.issubdtype(t.dtype, np.floating):
                raise InputError(f"dtype {t.dtype} is not a floating-point type", client=who, tensor=slot.name)
            t = torch.from_numpy(np.ascontiguousarray(t))
        if not isinstance(t, torch.Tensor) or t.layout is not torch.strided or t.is_meta:
            raise InputError(f"expected a dense tensor or numpy array, got {type(t).__name__}", client=who,
                             tensor=slot.name)
        if not t.is_floating_point():
            raise InputError(f"dtype {t.dtype} is not a floating-point type", client=who, tensor=slot.name)
        if tuple(t.shape) != slot.shape:
            raise InputError(f"shape {tuple(t.shape)} differs from the updates' {slot.shape}", client=who,
                             tensor=slot.name)
        if not bool(torch.isfinite(t).all()):
            raise InputError("public step holds NaN or Inf values", client=who, tensor=slot.name)
    return step


def public_planes(layout: Layout, steps: Sequence[Mapping], conditioning: PublicConditioning,
                  device=None, gaps: Sequence[int] = (), changes: Mapping[int, Mapping] | None = None
                  ) -> PublicPlanes | None:
    """The strata planes of ``steps`` (oldest first; the newest ``conditioning.history`` count), on ``device``; None
    when conditioning is off or there is no step (round 1: nothing public yet). ``gaps``: the round's participants'
    reception gaps (``public_spans``); ``changes``: gap -> the global's change over it, for gaps longer than the
    steps given (the global now less the one that participant received before), each a span of its own."""
    steps = check_public_steps(layout, steps)
    changes = check_long_changes(layout, changes or {}, len(steps))
    spans = public_spans(conditioning, len(steps), gaps, longer=changes)
    if not spans:
        return None
    summed = [s for s in spans if s <= len(steps)]
    newest_first = steps[::-1][:summed[-1] if summed else 1]
    used = len(spans)
    n_planes = used + conditioning.magnitude_bits
    bits = torch.zeros((n_planes, layout.padded_numel), dtype=torch.bool, device=device)
    for slot in layout.slots:
        start = slot.word_offset * WORD_BITS
        stop = start + slot.numel
        values = [_flat(step[slot.name], device) for step in newest_first]
        total = torch.zeros_like(values[0])
        for n, value in enumerate(values, start=1):  # elementwise sums, newest first: the same on every device
            total = total + value
            if n in summed:
                bits[spans.index(n), start:stop] = total < 0
        for span in spans[len(summed):]:  # the change itself, not a sum of steps: its sign is the replay's
            bits[spans.index(span), start:stop] = _flat(changes[span][slot.name], device) < 0
        for b, plane in enumerate(magnitude_bucket_bits(values[0].abs(), conditioning.magnitude_buckets)):
            bits[used + b, start:stop] = plane
    return PublicPlanes(pack_planes(bits), steps=used, magnitude_bits=conditioning.magnitude_bits,
                        spans=tuple(spans))


def _flat(tensor, device) -> torch.Tensor:
    return torch.as_tensor(tensor).to(device=device, dtype=torch.float64).reshape(-1)


def doubling_spans(conditioning: PublicConditioning, n_steps: int) -> list[int]:
    """``min(2**k, n_steps)`` for ``k < conditioning.steps``, without repeats (sorted)."""
    return sorted({min(1 << k, n_steps) for k in range(conditioning.steps)} - {0})


def public_spans(conditioning: PublicConditioning, n_steps: int, gaps: Sequence[int] = (),
                 longer: Collection[int] = ()) -> list[int]:
    """The spans (newest steps summed) of the sign planes when ``n_steps`` steps are known, sorted.

    Without ``gaps``: the doubling spans ``min(2**k, n_steps)`` for ``k < conditioning.steps``, without repeats.
    ``gaps``: the reception gaps of the round's participants (how many steps the global took since the global each
    received before this round's; a free rider replays the change over it), each clipped to ``n_steps`` unless it
    is in ``longer`` (gaps whose change is known beyond the steps). Every distinct gap is a span (at most
    ``conditioning.steps`` of them: the most frequent, ties the shorter); the doubling spans fill the planes left,
    the one nearest a gap (ratio of spans; ties the longer) dropped first while there are more spans than planes. A
    replay over a participant's own gap is then constant within the strata, whoever it meets."""
    doubling = doubling_spans(conditioning, n_steps)
    if not doubling or not gaps:
        return doubling
    counts: dict[int, int] = {}
    for gap in gaps:
        if isinstance(gap, bool) or not isinstance(gap, (int, np.integer)) or gap < 1:
            raise InputError(f"a reception gap must be a positive integer (steps), got {gap!r}")
        clipped = int(gap) if gap in longer else min(int(gap), n_steps)
        counts[clipped] = counts.get(clipped, 0) + 1
    chosen = set(sorted(counts, key=lambda g: (-counts[g], g))[:conditioning.steps])
    spare = [s for s in doubling if s not in chosen]
    while spare and len(chosen) + len(spare) > conditioning.steps:
        spare.remove(min(spare, key=lambda s: (min(abs(math.log2(s / g)) for g in chosen), -s)))
    return sorted(chosen | set(spare))


def receptions_kept(received: Iterable[int], newest: int, limit: int) -> set[int]:
    """Which globals older than the newest steps to keep, by when they were sent: ``received`` the one each node or
    client was last sent (this round's participants' earlier ones among them), ``newest`` when the oldest global the
    steps read was sent. Those older than it, the newest ``limit`` of them: a participant back after more rounds than
    the steps is scored on the change since its own (``public_planes``' ``changes``); one whose global was dropped
    has its gap clipped to the steps."""
    return set(sorted({r for r in received if r < newest}, reverse=True)[:limit])


def magnitude_bucket_bits(magnitude: torch.Tensor, buckets: int) -> list[torch.Tensor]:
    """Bit planes (least significant first) of each value's quantile bucket within ``magnitude``."""
    if buckets == 1:
        return []
    n = magnitude.numel()
    bucket = torch.zeros(n, dtype=torch.uint8, device=magnitude.device)
    for q in range(1, buckets):
        # The (q n // Q)-th smallest value (0-based): an element, found by selection, not a full sort.
        threshold = torch.kthvalue(magnitude, min(q * n // buckets, n - 1) + 1).values
        bucket += magnitude >= threshold
    return [((bucket >> b) & 1).bool() for b in range(int(math.log2(buckets)))]


def pack_planes(bits: torch.Tensor) -> torch.Tensor:
    """bool [P, 32 w] -> int32 [P, w]: bit e % 32 of word e // 32, as the sign words. Packed a byte at a time
    (bit e % 8 of byte e // 8), and four bytes read as one little-endian int32 word: the same bit order."""
    lanes = torch.arange(8, dtype=torch.uint8, device=bits.device)
    packed = (bits.reshape(bits.shape[0], -1, 8).to(torch.uint8) << lanes).sum(dim=-1, dtype=torch.uint8)
    words = packed.reshape(bits.shape[0], -1, 4).to(torch.int32) << torch.arange(0, 32, 8, device=bits.device,
                                                                                   dtype=torch.int32)
    return words[..., 0] | words[..., 1] | words[..., 2] | words[..., 3]
