"""Expectations on a federation's rewards, read from a small TOML file (what ``kfca-llm check`` checks).

A file is a list of ``[[expect]]`` tables::

    [[expect]]
    name = "sparse attacks interpolate"          # optional; the check text by default
    check = "sparse:0.75 > sparse:0.5 > sparse:0.25 > 0"
    margin = 0.02          # each neighbour must exceed the next by more than this (default 0)
    # margin = "0.1 x honest"   # or a share of a strategy's mean reward (its magnitude) on the run
    # tolerance = 0.002    # instead of a margin: neighbours may tie or run backwards by less than this
    over = "mean"          # "mean": on the mean reward over rounds; "every-round": in each round
    from-round = 1         # rounds before it are left out (of the mean, or of every-round)
    seeds = "all"          # every seed must hold it, or a quantile q in [0, 1] over the seeds

``check`` is a chain of terms joined by ``>`` (or all by ``<``); every link is strict. A term is a
strategy of the report's attack analysis (``honest``, ``lagged:2``, ``sparse:0.5``, a registered attack),
a number, ``K x STRATEGY`` (``-0.5 x honest``), ``|STRATEGY|``, or ``*``: every strategy of the report
that the chain does not name (``honest > *``: honest above every attack). The word ``categorical-world``
instead checks Definition 3.1 on the delta matrices of the honest pairs (every diagonal entry above the
margin, every off-diagonal entry below minus the margin).

A margin or tolerance written ``K x STRATEGY`` is K times the magnitude of that strategy's mean reward over
the rounds read, on each run: rewards scale with how a round is scored (a participant scored against pool peers
of earlier rounds, at two clients per round, is paid about a fifth of what in-round peers pay at three of six),
and a share of the run's own honest reward holds the same meaning on both.

An optional top-level ``name`` (default: the file's stem) names the check in the table and the JUnit suite.
The file is validated like a recipe: unknown keys are refused with the closest valid key named.
"""

from __future__ import annotations

import difflib
import math
import re
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (BaseModel, BeforeValidator, ConfigDict, Field, StrictFloat, StrictInt, StrictStr, ValidationError,
                      field_validator, model_validator)

from .errors import InputError
from .text import quoted

DEFAULT_EXPECTATIONS = "paper-llm"
CATEGORICAL_WORLD = "categorical-world"
Over = Literal["mean", "every-round"]


class ExpectationError(InputError):
    """An expectations file is invalid; the message names the file, the entry and the key."""


# ----------------------------------------------------------------------------------------------------------
# The check text: a chain of terms


@dataclass(frozen=True)
class Term:
    """One side of a link: ``scale x strategy`` (``absolute``: ``|strategy|``), a constant, or ``*``."""

    strategy: str | None = None
    """None for a constant; ``*`` for every strategy the chain does not name."""
    scale: float = 1.0
    absolute: bool = False
    constant: float = 0.0

    @property
    def others(self) -> bool:
        return self.strategy == "*"

    def __str__(self) -> str:
        if self.strategy is None:
            return f"{self.constant:g}"
        if self.absolute:
            return f"|{self.strategy}|"
        return self.strategy if self.scale == 1.0 else f"{self.scale:g} x {self.strategy}"

    def value(self, reward: float) -> float:
        """This term given its strategy's reward (a constant ignores it)."""
        if self.strategy is None:
            return self.constant
        return abs(reward) if self.absolute else self.scale * reward


@dataclass(frozen=True)
class Chain:
    """``terms[0] > terms[1] > ...`` (``descending``), or all ``<``."""

    terms: tuple[Term, ...]
    descending: bool

    @property
    def named(self) -> tuple[str, ...]:
        return tuple(t.strategy for t in self.terms if t.strategy not in (None, "*"))

    def __str__(self) -> str:
        return f" {'>' if self.descending else '<'} ".join(map(str, self.terms))


# Each part of a term matches one way only (no nested or adjacent quantifiers over the same characters), and
# the chain is split on the bare operators: matching stays linear in the text's length.
_NUMBER = r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?"
_NAME = r"[A-Za-z_][\w:.\-]*"
_CONSTANT = re.compile(_NUMBER)
_SCALED = re.compile(rf"({_NUMBER}) *[x*] *({_NAME})")
_ABSOLUTE = re.compile(rf"\| *({_NAME}) *\|")
_STRATEGY = re.compile(_NAME)
_OPERATOR = re.compile(r"([<>])")
MAX_CHECK_TEXT = 4096
"""Characters of a ``check`` text (the longest shipped one has under 100)."""
CHECK_FORMS = ("'a > b > c'", "'|zero| < 0.02'", "'flip < -0.5 x honest'", "'honest > *'", f"'{CATEGORICAL_WORLD}'")


