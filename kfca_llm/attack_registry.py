"""The attack registry: how an attack is named (a spec such as ``lagged:3``), registered and resolved.

An attack is a function ``(honest, history, generator) -> submitted`` where

* ``honest`` is the client's honest update of this round (a state dict name -> tensor),
* ``history`` is the client's own past honest updates, oldest first, this round excluded
  (``history[0]`` is the round-1 update once round 1 is over),
* ``generator`` is a seeded ``torch.Generator``; attacks that draw random numbers draw them on each
  tensor's own device (a generator for another device is derived from it, deterministically), tensor by
  tensor in sorted name order, so the draws do not depend on the state dict's key order.

Attacks return a new state dict with the honest tensors' shapes, dtypes and devices, and never
mutate their inputs.

Register your own with ``@register_attack("name")`` (no parameter) or
``@register_attack("name", parse=parser, usage="name:X (meaning)")``, where ``parser(text)`` turns the
text after the colon into the parameter (raise ``ValueError`` to reject it) and the decorated
function takes it as a fourth argument. An attack that needs the round itself (the other clients'
honest updates, the round number) registers with ``context=True`` and takes one ``AttackContext``
(plus the parameter) instead of ``(honest, history, generator)``.

The built-in attacks register in ``kfca_llm.attacks``, which re-exports these names (import them from there:
the built-ins are then registered too), the free riders in ``kfca_llm.attacks_public``.
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
