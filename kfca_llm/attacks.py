"""Attack injectors: what a strategic client submits instead of its honest adapter update.

The built-in attacks, registered in ``kfca_llm.attack_registry`` (the attack function's contract, how to
register your own; this module re-exports its names). Built-in specs (the paper's attack analysis, appendix
"KFCA-QP for Federated LLM Fine-Tuning"):

=============  ==================================================================================
``honest``     the honest update itself
``stale``      the round-1 update in every round (in round 1 that is the honest update)
``lagged:K``   the update of round t-K (K >= 1); while t <= K, the oldest available one, i.e. the
               round-1 update (so lagged:K behaves like ``stale`` during the first K rounds)
``sparse:P``   each coordinate kept honest with probability P in (0, 1), otherwise replaced by a
               Gaussian value with the honest tensor's standard deviation
``flip``       the negated update
``flip-after:K``  honest for its first K updates, then negated (a sleeper: builds a record, then spends it)
``zero``       all zeros
``scaled:F``   F times the honest update (F finite; ``scaled:-10`` is a flip ten times as large)
``random``     Gaussian noise with the honest tensor's standard deviation (per tensor)
``copy:NOISE`` another honest client's update of the same round (chosen by the generator), plus
               Gaussian noise of NOISE times each tensor's standard deviation (NOISE >= 0)
``collude:G``  every attacker of group G submits one shared random update of the round (Gaussian,
               each tensor's standard deviation over the round's honest updates)
=============  ==================================================================================

torch is imported inside the functions that use it, so validating attack specs (a recipe does) stays
light.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from .attack_registry import (Attack, AttackContext, AttackFn, first_round_apart, register_attack,  # noqa: F401
                              replayed_round, resolve_attack, resolve_attacks, valid_specs)
from .errors import InputError

if TYPE_CHECKING:
    import torch


# --- parameter parsers (public: attacks registered elsewhere parse with them too) ---------------------

def positive_int(what: str) -> Callable[[str], int]:
    """A parser of an integer >= 1; ``what`` names it in the error."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise ValueError(f"{text!r} is not an integer") from None
        if value < 1:
            raise ValueError(f"{what} must be >= 1, got {value}")
        return value
    return parse


def _open_unit_fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{text!r} is not a number") from None
    if not 0.0 < value < 1.0:
        raise ValueError(f"fraction must lie strictly between 0 and 1, got {value}")
    return value


# --- randomness on the tensor's device -------------------------------------------------------------

def _generator_for(device: torch.device, generator: torch.Generator,
                   cache: dict[torch.device, torch.Generator]) -> torch.Generator:
    """The given generator where it lives, else one for ``device`` seeded from it (once per call)."""
    import torch

    if torch.device(generator.device).type == device.type:
        return generator
    if device not in cache:
        derived = torch.Generator(device=device)
        derived.manual_seed(int(torch.randint(0, 2**62, (1,), generator=generator)))
        cache[device] = derived
    return cache[device]


def _float_std(name: str, t: torch.Tensor) -> torch.Tensor:
    if not t.is_floating_point():
        raise InputError(f"noise attacks need a floating-point update, got {t.dtype}", tensor=name)
    # Population std in float32 (bf16 std is coarse; a one-element tensor has no sample std).
    return t.float().std(correction=0) if t.numel() > 1 else t.float().abs().reshape(())


