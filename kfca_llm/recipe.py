"""FlowerTune-style recipes: typed, frozen configs read from TOML with FlowerTune's own key names.

A recipe file uses FlowerTune's dotted keys as TOML tables (``[model]``, ``[model.lora]``, ``[train]``,
``[train.training-arguments]``, ``[strategy]``, ``[dataset]``) plus ``[kfca]`` for the reward mechanism and
two top-level keys: ``num-server-rounds`` and ``num-clients`` (the number of IID partitions / simulated
clients; FlowerTune keeps it outside the app config as the federation option ``options.num-supernodes``,
a recipe keeps everything in one file). Dashes in keys become underscores in the dataclass fields.

Optional fields (``model.quantization``, ``kfca.peers``, ``dataset.num-rows``) are left out of a file to
mean "none"; an override may say ``none`` explicitly, and ``model.quantization=0`` also means none.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import sys
import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .attacks import resolve_attack, resolve_attacks
from .errors import InputError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised only on Python 3.10
    import tomli as tomllib

DOMAINS = ("general-nlp", "finance", "medical", "code")
PROMPT_FORMATS = ("alpaca", "chat-template")
PENALTIES = ("expected", "sampled")
# "honest": FedAvg over the honest clients' updates only, so attacks change rewards but not the model
# trajectory (the paper's setting: rewards are measured against the same honest run);
# "all": FedAvg over every submitted update, attacks included (what an unguarded server would do).
AGGREGATES = ("honest", "all")
# Hugging Face names (TrainingArguments.lr_scheduler_type / optim) that the local training loop implements.
LR_SCHEDULERS = ("constant", "constant_with_warmup", "linear", "cosine")
OPTIMIZERS = ("adamw_torch", "sgd", "adamw_bnb_8bit", "paged_adamw_8bit", "paged_adamw_32bit")
SYNTHETIC_DATASET = "synthetic"


class RecipeError(InputError):
    """A recipe file or override is invalid; the message names the key."""


@dataclass(frozen=True, kw_only=True)
class LoraConfigSpec:
    peft_lora_r: int = 8
    peft_lora_alpha: int = 16
    peft_lora_dropout: float = 0.075
    peft_use_dora: bool = False
    target_modules: tuple[str, ...] = ("q_proj", "v_proj")


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    name: str
    quantization: int | None = None  # 4 or 8 (bitsandbytes); None = full precision
    gradient_checkpointing: bool = False
    # Run the model repository's own Python code (tokenizer/model classes transformers lacks). Off by
    # default: it executes code from the hub; all four winners' architectures are native in transformers 5.
    trust_remote_code: bool = False
    lora: LoraConfigSpec = field(default_factory=LoraConfigSpec)


@dataclass(frozen=True, kw_only=True)
class TrainingArguments:
    per_device_train_batch_size: int = 4
    gradient_accumulation_steps: int = 1
    num_train_epochs: int = 3
    max_steps: int = 10  # optimizer steps per round; > 0 caps the epochs (Hugging Face semantics)
    # Inside a round, from the round's cosine learning rate (FlowerTune: constant inside a round).
    lr_scheduler_type: str = "constant"
    warmup_steps: int = 0  # > 0 wins over warmup-ratio (Hugging Face)
    warmup_ratio: float = 0.0
    max_grad_norm: float = 1.0  # Hugging Face's default; 0 turns clipping off
    optim: str = "adamw_torch"  # Hugging Face optimizer name; the winners used "paged_adamw_8bit"


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    learning_rate_max: float = 5e-5
    learning_rate_min: float = 1e-6
    seq_length: int = 512
    save_every_round: int = 5
    # Also save each client's submitted adapter per round beside the round's starting global adapter.
    save_client_updates: bool = False
    prompt_format: str = "alpaca"  # "alpaca" or "chat-template" (the tokenizer's chat template)
    training_arguments: TrainingArguments = field(default_factory=TrainingArguments)


@dataclass(frozen=True, kw_only=True)
class StrategyConfig:
    fraction_train: float = 0.1


@dataclass(frozen=True, kw_only=True)
class DatasetConfig:
    name: str  # a Hugging Face id, or "synthetic"
    num_rows: int | None = None  # synthetic: rows to generate; real: None = all rows, else a seeded subsample


@dataclass(frozen=True, kw_only=True)
class KfcaConfig:
    peers: int | None = None  # peers scored per client; None = every other client of the round
    bonus_fraction: float = 0.5
    penalty: str = "expected"
    seed: int = 0
    attacks: tuple[str, ...] = ("honest",)
    # Clients that attack whenever they are sampled, as "INDEX=SPEC" (e.g. "3=flip"): what they submit
    # replaces their honest update for scoring (and for FedAvg with aggregate = "all").
    attackers: tuple[str, ...] = ()
    aggregate: str = "honest"


@dataclass(frozen=True, kw_only=True)
class Recipe:
    name: str
    domain: str
    model: ModelConfig
    train: TrainConfig = field(default_factory=TrainConfig)
    strategy: StrategyConfig = field(default_factory=StrategyConfig)
    num_server_rounds: int
    num_clients: int
    dataset: DatasetConfig
    kfca: KfcaConfig = field(default_factory=KfcaConfig)


# ----------------------------------------------------------------------------------------------------------
# TOML <-> dataclasses


def _dashed(name: str) -> str:
    return name.replace("_", "-")


def _is_dataclass_type(tp: Any) -> bool:
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


def _optional_inner(tp: Any) -> Any | None:
    """The T of ``T | None``, or None when the annotation is not optional."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1 and len(typing.get_args(tp)) == 2:
            return args[0]
    return None


