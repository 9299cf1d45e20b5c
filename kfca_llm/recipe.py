"""FlowerTune-style recipes: typed, frozen configs read from TOML with FlowerTune's own key names.

A recipe file uses FlowerTune's dotted keys as TOML tables (``[model]``, ``[model.lora]``, ``[train]``,
``[train.training-arguments]``, ``[strategy]``, ``[dataset]``) plus ``[kfca]`` for the reward mechanism and
two top-level keys: ``num-server-rounds`` and ``num-clients`` (the number of IID partitions / simulated
clients; FlowerTune keeps it outside the app config as the federation option ``options.num-supernodes``,
a recipe keeps everything in one file). The keys, their types and ranges are ``kfca_llm.recipe_schema``'s (its
names are re-exported here); this module reads a file, applies overrides, checks the rules that tie several keys
together, and gives the round schedule.
"""

from __future__ import annotations

import difflib
import math
import tomllib
from collections.abc import Mapping, Sequence
from importlib.resources import files
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from .attacks import resolve_attack
from .errors import InputError
from .recipe_schema import (AGGREGATES, DOMAINS, LR_SCHEDULERS, OPTIMIZERS, PROMPT_FORMATS,  # noqa: F401
                            SYNTHETIC_DATASET, Aggregate, DatasetConfig, Domain, Duplicates, KfcaConfig,
                            LoraConfigSpec, LrScheduler, ModelConfig, Optimizer, PromptFormat, Recipe,
                            StrategyConfig, TrainConfig, TrainingArguments, WeakVerdict)

DEFAULT_RECIPE = "tiny"


class RecipeError(InputError):
    """A recipe file or override is invalid; the message names the key."""


# ----------------------------------------------------------------------------------------------------------
# TOML -> Recipe


def all_keys(model: type[BaseModel] = Recipe, prefix: str = "") -> list[str]:
    """Every valid dotted key (dashed names) of a recipe, e.g. ``train.training-arguments.max-steps``."""
    keys = []
    for name, info in model.model_fields.items():
        key = prefix + (info.alias or name)
        if isinstance(info.annotation, type) and issubclass(info.annotation, BaseModel):
            keys.extend(all_keys(info.annotation, key + "."))
        else:
            keys.append(key)
    return keys


def close_keys(key: str, n: int = 3) -> list[str]:
    """The valid keys ``key`` most likely means: close as written, else by their last part
    (``max-steps`` -> ``train.training-arguments.max-steps``, ``lora-r`` -> ``model.lora.peft-lora-r``)."""
    keys = all_keys()
    close = difflib.get_close_matches(key, keys, n=n, cutoff=0.6)
    if close:
        return close
    tail = key.rsplit(".", 1)[-1]
    ends = [full for full in keys if full.endswith(("." + tail, "-" + tail))]
    if ends:
        return ends[:n]
    by_tail: dict[str, list[str]] = {}
    for full in keys:
        by_tail.setdefault(full.rsplit(".", 1)[-1], []).append(full)
    return [full for name in difflib.get_close_matches(tail, by_tail, n=n, cutoff=0.75) for full in by_tail[name]][:n]


def _unknown_key(key: str) -> RecipeError:
    close = close_keys(key)
    hint = f"; did you mean {', '.join(close)}?" if close else f"; valid keys: {', '.join(all_keys())}"
    return RecipeError(f"unknown recipe key {key!r}{hint}")


def _recipe_error(exc: ValidationError) -> RecipeError:
    """The first problem, with its dotted FlowerTune key."""
    err = exc.errors(include_url=False)[0]
    key = ".".join(str(part) for part in err["loc"])
    if err["type"] == "extra_forbidden":
        return _unknown_key(key)
    if err["type"] == "missing":
        return RecipeError(f"recipe key {key!r} is required")
    return RecipeError(f"recipe key {key!r}: {err['msg']}, got {err['input']!r}")


