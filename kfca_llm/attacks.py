"""Attack injectors: what a strategic client submits instead of its honest adapter update.

An attack is a function ``(honest, history, generator) -> submitted`` where

* ``honest`` is the client's honest update of this round (a state dict name -> tensor),
* ``history`` is the client's own past honest updates, oldest first, this round excluded
  (``history[0]`` is the round-1 update once round 1 is over),
* ``generator`` is a seeded ``torch.Generator``; attacks that draw random numbers draw them on each
  tensor's own device (a generator for another device is derived from it, deterministically), tensor by
  tensor in sorted name order, so the draws do not depend on the state dict's key order.

Attacks return a new state dict with the honest tensors' shapes, dtypes and devices, and never
mutate their inputs. Built-in specs (the paper's attack analysis, appendix "KFCA-QP for Federated
LLM Fine-Tuning"):

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

Register your own with ``@register_attack("name")`` (no parameter) or
``@register_attack("name", parse=parser, usage="name:X (meaning)")``, where ``parser(text)`` turns the
text after the colon into the parameter (raise ``ValueError`` to reject it) and the decorated
function takes it as a fourth argument. An attack that needs the round itself (the other clients'
honest updates, the round number) registers with ``context=True`` and takes one ``AttackContext``
(plus the parameter) instead of ``(honest, history, generator)``.

torch is imported inside the functions that use it, so validating attack specs (a recipe does) stays
light.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .errors import InputError
from .tensors import StateDict

if TYPE_CHECKING:
    import torch

AttackFn = Callable[..., StateDict]


@dataclass(frozen=True)
class AttackContext:
    """Everything an attacking client knows in a round."""

    client: str
    round: int
    honest: Mapping[str, torch.Tensor]
    """The client's own honest update of this round."""
    history: Sequence[Mapping[str, torch.Tensor]]
    """The client's past honest updates, oldest first, this round excluded."""
    generator: torch.Generator
    """Seeded for this client, round and spec."""
    others: Mapping[str, Mapping[str, torch.Tensor]] = field(default_factory=dict)
    """The other clients' honest updates of this round, by client id."""
    round_seed: int = 0
    """A seed every attacker of this round shares (for colluding groups)."""
    public: Sequence[Mapping[str, torch.Tensor]] = ()
    """The global adapters the client received, oldest first, the last one this round's (what free riders
    replay, ``attacks_public``); a round loop may keep only the newest ones the attacks read."""


@dataclass(frozen=True)
class _Registration:
    fn: AttackFn
    parse: Callable[[str], Any] | None
    usage: str
    context: bool
    replays: Callable[..., int] | None = None


_REGISTRY: dict[str, _Registration] = {}


def register_attack(name: str, *, parse: Callable[[str], Any] | None = None, usage: str | None = None,
                    context: bool = False, replays: Callable[..., int] | None = None
                    ) -> Callable[[AttackFn], AttackFn]:
    """Decorator registering an attack under ``name`` (``parse`` given: the spec is ``name:PARAM``;
    ``context``: the function takes an ``AttackContext`` instead of ``(honest, history, generator)``;
    ``replays``: for an attack that submits one of the client's own honest updates unchanged,
    ``replays(t[, param])`` is the round whose update it submits in round t)."""
    if not name or ":" in name or name != name.strip():
        raise InputError(f"attack name must be non-empty, without ':' or surrounding spaces: {name!r}")

    def decorate(fn: AttackFn) -> AttackFn:
        _REGISTRY[name] = _Registration(fn, parse, usage or (f"{name}:PARAM" if parse else name), context, replays)
        return fn

    return decorate


def valid_specs() -> list[str]:
    """Usage strings of every registered attack, in registration order."""
    return [reg.usage for reg in _REGISTRY.values()]


@dataclass(frozen=True)
class Attack:
    """A resolved attack spec; call it like the attack function."""

    spec: str
    fn: AttackFn
    param: Any = None
    has_param: bool = False
    needs_context: bool = False

    def submit(self, context: AttackContext) -> StateDict:
        """The submission of ``context.client`` in ``context.round``."""
        args = (self.param,) if self.has_param else ()
        if self.needs_context:
            return self.fn(context, *args)
        return self.fn(context.honest, context.history, context.generator, *args)

    def __call__(self, honest: Mapping[str, torch.Tensor], history: Sequence[Mapping[str, torch.Tensor]],
                 generator: torch.Generator) -> StateDict:
        """The attack without a round context (attacks registered with ``context=True`` need ``submit``)."""
        return self.submit(AttackContext(client="", round=0, honest=honest, history=history, generator=generator))


def resolve_attack(spec: str) -> Attack:
    """Attack of a spec string such as ``"flip"`` or ``"lagged:3"``; bad specs raise ``InputError``."""
    if not isinstance(spec, str):
        raise InputError(f"attack spec must be a string, got {spec!r}; {_valid_text()}")
    name, colon, text = spec.strip().partition(":")
    reg = _REGISTRY.get(name)
    if reg is None:
        from .plugins import load_attack_entry_points

        if load_attack_entry_points():  # installed packages' attacks, imported when first needed
            return resolve_attack(spec)
        raise InputError(f"unknown attack {spec!r}; {_valid_text()} (your own: --plugins MODULE, docs/simulate.md)")
    if reg.parse is None:
        if colon:
            raise InputError(f"attack {name!r} takes no parameter, got {spec!r}; {_valid_text()}")
        return Attack(spec.strip(), reg.fn, needs_context=reg.context)
    if not colon or not text:
        raise InputError(f"attack {name!r} needs a parameter ({reg.usage}), got {spec!r}; {_valid_text()}")
    try:
        param = reg.parse(text)
    except ValueError as exc:
        raise InputError(f"bad parameter in attack spec {spec!r}: {exc}; {_valid_text()}") from None
    return Attack(spec.strip(), reg.fn, param, True, reg.context)


def replayed_round(spec: str, server_round: int) -> int | None:
    """The round whose honest update ``spec`` submits unchanged in ``server_round``; None for an attack that
    submits anything else (or a spec this process does not know)."""
    try:
        attack = resolve_attack(spec)
    except InputError:
        return None
    replays = _REGISTRY[attack.spec.partition(":")[0]].replays
    if replays is None:
        return None
    return replays(server_round, attack.param) if attack.has_param else replays(server_round)


def first_round_apart(a: str, b: str, rounds: Sequence[int]) -> int | None:
    """The first round after ``rounds`` in which ``a`` and ``b`` can submit different updates, when they submit
    the same one in every round of ``rounds`` (two replays of the same honest round: ``lagged:2`` and ``stale``
    in rounds 1-3); None when they can differ in one of ``rounds``."""
    if not rounds or any(replayed_round(a, t) is None or replayed_round(b, t) is None
                         or replayed_round(a, t) != replayed_round(b, t) for t in rounds):
        return None
    # The built-in replays part within their lag; two registered ones that never do are left measurable.
    return next((t for t in range(max(rounds) + 1, max(rounds) + 10_001)
                 if replayed_round(a, t) != replayed_round(b, t)), None)


def resolve_attacks(specs: Sequence[str]) -> list[Attack]:
    """Resolve several specs; duplicates raise (they would share one reward entry)."""
    attacks = [resolve_attack(s) for s in specs]
    seen: set[str] = set()
    for a in attacks:
        if a.spec in seen:
            raise InputError(f"attack spec {a.spec!r} listed twice")
        seen.add(a.spec)
    return attacks


def _valid_text() -> str:
    return "valid specs: " + ", ".join(valid_specs())


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