def all_keys(cls: type = Recipe, prefix: str = "") -> list[str]:
    """Every valid dotted key (dashed names) of a recipe, e.g. ``train.training-arguments.max-steps``."""
    keys = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        key = prefix + _dashed(f.name)
        if _is_dataclass_type(hints[f.name]):
            keys.extend(all_keys(hints[f.name], key + "."))
        else:
            keys.append(key)
    return keys


def _unknown_key(key: str) -> RecipeError:
    close = difflib.get_close_matches(key, all_keys(), n=3, cutoff=0.6)
    hint = f"; did you mean {', '.join(close)}?" if close else f"; valid keys: {', '.join(all_keys())}"
    return RecipeError(f"unknown recipe key {key!r}{hint}")


def _coerce(key: str, tp: Any, value: Any) -> Any:
    inner = _optional_inner(tp)
    if inner is not None:
        if value is None or (isinstance(value, str) and value.lower() == "none"):
            return None
        if key == "model.quantization" and value == 0:
            return None
        return _coerce(key, inner, value)
    if tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    elif tp is str:
        if isinstance(value, str):
            return value
    elif typing.get_origin(tp) is tuple:
        if isinstance(value, str):
            value = [value]
        if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
            return tuple(value)
    else:  # pragma: no cover - a field type this loader does not know is a programming error
        raise TypeError(f"unsupported recipe field type {tp!r} for {key}")
    want = getattr(tp, "__name__", str(tp))
    raise RecipeError(f"recipe key {key!r} must be {want}, got {value!r}")


def _build(cls: type, table: Mapping[str, Any], prefix: str) -> Any:
    hints = typing.get_type_hints(cls)
    by_key = {_dashed(f.name): f for f in dataclasses.fields(cls)}
    for k in table:
        if k not in by_key:
            raise _unknown_key(prefix + k)
    kwargs = {}
    for k, f in by_key.items():
        key = prefix + k
        tp = hints[f.name]
        if _is_dataclass_type(tp):
            sub = table.get(k, {})
            if not isinstance(sub, Mapping):
                raise RecipeError(f"recipe key {key!r} must be a table")
            kwargs[f.name] = _build(tp, sub, key + ".")
        elif k in table:
            kwargs[f.name] = _coerce(key, tp, table[k])
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise RecipeError(f"recipe key {key!r} is required")
    return cls(**kwargs)


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
    valid = all_keys()
    if key not in valid:
        raise _unknown_key(key)
    *parents, leaf = key.split(".")
    node = table
    for p in parents:
        node = node.setdefault(p, {})
    node[leaf] = _parse_scalar(raw)


def recipe_from_dict(table: Mapping[str, Any], *, default_name: str = "recipe") -> Recipe:
    """Build and validate a recipe from a nested table with dashed FlowerTune keys."""
    table = dict(table)
    table.setdefault("name", default_name)
    recipe = _build(Recipe, table, "")
    _validate(recipe)
    return recipe


def load_recipe(path: str | Path, overrides: Sequence[str] = ()) -> Recipe:
    """Read a recipe TOML file and apply ``key=value`` overrides (dotted FlowerTune key names)."""
    path = Path(path)
    with path.open("rb") as fh:
        try:
            table = tomllib.load(fh)
        except tomllib.TOMLDecodeError as exc:
            raise RecipeError(f"{path}: not valid TOML: {exc}") from None
    for override in overrides:
        _apply_override(table, override)
    return recipe_from_dict(table, default_name=path.stem)