def _term(text: str) -> Term:
    text = text.strip(" ")
    if _CONSTANT.fullmatch(text):
        value = float(text)
        if not math.isfinite(value):
            raise ValueError(f"term {quoted(text)} is not a finite number")
        return Term(constant=value)
    if text == "*":
        return Term(strategy="*")
    if m := _SCALED.fullmatch(text):
        scale = float(m[1])
        if not math.isfinite(scale):
            raise ValueError(f"term {quoted(text)}: the factor is not a finite number")
        return Term(strategy=m[2], scale=scale)
    if m := _ABSOLUTE.fullmatch(text):
        return Term(strategy=m[1], absolute=True)
    if _STRATEGY.fullmatch(text):
        return Term(strategy=text)
    raise ValueError(f"term {quoted(text)} is not a strategy, a number, 'K x STRATEGY', '|STRATEGY|' or '*'")


def parse_check(text: str) -> Chain | None:
    """The chain of a ``check`` text; None for ``categorical-world``. Raises ValueError naming the problem."""
    if len(text) > MAX_CHECK_TEXT:
        raise ValueError(f"the check text has {len(text)} characters, more than {MAX_CHECK_TEXT}")
    if not text.isprintable():
        raise ValueError(f"{quoted(text)}: the check text holds control characters (a newline, a tab)")
    text = text.strip()
    if text == CATEGORICAL_WORLD:
        return None
    if re.search(r"[<>]=|==", text):
        raise ValueError(f"{quoted(text)}: every link is strict ('>' or '<'); a tolerance lets neighbours tie")
    parts = _OPERATOR.split(text)
    if len(parts) < 3:
        raise ValueError(f"{quoted(text)} is not a chain; write one of {', '.join(CHECK_FORMS)}")
    operators = set(parts[1::2])
    if len(operators) != 1:
        raise ValueError(f"{quoted(text)} mixes '>' and '<'; write the chain in one direction")
    terms = tuple(_term(part) for part in parts[0::2])
    if sum(t.others for t in terms) > 1:
        raise ValueError(f"{quoted(text)} has more than one '*'")
    if all(t.strategy is None for t in terms):
        raise ValueError(f"{quoted(text)} compares numbers only; name a strategy")
    return Chain(terms, descending=operators == {">"})


# ----------------------------------------------------------------------------------------------------------
# The file


