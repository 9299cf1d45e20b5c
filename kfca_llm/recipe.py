"""FlowerTune-style recipes: typed, frozen configs read from TOML with FlowerTune's own key names.

A recipe file uses FlowerTune's dotted keys as TOML tables (``[model]``, ``[model.lora]``, ``[train]``,
``[train.training-arguments]``, ``[strategy]``, ``[dataset]``) plus ``[kfca]`` for the reward mechanism and
two top-level keys: ``num-server-rounds`` and ``num-clients`` (the number of IID partitions / simulated
clients; FlowerTune keeps it outside the app config as the federation option ``options.num-supernodes``,
a recipe keeps everything in one file). The sections are frozen pydantic models: FlowerTune's kebab-case
names are the aliases of the snake_case fields, unknown keys, wrong types (no silent coercion of strings
or of 1 to true), out-of-range values and choices outside a list are refused with the key named.

Optional fields (``model.quantization``, ``kfca.peers``, ``dataset.num-rows``) are left out of a file to
mean "none"; an override may say ``none`` explicitly, and ``model.quantization=0`` also means none.
"""

from __future__ import annotations

import difflib
import math
import tomllib
from collections.abc import Mapping, Sequence
from importlib.resources import files
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (BaseModel, BeforeValidator, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr,
                      ValidationError, field_validator)

from . import attacks_public  # noqa: F401  registers the free riders: recipes may list them (torch-free)
from .attacks import resolve_attack, resolve_attacks
from .errors import InputError
from .partition import Penalty

Domain = Literal["general-nlp", "finance", "medical", "code"]
PromptFormat = Literal["alpaca", "chat-template"]
DOMAINS: tuple[str, ...] = Domain.__args__
PROMPT_FORMATS: tuple[str, ...] = PromptFormat.__args__
# "honest": FedAvg over the honest clients' updates only, so attacks change rewards but not the model
# trajectory (the paper's setting: rewards are measured against the same honest run);
# "all": FedAvg over every submitted update, attacks included (what an unguarded server would do).
Aggregate = Literal["honest", "all", "exclude-negative", "reward-weighted"]
AGGREGATES: tuple[str, ...] = Aggregate.__args__
# Payment of copies found among a round's submissions (kfca_llm.engine.duplicates): "zero" (paid nothing;
# the detector cannot tell the original from the copy), "split" (a group paid as one client), "flag".
Duplicates = Literal["zero", "split", "flag"]
WeakVerdict = Literal["trust-pool", "exclude-undetermined", "confirm-warm-up", "confirm-always", "round-peers-warm-up"]
# Hugging Face names (TrainingArguments.lr_scheduler_type / optim) that the local training loop implements.
LrScheduler = Literal["constant", "constant_with_warmup", "linear", "cosine"]
Optimizer = Literal["adamw_torch", "sgd", "adamw_bnb_8bit", "paged_adamw_8bit", "paged_adamw_32bit"]
LR_SCHEDULERS: tuple[str, ...] = LrScheduler.__args__
OPTIMIZERS: tuple[str, ...] = Optimizer.__args__
SYNTHETIC_DATASET = "synthetic"
DEFAULT_RECIPE = "tiny"


class RecipeError(InputError):
    """A recipe file or override is invalid; the message names the key."""


def _none_word(value: Any) -> Any:
    return None if isinstance(value, str) and value.strip().lower() == "none" else value


def _one_or_many(value: Any) -> Any:
    return (value,) if isinstance(value, str) else value


PositiveOrNone = Annotated[Annotated[StrictInt, Field(ge=1)] | None, BeforeValidator(_none_word)]
Names = Annotated[tuple[StrictStr, ...], BeforeValidator(_one_or_many)]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True,
                              alias_generator=lambda name: name.replace("_", "-"))