def _parse_scalar(text: str) -> Any:
    """A TOML scalar (``5``, ``1e-4``, ``true``, ``"x"``, ``["a", "b"]``); a bare word stays a string."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text.strip()


def _apply_override(table: dict[str, Any], override: str) -> None:
    key, sep, raw = override.partition("=")
    key = key.strip()
    if not sep or not key:
        raise RecipeError(f"override {override!r} must look like key=value")
    _set_key(table, key, _parse_scalar(raw))


def _set_key(table: dict[str, Any], key: str, value: Any) -> None:
    """Set a dotted recipe key (``train.training-arguments.max-steps``) in a nested table."""
    if not isinstance(key, str) or key not in all_keys():
        raise _unknown_key(str(key))
    *parents, leaf = key.split(".")
    node = table
    for p in parents:
        node = node.setdefault(p, {})
    node[leaf] = value


def recipe_from_dict(table: Mapping[str, Any], *, default_name: str = "recipe") -> Recipe:
    """Build and validate a recipe from a nested table with dashed FlowerTune keys."""
    table = dict(table)
    table.setdefault("name", default_name)
    try:
        recipe = Recipe.model_validate(table, by_alias=True)
    except ValidationError as exc:
        raise _recipe_error(exc) from None
    _check_across_keys(recipe)
    return recipe


def resolve_recipe_path(name: str | Path | None) -> Path:
    """A recipe file, or the name of one shipped in ``recipes/`` (``tiny``, ``general-nlp``, ...); None: tiny."""
    # recipes/ is installed as the data package kfca_llm.recipes (pyproject), so this works outside a checkout too.
    shipped_dir = Path(str(files("kfca_llm.recipes")))
    if name is None:
        return shipped_dir / f"{DEFAULT_RECIPE}.toml"
    path = Path(name)
    if path.is_file():
        return path
    shipped = shipped_dir / f"{name}.toml"
    if shipped.is_file():
        return shipped
    known = sorted(p.stem for p in shipped_dir.glob("*.toml"))
    raise InputError(f"no recipe file {str(name)!r} (shipped recipes: {', '.join(known) or 'none'})")


def load_recipe(path: str | Path | None, overrides: Sequence[str] = (), values: Mapping[str, Any] = {}) -> Recipe:
    """Read a recipe (a TOML file or a shipped recipe's name, None: tiny) and apply overrides.

    ``overrides`` are ``key=value`` texts (the value parsed as TOML); ``values`` maps keys to typed values
    (e.g. a Flower run config), applied after them. Both use the dotted FlowerTune key names.
    """
    path = resolve_recipe_path(path)
    with path.open("rb") as fh:
        try:
            table = tomllib.load(fh)
        except tomllib.TOMLDecodeError as exc:
            raise RecipeError(f"{path}: not valid TOML: {exc}") from None
    for override in overrides:
        _apply_override(table, override)
    for key, value in values.items():
        _set_key(table, key, value)
    return recipe_from_dict(table, default_name=path.stem)


def recipe_to_dict(recipe: BaseModel) -> dict[str, Any]:
    """The recipe as a nested dict with FlowerTune's dashed key names (JSON-serialisable)."""
    return recipe.model_dump(mode="json", by_alias=True)


def _check_across_keys(r: Recipe) -> None:
    """Rules that tie several keys together (each field's own type and range is the model's)."""
    def need(ok: bool, key: str, what: str) -> None:
        if not ok:
            raise RecipeError(f"recipe key {key!r} {what}")

    t, ta = r.train, r.train.training_arguments
    need(t.learning_rate_min <= t.learning_rate_max, "train.learning-rate-min",
         "must satisfy 0 <= learning-rate-min <= learning-rate-max")
    need(ta.max_steps > 0 or ta.num_train_epochs >= 1, "train.training-arguments.max-steps",
         "or num-train-epochs must be positive")
    need(ta.lr_scheduler_type != "constant" or (ta.warmup_steps == 0 and ta.warmup_ratio == 0.0),
         "train.training-arguments.lr-scheduler-type",
         "'constant' has no warmup; use 'constant_with_warmup' with warmup-steps or warmup-ratio")
    d = r.dataset
    need(d.num_rows is None or d.num_rows >= r.num_clients, "dataset.num-rows", "must be >= num-clients")
    need(d.name != SYNTHETIC_DATASET or d.num_rows is not None, "dataset.num-rows",
         "is required for the synthetic data set")
    fixed_attackers(r)


def fixed_attackers(recipe: Recipe) -> dict[int, str]:
    """``kfca.attackers`` as client index -> attack spec (validated)."""
    def bad(entry: str, why: str) -> RecipeError:
        return RecipeError(f"recipe key 'kfca.attackers' entry {entry!r} {why}")

    out: dict[int, str] = {}
    for entry in recipe.kfca.attackers:
        index, sep, spec = entry.partition("=")
        if not sep or not index.strip().isdigit():
            raise bad(entry, "is not INDEX=SPEC (e.g. '3=flip')")
        i, spec = int(index), spec.strip()
        if not 0 <= i < recipe.num_clients:
            raise bad(entry, f"names client {i}, outside 0..{recipe.num_clients - 1}")
        if i in out:
            raise bad(entry, f"repeats client {i}")
        if i == 0 and recipe.kfca.attacks:
            raise bad(entry, "uses client 0, the attack-analysis client while kfca.attacks is set")
        try:
            resolve_attack(spec)
        except InputError as exc:
            raise bad(entry, f"has an invalid spec: {exc}") from None
        out[i] = spec
    return out


# ----------------------------------------------------------------------------------------------------------
# Schedule and federation shape


def lr_for_round(recipe: Recipe, t: int) -> float:
    """FlowerTune's cosine learning rate for round ``t`` of ``T`` (t = 1..T), constant inside the round."""
    T = recipe.num_server_rounds
    if not 1 <= t <= T:
        raise ValueError(f"round {t} is outside 1..{T}")
    lo, hi = recipe.train.learning_rate_min, recipe.train.learning_rate_max
    return lo + 0.5 * (hi - lo) * (1.0 + math.cos(math.pi * t / T))


def clients_per_round(recipe: Recipe) -> int:
    """Clients sampled per round: Flower's ``max(int(n * fraction), 2)``, at most n."""
    n = recipe.num_clients
    return min(n, max(int(n * recipe.strategy.fraction_train), 2))
