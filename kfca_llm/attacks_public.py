"""Free riders: attacks that train nothing and submit what the global adapter's public trajectory predicts.

A client knows the global adapters it received (``AttackContext.public``: oldest first, the last one the
global it receives this round). The *global step over K rounds* is the newest of them minus the one K
receptions earlier, or minus the oldest one when the client has received fewer than K + 1 (in ``simulate``
the analysis client receives every global, so its oldest is the initial adapter). In a client's first round
(one global received) the step is zero, and every free rider submits zeros: there is no change to replay.

=======================  ==========================================================================
``free-ride:K``          the global step over K rounds, each tensor rescaled to the norm of the same
                         tensor of the client's honest update (per tensor: a norm check per layer sees an
                         honest-looking update; the signs, which KFCA reads, are the step's)
``free-ride-flip:K``     the same, negated
``free-ride-noise:SIGMA``  the disguised free rider (Fraboni et al., AISTATS 2021): ``free-ride:1`` plus
                         Gaussian noise of SIGMA times each rescaled tensor's root mean square, so the noise
                         is SIGMA times the step's norm (SIGMA >= 0)
``free-ride-signs:K``    the signs of the global step over K rounds with magnitudes of its own: absolute
                         Gaussian values with the honest tensor's standard deviation (zero where the step is)
=======================  ==========================================================================

They register through ``register_public_attack`` (``kfca_llm.attacks.register_attack`` with ``context=True``,
plus how many of the newest globals the attack reads: ``public_window(spec)``, 0 for any other attack, so a round
loop keeps no more than that); ``kfca_llm/__init__`` imports this module, so every spec is valid wherever an attack
spec is.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from .attacks import AttackContext, non_negative_float, positive_int, register_attack, resolve_attack
from .errors import InputError
from .tensors import StateDict

if TYPE_CHECKING:
    import torch

NOISY_STEPS = 1
"""The rounds ``free-ride-noise`` replays (Fraboni's free rider: the last change of the global)."""

_WINDOWS: dict[str, Callable[[object], int]] = {}


_rounds = positive_int("the rounds of the global step")


def public_window(spec: str) -> int:
    """How many of the newest received globals ``spec`` reads (0: none; the spec must be valid)."""
    attack = resolve_attack(spec)
    window = _WINDOWS.get(attack.spec.partition(":")[0])
    return window(attack.param) if window is not None else 0


def public_windows(specs: Sequence[str]) -> int:
    """The most globals any of ``specs`` reads (0 when none reads the public trajectory)."""
    return max((public_window(s) for s in specs), default=0)


def global_step(context: AttackContext, rounds: int) -> StateDict:
    """The global's change over the last ``rounds`` receptions (float32, on the honest tensors' devices)."""
    if not context.public:
        raise InputError("a free rider needs the global adapters the client received (AttackContext.public)",
                         client=context.client)
    newest = context.public[-1]
    older = context.public[-1 - rounds] if rounds < len(context.public) else context.public[0]
    return {name: (newest[name].float() - older[name].float()).to(t.device) for name, t in context.honest.items()}


def _rescaled(context: AttackContext, step: StateDict) -> StateDict:
    """Each tensor of ``step`` with the norm of the honest tensor of the same name (zero stays zero)."""
    out = {}
    for name, t in context.honest.items():
        norm = step[name].norm()
        out[name] = step[name] * (t.float().norm() / norm) if norm > 0 else step[name]
    return out


def _standard_normal(t: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Draws on the generator's device (any device's generator gives the same draws there), moved to ``t``'s."""
    import torch

    return torch.randn(t.shape, generator=generator, device=generator.device).to(t.device)


def register_public_attack(name: str, usage: str, window: Callable[[object], int], parse: Callable[[str], object]):
    """``register_attack(name, parse=parse, usage=usage, context=True)`` for an attack that reads
    ``AttackContext.public``; ``window(param)`` is how many of the newest globals it reads (a round loop keeps
    only those: an attack registered without it sees none in ``simulate``)."""
    def decorate(fn):
        _WINDOWS[name] = window
        return register_attack(name, parse=parse, usage=usage, context=True)(fn)
    return decorate


def _as_honest(context: AttackContext, out: StateDict) -> StateDict:
    return {name: out[name].to(t.dtype) for name, t in context.honest.items()}


@register_public_attack("free-ride", "free-ride:K (the global's change over K rounds, at the honest norm)",
                        window=lambda rounds: rounds + 1, parse=_rounds)
def free_ride_update(context: AttackContext, rounds: int) -> StateDict:
    return _as_honest(context, _rescaled(context, global_step(context, rounds)))


@register_public_attack("free-ride-flip", "free-ride-flip:K (free-ride:K negated)",
                        window=lambda rounds: rounds + 1, parse=_rounds)
def free_ride_flipped_update(context: AttackContext, rounds: int) -> StateDict:
    return _as_honest(context, {name: -v for name, v in _rescaled(context, global_step(context, rounds)).items()})


@register_public_attack("free-ride-noise",
                        "free-ride-noise:SIGMA (free-ride:1 plus SIGMA x its norm of Gaussian noise)",
                        window=lambda sigma: NOISY_STEPS + 1, parse=non_negative_float)
def free_ride_noisy_update(context: AttackContext, sigma: float) -> StateDict:
    rescaled = _rescaled(context, global_step(context, NOISY_STEPS))
    out = {}
    for name in sorted(rescaled):  # draw in name order: the same noise whatever the dict's order
        v = rescaled[name]
        rms = v.norm() / math.sqrt(max(v.numel(), 1))
        out[name] = v + sigma * rms * _standard_normal(v, context.generator)
    return _as_honest(context, out)


@register_public_attack("free-ride-signs", "free-ride-signs:K (the signs of the global's change over K rounds, "
                        "magnitudes drawn)", window=lambda rounds: rounds + 1, parse=_rounds)
def free_ride_signs_update(context: AttackContext, rounds: int) -> StateDict:
    step = global_step(context, rounds)
    out = {}
    for name in sorted(step):  # name order, as above
        honest = context.honest[name].float()
        std = honest.std(correction=0) if honest.numel() > 1 else honest.abs().reshape(())
        out[name] = step[name].sign() * (_standard_normal(honest, context.generator) * std).abs()
    return _as_honest(context, out)