class LoraConfigSpec(_Section):
    peft_lora_r: StrictInt = Field(8, ge=1)
    peft_lora_alpha: StrictInt = Field(16, ge=1)
    peft_lora_dropout: StrictFloat = Field(0.075, ge=0.0, lt=1.0)
    peft_use_dora: StrictBool = False
    target_modules: Names = Field(("q_proj", "v_proj"), min_length=1)


class ModelConfig(_Section):
    name: StrictStr
    # 4 or 8 (bitsandbytes); None = full precision (0 and "none" also mean none)
    quantization: Annotated[Literal[4, 8] | None, BeforeValidator(lambda v: None if v == 0 else _none_word(v))] = None
    gradient_checkpointing: StrictBool = False
    # Run the model repository's own Python code (tokenizer/model classes transformers lacks). Off by
    # default: it executes code from the hub; all four winners' architectures are native in transformers 5.
    trust_remote_code: StrictBool = False
    lora: LoraConfigSpec = LoraConfigSpec()


class TrainingArguments(_Section):
    per_device_train_batch_size: StrictInt = Field(4, ge=1)
    gradient_accumulation_steps: StrictInt = Field(1, ge=1)
    num_train_epochs: StrictInt = Field(3, ge=0)
    max_steps: StrictInt = 10  # optimizer steps per round; > 0 caps the epochs (Hugging Face semantics)
    # Inside a round, from the round's cosine learning rate (FlowerTune: constant inside a round).
    lr_scheduler_type: LrScheduler = "constant"
    warmup_steps: StrictInt = Field(0, ge=0)  # > 0 wins over warmup-ratio (Hugging Face)
    warmup_ratio: StrictFloat = Field(0.0, ge=0.0, lt=1.0)
    max_grad_norm: StrictFloat = Field(1.0, ge=0.0)  # Hugging Face's default; 0 turns clipping off
    optim: Optimizer = "adamw_torch"  # the winners used "paged_adamw_8bit"


class TrainConfig(_Section):
    learning_rate_max: StrictFloat = Field(5e-5, ge=0.0)
    learning_rate_min: StrictFloat = Field(1e-6, ge=0.0)
    seq_length: StrictInt = Field(512, ge=8)
    save_every_round: StrictInt = 5
    # Also save each client's submitted adapter per round beside the round's starting global adapter.
    save_client_updates: StrictBool = False
    prompt_format: PromptFormat = "alpaca"  # "chat-template": the tokenizer's chat template
    # torch's intra-op threads while the federation runs; 0: one for the built-in tiny models (a 0.36M-parameter
    # model gains nothing from more, and on busy cores the threads spin waiting for each other), torch's own
    # default (a thread per core) otherwise, or whatever OMP_NUM_THREADS says where it is set.
    torch_threads: StrictInt = Field(0, ge=0)
    # FlowerTune's default (all four apps): false, each participation of a client trains on the same samples in the
    # same order; true seeds the data order (and LoRA dropout) by the round as well (``fl.seeds.train_seed``).
    dynamic_data_seed: StrictBool = False
    training_arguments: TrainingArguments = TrainingArguments()


class StrategyConfig(_Section):
    fraction_train: StrictFloat = Field(0.1, gt=0.0, le=1.0)


class DatasetConfig(_Section):
    name: StrictStr  # a Hugging Face id, or "synthetic"
    num_rows: PositiveOrNone = None  # synthetic: rows to generate; real: None = all rows, else a seeded subsample
    # Rows no client trains on that evaluate the global adapter each round (kfca_llm.data): synthetic, the
    # generator's next rows; real, a seeded choice set aside before the clients' rows are drawn. 0: no evaluation.
    heldout_rows: StrictInt = Field(64, ge=0)