def _finite_number(value: Any) -> Any:
    """TOML integers and floats as float; booleans, strings, inf and nan are left for the type check to refuse."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    if isinstance(value, float):
        raise ValueError("must be a finite number")
    return value


FiniteFloat = Annotated[float, BeforeValidator(_finite_number), Field(strict=True)]


def _amount(value: Any) -> Any:
    """A margin or tolerance: a finite number >= 0, or ``K x STRATEGY`` with K >= 0 (kept as its text)."""
    if isinstance(value, str):
        term = _SCALED.fullmatch(value.strip(" "))
        if term is None or not math.isfinite(float(term[1])) or float(term[1]) < 0:
            raise ValueError(f"must be a number >= 0 or 'K x STRATEGY' with K >= 0 (a share of that strategy's mean "
                             f"reward, e.g. '0.1 x honest'), got {quoted(value)}")
        return f"{float(term[1]):g} x {term[2]}"
    value = _finite_number(value)
    if isinstance(value, float) and value < 0:
        raise ValueError("must be >= 0")
    return value


Amount = Annotated[StrictFloat | StrictStr, BeforeValidator(_amount)]


def amount_term(amount: float | str) -> Term:
    """A margin or tolerance as a term: a constant, or ``K x STRATEGY``."""
    return _term(amount) if isinstance(amount, str) else Term(constant=float(amount))


class Expectation(BaseModel):
    """One ``[[expect]]`` entry (see the module docstring)."""

    # Dashed keys only (from-round), as in the recipes' TOML.
    model_config = ConfigDict(extra="forbid", frozen=True, alias_generator=lambda name: name.replace("_", "-"))

    check: StrictStr
    name: StrictStr | None = None
    margin: Amount = 0.0
    tolerance: Amount = 0.0
    over: Over = "mean"
    from_round: StrictInt = Field(1, ge=1)
    seeds: Literal["all"] | Annotated[FiniteFloat, Field(ge=0.0, le=1.0)] = "all"

    @field_validator("check")
    @classmethod
    def _parses(cls, text: str) -> str:
        parse_check(text)
        return text.strip()

    @model_validator(mode="after")
    def _margin_or_tolerance(self) -> Expectation:
        if self.margin and self.tolerance:
            raise ValueError("give a margin or a tolerance, not both")
        return self

    @property
    def title(self) -> str:
        return self.name if self.name is not None else self.check

    @property
    def chain(self) -> Chain | None:
        return parse_check(self.check)

    @property
    def scale_strategy(self) -> str | None:
        """The strategy a relative margin or tolerance (``K x STRATEGY``) is a share of (None: absolute)."""
        return next((t.strategy for t in map(amount_term, (self.margin, self.tolerance)) if t.strategy), None)

    def gap_needed(self, mean_reward: Callable[[str], float] | None = None) -> float:
        """What every link's gap must exceed on a run: the margin, or minus the tolerance; a relative one is its
        share of the magnitude of ``mean_reward(strategy)`` (the run's mean over the rounds read)."""
        value = 0.0
        for amount, sign in ((self.margin, 1.0), (self.tolerance, -1.0)):
            term = amount_term(amount)
            if term.strategy is not None:
                if mean_reward is None:
                    raise ValueError(f"{quoted(amount)} is relative to a run's {term.strategy} reward")
                value += sign * term.scale * abs(mean_reward(term.strategy))
            else:
                value += sign * term.constant
        return value

    def margin_text(self) -> str:
        """The margin as the table shows it: ``+0.03``, ``-0.002`` (a tolerance), ``0.15 x honest``, ``-0.01 x honest``."""
        for amount, sign in ((self.margin, ""), (self.tolerance, "-")):
            if isinstance(amount, str):
                return sign + amount
        return f"{self.gap_needed():+g}"

    def describe(self) -> str:
        """The check with its scope, e.g. ``honest > * (mean over rounds)``."""
        rounds = "mean over rounds" if self.over == "mean" else "every round"
        if self.from_round > 1:
            rounds += f" from round {self.from_round}"
        seeds = "" if self.seeds == "all" else f"; {self.seeds:g}-quantile over seeds"
        return f"{self.check} ({rounds}{seeds})"


class ExpectationSet(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    expect: list[Expectation] = Field(min_length=1)
    name: StrictStr = "expectations"

    @model_validator(mode="after")
    def _unique_titles(self) -> ExpectationSet:
        seen: set[str] = set()
        for e in self.expect:
            if e.title in seen:
                raise ValueError(f"two expectations are named {quoted(e.title)}; names must be unique")
            seen.add(e.title)
        return self


def expectation_keys() -> list[str]:
    return [info.alias or name for name, info in Expectation.model_fields.items()]


def _error(source: str, exc: ValidationError) -> ExpectationError:
    """The first problem, with the entry (number and name) and the key."""
    errors = exc.errors(include_url=False)
    # A misspelt key first: it also explains the "required" error of the key it was meant to be.
    err = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])
    loc = [str(part) for part in err["loc"]]
    where = source
    if len(loc) >= 2 and loc[0] == "expect" and loc[1].isdigit():
        where += f": [[expect]] #{int(loc[1]) + 1}"
        loc = loc[2:]
    key = loc[0] if loc else ""  # the keys are flat; what follows names a member of a union
    message = err["msg"].removeprefix("Value error, ")
    if key == "seeds":
        message = "must be 'all' or a quantile over the seeds, a number in [0, 1]"
    if err["type"] == "extra_forbidden":
        valid = expectation_keys() if where != source else ["expect", "name"]
        close = difflib.get_close_matches(key, valid, n=3, cutoff=0.6)
        hint = f"; did you mean {', '.join(close)}?" if close else f"; valid keys: {', '.join(valid)}"
        return ExpectationError(f"{where}: unknown key {quoted(key)}{hint}")
    if err["type"] == "missing":
        return ExpectationError(f"{where}: key {key!r} is required")
    if not key:
        return ExpectationError(f"{where}: {message}")
    return ExpectationError(f"{where}: key {quoted(key)}: {message}, got {quoted(err['input'])}")


def expectations_from_dict(table: dict[str, Any], *, source: str = "expectations") -> ExpectationSet:
    try:
        return ExpectationSet.model_validate(table)
    except ValidationError as exc:
        raise _error(source, exc) from None


def shipped_expectations_dir() -> Path:
    # Installed with the recipes (the data package kfca_llm.recipes), so it works outside a checkout too.
    return Path(str(files("kfca_llm.recipes"))) / "expectations"


def resolve_expectations_path(name: str | Path | None) -> Path:
    """An expectations file, or the name of a shipped one (None: ``paper-llm``, the paper's LLM ordering)."""
    shipped = shipped_expectations_dir()
    if name is None:
        return shipped / f"{DEFAULT_EXPECTATIONS}.toml"
    path = Path(name)
    if path.is_file():
        return path
    if (shipped / f"{name}.toml").is_file():
        return shipped / f"{name}.toml"
    known = sorted(p.stem for p in shipped.glob("*.toml"))
    raise ExpectationError(f"no expectations file {str(name)!r} (shipped: {', '.join(known) or 'none'})")


def load_expectations(name: str | Path | None = None) -> ExpectationSet:
    """Read and validate an expectations file (a path or a shipped name; None: the paper's LLM ordering)."""
    path = resolve_expectations_path(name)
    try:
        table = tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ExpectationError(f"{path}: not valid TOML: {exc}") from None
    table.setdefault("name", path.stem)
    return expectations_from_dict(table, source=str(path))
