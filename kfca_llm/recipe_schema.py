"""The recipe's schema: FlowerTune's sections and keys as frozen pydantic models (``kfca_llm.recipe`` reads them
from TOML).

FlowerTune's kebab-case names are the aliases of the snake_case fields; unknown keys, wrong types (no silent
coercion of strings or of 1 to true), out-of-range values and choices outside a list are refused with the key named.

Optional fields (``model.quantization``, ``kfca.peers``, ``dataset.num-rows``) are left out of a file to
mean "none"; an override may say ``none`` explicitly, and ``model.quantization=0`` also means none.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (BaseModel, BeforeValidator, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr,
                      field_validator)

from . import attacks_public  # noqa: F401  registers the free riders: recipes may list them (torch-free)
from .attacks import resolve_attacks
from .fl.pool_settings import POOL_KEYS
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


def _pool_field(name: str) -> Any:
    """The recipe key of ``PoolSettings``' field ``name``: its default and bounds."""
    key = POOL_KEYS[name]
    return Field(key.default, **key.bounds())


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
    # Defaults and bounds: the pool's own (kfca_llm.fl.pool_settings.POOL_KEYS).
    min_peers: StrictInt = _pool_field("min_peers")
    pool_window: StrictInt = _pool_field("window")
    pool_peers: StrictInt = _pool_field("pool_peers")
    pool_weight: StrictFloat = _pool_field("weight")
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