def recipe_to_dict(recipe: Any) -> dict[str, Any]:
    """The recipe as a nested dict with FlowerTune's dashed key names (JSON-serialisable)."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(recipe):
        value = getattr(recipe, f.name)
        if dataclasses.is_dataclass(value):
            value = recipe_to_dict(value)
        elif isinstance(value, tuple):
            value = list(value)
        out[_dashed(f.name)] = value
    return out


def _validate(r: Recipe) -> None:
    def need(ok: bool, key: str, what: str) -> None:
        if not ok:
            raise RecipeError(f"recipe key {key!r} {what}")

    need(r.domain in DOMAINS, "domain", f"must be one of {DOMAINS}, got {r.domain!r}")
    need(r.model.quantization in (None, 4, 8), "model.quantization", "must be 4, 8 or none")
    lora = r.model.lora
    need(lora.peft_lora_r >= 1, "model.lora.peft-lora-r", "must be >= 1")
    need(lora.peft_lora_alpha >= 1, "model.lora.peft-lora-alpha", "must be >= 1")
    need(0.0 <= lora.peft_lora_dropout < 1.0, "model.lora.peft-lora-dropout", "must be in [0, 1)")
    need(len(lora.target_modules) > 0, "model.lora.target-modules", "must name at least one module")
    t = r.train
    need(0.0 <= t.learning_rate_min <= t.learning_rate_max, "train.learning-rate-min",
         "must satisfy 0 <= learning-rate-min <= learning-rate-max")
    need(t.seq_length >= 8, "train.seq-length", "must be >= 8")
    need(t.prompt_format in PROMPT_FORMATS, "train.prompt-format", f"must be one of {PROMPT_FORMATS}")
    ta = t.training_arguments
    need(ta.per_device_train_batch_size >= 1, "train.training-arguments.per-device-train-batch-size", "must be >= 1")
    need(ta.gradient_accumulation_steps >= 1, "train.training-arguments.gradient-accumulation-steps", "must be >= 1")
    need(ta.max_steps > 0 or ta.num_train_epochs >= 1, "train.training-arguments.max-steps",
         "or num-train-epochs must be positive")
    need(ta.lr_scheduler_type in LR_SCHEDULERS, "train.training-arguments.lr-scheduler-type",
         f"must be one of {LR_SCHEDULERS}, got {ta.lr_scheduler_type!r}")
    need(ta.optim in OPTIMIZERS, "train.training-arguments.optim", f"must be one of {OPTIMIZERS}, got {ta.optim!r}")
    need(ta.warmup_steps >= 0, "train.training-arguments.warmup-steps", "must be >= 0")
    need(0.0 <= ta.warmup_ratio < 1.0, "train.training-arguments.warmup-ratio", "must be in [0, 1)")
    need(ta.lr_scheduler_type != "constant" or (ta.warmup_steps == 0 and ta.warmup_ratio == 0.0),
         "train.training-arguments.lr-scheduler-type",
         "'constant' has no warmup; use 'constant_with_warmup' with warmup-steps or warmup-ratio")
    need(ta.max_grad_norm >= 0.0, "train.training-arguments.max-grad-norm", "must be >= 0 (0: no clipping)")
    need(0.0 < r.strategy.fraction_train <= 1.0, "strategy.fraction-train", "must be in (0, 1]")
    need(r.num_server_rounds >= 1, "num-server-rounds", "must be >= 1")
    need(r.num_clients >= 2, "num-clients", "must be >= 2 (rewards compare clients with peers)")
    d = r.dataset
    need(d.num_rows is None or d.num_rows >= r.num_clients, "dataset.num-rows", "must be >= num-clients")
    need(d.name != SYNTHETIC_DATASET or d.num_rows is not None, "dataset.num-rows",
         "is required for the synthetic data set")
    k = r.kfca
    need(k.peers is None or 1 <= k.peers, "kfca.peers", "must be >= 1 or none (all peers)")
    need(0.0 < k.bonus_fraction < 1.0, "kfca.bonus-fraction", "must be in (0, 1)")
    need(k.penalty in PENALTIES, "kfca.penalty", f"must be one of {PENALTIES}")
    need(k.aggregate in AGGREGATES, "kfca.aggregate", f"must be one of {AGGREGATES}")
    need(0 <= k.seed < 2**32, "kfca.seed", f"must be an integer in [0, 2**32), got {k.seed}")
    try:  # the attack registry is the one authority, so user-registered attacks are valid here too
        resolve_attacks(k.attacks)
    except InputError as exc:
        need(False, "kfca.attacks", f"is invalid: {exc}")
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


def examples_per_step(recipe: Recipe) -> int:
    ta = recipe.train.training_arguments
    return ta.per_device_train_batch_size * ta.gradient_accumulation_steps