def _gaussian_like(t: torch.Tensor, std: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    import torch

    return torch.randn(t.shape, generator=g, device=t.device, dtype=torch.float32) * std


# --- built-in attacks ---------------------------------------------------------------------------

@register_attack("honest", replays=lambda t: t)
def honest_update(honest, history, generator):
    return {k: v.clone() for k, v in honest.items()}


@register_attack("stale", replays=lambda t: 1)
def stale_update(honest, history, generator):
    source = history[0] if history else honest
    return {k: source[k].clone() for k in honest}


@register_attack("lagged", parse=positive_int("lag"), usage="lagged:K (K >= 1)", replays=lambda t, lag: max(1, t - lag))
def lagged_update(honest, history, generator, lag: int):
    # history[-1] is round t-1, so round t-K is history[-K]; before round K+1 the oldest there is.
    if not history:
        source = honest
    else:
        source = history[-lag] if lag <= len(history) else history[0]
    return {k: source[k].clone() for k in honest}


@register_attack("sparse", parse=_open_unit_fraction, usage="sparse:P (0 < P < 1)")
def sparse_update(honest, history, generator, keep: float):
    import torch

    cache: dict[torch.device, torch.Generator] = {}
    out = {}
    for name in sorted(honest):  # draw in name order: the same noise whatever the dict's order
        t = honest[name]
        g = _generator_for(t.device, generator, cache)
        std = _float_std(name, t)
        kept = torch.rand(t.shape, generator=g, device=t.device) < keep
        out[name] = torch.where(kept, t, _gaussian_like(t, std, g).to(t.dtype))
    return {name: out[name] for name in honest}


@register_attack("flip")
def flipped_update(honest, history, generator):
    return {k: -v for k, v in honest.items()}


@register_attack("flip-after", parse=positive_int("the honest updates before flipping"), usage="flip-after:K (honest for K updates, then flipped)")
def flip_after_update(honest, history, generator, after: int):
    # ``history`` holds the updates this client made before this one: honest while fewer than K.
    return flipped_update(honest, history, generator) if len(history) >= after else honest_update(honest, history, generator)


@register_attack("on-off")
def on_off_update(honest, history, generator):
    # Honest on its 1st, 3rd, ... update, flipped on its 2nd, 4th, ...: a record half good, never wholly spent.
    return flipped_update(honest, history, generator) if len(history) % 2 else honest_update(honest, history, generator)


@register_attack("zero")
def zero_update(honest, history, generator):
    import torch

    return {k: torch.zeros_like(v) for k, v in honest.items()}


@register_attack("random")
def random_update(honest, history, generator):
    cache: dict[torch.device, torch.Generator] = {}
    out = {name: _gaussian_like(honest[name], _float_std(name, honest[name]),
                                _generator_for(honest[name].device, generator, cache)).to(honest[name].dtype)
           for name in sorted(honest)}  # name order: the same noise whatever the dict's order
    return {name: out[name] for name in honest}


def non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{text!r} is not a number") from None
    if not value >= 0.0 or value == float("inf"):
        raise ValueError(f"noise scale must be a finite number >= 0, got {value}")
    return value


def _finite_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{text!r} is not a number") from None
    if value != value or value in (float("inf"), float("-inf")):
        raise ValueError(f"scale must be a finite number, got {value}")
    return value


@register_attack("scaled", parse=_finite_float, usage="scaled:F (F x the honest update; scaled:-10 is a scaled flip)")
def scaled_update(honest, history, generator, scale: float):
    return {k: v * scale for k, v in honest.items()}


def _group_name(text: str) -> str:
    if not text.strip() or not text.isidentifier():
        raise ValueError(f"group must be a name of letters, digits and underscores, got {text!r}")
    return text


@register_attack("copy", parse=non_negative_float, usage="copy:NOISE (NOISE >= 0)", context=True)
def copy_update(context: AttackContext, noise: float):
    """Another honest client's update of this round plus ``noise`` x its tensors' std of Gaussian noise."""
    import torch

    if not context.others:
        raise InputError("copy needs another client's update in the round", client=context.client)
    ids = sorted(context.others)
    source = context.others[ids[int(torch.randint(len(ids), (1,), generator=context.generator))]]
    if noise == 0.0:
        return {k: source[k].clone() for k in context.honest}
    cache: dict[torch.device, torch.Generator] = {}
    out = {}
    for name in sorted(context.honest):  # name order: the same noise whatever the dict's order
        t = source[name]
        g = _generator_for(t.device, context.generator, cache)
        out[name] = (t.float() + noise * _gaussian_like(t, _float_std(name, t), g)).to(t.dtype)
    return {name: out[name] for name in context.honest}


@register_attack("collude", parse=_group_name, usage="collude:GROUP", context=True)
def colluding_update(context: AttackContext, group: str):
    """One random update shared by every member of ``group`` in this round: Gaussian noise with each
    tensor's standard deviation over the round's honest updates (the same inputs for every member)."""
    import zlib

    import torch

    shared = torch.Generator().manual_seed((context.round_seed << 32) ^ zlib.crc32(group.encode()))
    updates = [context.honest, *context.others.values()]
    out = {}
    for name in sorted(context.honest):
        t = context.honest[name]
        std = _float_std(name, torch.stack([u[name].float() for u in updates]))
        out[name] = _gaussian_like(t.cpu(), std.cpu(), shared).to(t.device, t.dtype)
    return {name: out[name] for name in context.honest}


PAPER_ATTACKS: tuple[str, ...] = (
    "honest", "lagged:2", "lagged:3", "lagged:4", "lagged:5", "stale",
    "sparse:0.75", "sparse:0.5", "sparse:0.25", "flip", "zero", "random",
)
"""The strategies of the paper's attack-analysis figure."""