class KfcaConfig(_Section):
    peers: PositiveOrNone = None  # peers scored per client; None = every other client
    bonus_fraction: StrictFloat = Field(0.5, gt=0.0, lt=1.0)
    penalty: Penalty = "expected"
    seed: StrictInt = Field(0, ge=0, lt=2**32)
    attacks: Names = ("honest",)
    # Clients that attack whenever they are sampled, as "INDEX=SPEC" (e.g. "3=flip"): what they submit
    # replaces their honest update for scoring (and for FedAvg with aggregate = "all").
    attackers: Names = ()
    # "honest": FedAvg over the honest clients' updates only, so attacks change rewards but not the model
    # trajectory (the paper's setting); "all": over every submitted update (an unguarded server);
    # "exclude-negative" / "reward-weighted": KFCAStrategy's rules (kfca_llm.fl.aggregate).
    aggregate: Aggregate = "honest"
    # What exclude-negative / reward-weighted do with a reply paid against the peer pool while the pool's verdict
    # is weak (kfca_llm.fl.aggregate.WEAK_VERDICT_RULES; KFCAStrategy(weak_verdict=...) reads the same key).
    weak_verdict: WeakVerdict = "confirm-warm-up"
    # Copies among the round's real submissions (never the attack analysis' side-by-side ones).
    duplicates: Duplicates = "zero"
    # Peers beyond the round (kfca_llm.fl.peer_pool): a client with fewer than min-peers in-round peers is also
    # scored against pool-peers other clients' submissions of the last pool-window rounds; the pool's verdict as a
    # whole weighs pool-weight against an in-round peer's 1 (which is read the way the pool's verdict says).
    min_peers: StrictInt = Field(2, ge=0)
    pool_window: StrictInt = Field(10, ge=1)
    pool_peers: StrictInt = Field(8, ge=0)
    pool_weight: StrictFloat = Field(0.5, gt=0.0)
    # A trusted reference (kfca_llm.fl.reference): the server trains on reference-rows held-out rows each round
    # from the global adapter; that update is a peer of every client with weight reference-weight (0 rows: off).
    reference_rows: StrictInt = Field(0, ge=0)
    reference_weight: StrictFloat = Field(4.0, ge=0.0)
    # Pay only for agreement the public trajectory does not predict (kfca_llm.engine.public): the penalty is drawn
    # within strata of public-steps sign planes (the global adapter's change over the last 1, 2, 4, ... rounds) and
    # public-buckets quantile buckets of the newest step's magnitude. 0 steps: off (the paper's rewards).
    public_steps: StrictInt = Field(5, ge=0, le=5)
    public_buckets: StrictInt = Field(2, ge=1, le=16)

    @field_validator("public_buckets")
    @classmethod
    def _power_of_two(cls, buckets: int) -> int:
        if buckets & (buckets - 1):
            raise ValueError(f"public-buckets must be a power of two (1, 2, 4, 8, 16), got {buckets}")
        return buckets

    @property
    def conditioning(self):
        """The ``PublicConditioning`` of these keys (``public-steps = 0``: off). Imported here: validating a recipe
        must not import torch (``engine`` does)."""
        from .engine.public import PublicConditioning

        return PublicConditioning(steps=self.public_steps, magnitude_buckets=self.public_buckets)

    @field_validator("attacks")
    @classmethod
    def _registered(cls, specs: tuple[str, ...]) -> tuple[str, ...]:
        resolve_attacks(specs)  # the registry is the one authority: user-registered attacks are valid too
        return specs


class Recipe(_Section):
    name: StrictStr
    domain: Domain
    model: ModelConfig
    train: TrainConfig = TrainConfig()
    strategy: StrategyConfig = StrategyConfig()
    num_server_rounds: StrictInt = Field(ge=1)
    num_clients: StrictInt = Field(ge=2)  # rewards compare clients with peers
    dataset: DatasetConfig
    kfca: KfcaConfig = KfcaConfig()


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


def examples_per_step(recipe: Recipe) -> int:
    """Examples per optimizer step: the micro-batch times the gradient accumulation steps."""
    ta = recipe.train.training_arguments
    return ta.per_device_train_batch_size * ta.gradient_accumulation_steps
