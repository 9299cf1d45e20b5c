"""Dry run: validate a recipe without a GPU and without model weights.

The base model is built from its config on the meta device (``accelerate.init_empty_weights``: shapes only,
no memory), the recipe's LoRA/DoRA adapter is attached with peft, and the adapter's parameters are counted.
Communication per round follows: each sampled client downloads the global adapter and uploads its update,
either as dense floats (fp32/bf16) or as packed sign bits in the canonical layout that KFCA scores.

Run: ``python -m kfca_llm.plan recipes/finance.toml --model-dir /path/to/local/config`` (or a model id that
is in the Hugging Face cache).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import synthetic
from .hub import hub_offline, hub_reachable
from .data import COLUMNS, IGNORE_INDEX, encode_example, format_example
from .engine.layout import Layout
from .fl.training_plan import TrainingPlan
from .modeling import build_byte_tokenizer, is_tiny, lora_config, tiny_config
from .recipe import Recipe, RecipeError, clients_per_round, load_recipe, lr_for_round


@dataclass(frozen=True)
class SampleRow:
    prompt: str
    response: str
    prompt_tokens: int | None  # None when no tokenizer is available offline
    response_tokens: int | None


@dataclass(frozen=True)
class Plan:
    recipe: Recipe
    architecture: str  # the config's model_type
    base_params: int  # base model parameters (adapter excluded)
    adapter_params: int
    adapter_shapes: dict[str, tuple[int, ...]]  # peft state-dict names (what clients send)
    adapted_modules: int  # linear layers that carry an adapter
    clients_per_round: int
    local_steps: int | None  # optimizer steps per client per round; None = bound by epochs and data size
    examples_per_step: int
    sign_bytes_per_update: int  # packed sign bits, every tensor starting on a 32-bit word
    base_weight_bytes: int  # estimate: quantized linears at their bit width, the rest in bf16
    adapter_train_bytes: int  # adapter weights + gradients in fp32 and the optimizer state
    rows_source: str
    samples: tuple[SampleRow, ...]
    notes: tuple[str, ...]

    @property
    def fp32_bytes_per_update(self) -> int:
        return 4 * self.adapter_params

    @property
    def bf16_bytes_per_update(self) -> int:
        return 2 * self.adapter_params

    def upload_bytes_per_round(self, encoding: str) -> int:
        per_update = {"fp32": self.fp32_bytes_per_update, "bf16": self.bf16_bytes_per_update,
                      "sign": self.sign_bytes_per_update}[encoding]
        return self.clients_per_round * per_update

    def download_bytes_per_round(self, encoding: str) -> int:
        """The global adapter sent to each sampled client (dense floats; signs alone cannot rebuild it)."""
        per_update = {"fp32": self.fp32_bytes_per_update, "bf16": self.bf16_bytes_per_update}[encoding]
        return self.clients_per_round * per_update

    def describe(self) -> str:
        r = self.recipe
        lora = r.model.lora
        ta = r.train.training_arguments
        kind = "LoRA + DoRA" if lora.peft_use_dora else "LoRA"
        steps = str(self.local_steps) if self.local_steps is not None else f"{ta.num_train_epochs} epoch(s) of the local data"
        T = r.num_server_rounds
        lines = [
            f"recipe {r.name!r} ({r.domain}): {r.model.name} [{self.architecture}], "
            f"{'full precision' if r.model.quantization is None else f'{r.model.quantization}-bit base'}",
            f"adapter: {kind} r={lora.peft_lora_r} alpha={lora.peft_lora_alpha} dropout={lora.peft_lora_dropout} "
            f"on {', '.join(lora.target_modules)} -> {self.adapted_modules} modules, "
            f"{self.adapter_params:,} trainable parameters ({self.adapter_params / max(self.base_params, 1):.4%} "
            f"of {self.base_params:,}) in {len(self.adapter_shapes)} tensors",
            f"federation: {T} rounds, {r.num_clients} clients, {self.clients_per_round} per round "
            f"(fraction-train {r.strategy.fraction_train}), data {r.dataset.name}",
            f"local training: {steps} optimizer steps x {self.examples_per_step} examples "
            f"(batch {ta.per_device_train_batch_size} x accumulation {ta.gradient_accumulation_steps}), "
            f"seq-length {r.train.seq_length}, optimizer {ta.optim}, "
            f"lr {lr_for_round(r, 1):.3g} (round 1) -> {lr_for_round(r, T):.3g} (round {T})",
            "communication per round (upload = sampled clients' updates, download = global adapter to them):",
        ]
        for enc in ("fp32", "bf16", "sign"):
            per = {"fp32": self.fp32_bytes_per_update, "bf16": self.bf16_bytes_per_update,
                   "sign": self.sign_bytes_per_update}[enc]
            lines.append(f"  {enc:>4} update {_size(per)}, upload {_size(self.upload_bytes_per_round(enc))}/round, "
                         f"{_size(T * self.upload_bytes_per_round(enc))} over {T} rounds")
        lines.append(f"  download (bf16) {_size(self.download_bytes_per_round('bf16'))}/round; "
                     f"upload+download bf16 over {T} rounds: "
                     f"{_size(T * (self.upload_bytes_per_round('bf16') + self.download_bytes_per_round('bf16')))}")
        lines.append(f"memory (estimate): base weights {_size(self.base_weight_bytes)}, adapter training state "
                     f"{_size(self.adapter_train_bytes)}, plus activations (batch x seq-length)")
        guarded = (f" (weak verdicts {r.kfca.weak_verdict})"
                   if r.kfca.aggregate in ("exclude-negative", "reward-weighted") else "")
        lines.append(f"kfca: peers {r.kfca.peers if r.kfca.peers is not None else 'all'}, penalty {r.kfca.penalty}, "
                     f"bonus-fraction {r.kfca.bonus_fraction}, seed {r.kfca.seed}, aggregate {r.kfca.aggregate}"
                     f"{guarded}, attacks {', '.join(r.kfca.attacks)}")
        lines.append(f"prompt format {r.train.prompt_format}; rows: {self.rows_source}")
        for i, s in enumerate(self.samples):
            counts = (f" ({s.prompt_tokens} prompt tokens masked, {s.response_tokens} response tokens trained)"
                      if s.prompt_tokens is not None else "")
            lines.append(f"--- row {i}{counts}\n{s.prompt}{s.response}")
        lines.extend(f"note: {n}" for n in self.notes)
        return "\n".join(lines)


def _size(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n} B"


def _base_weight_bytes(base: Any, base_params: int, quantization: int | None) -> int:
    """bitsandbytes quantizes every nn.Linear except the output head; 4-bit nf4 stores one fp32 scale per
    64 weights (4.5 bits each), 8-bit about one byte each. Everything else stays bf16."""
    import torch

    if quantization is None:
        return 2 * base_params
    head = base.get_output_embeddings()
    linear = sum(m.weight.numel() for m in base.modules() if isinstance(m, torch.nn.Linear) and m is not head)
    bits = 4.5 if quantization == 4 else 8
    return int(linear * bits / 8) + 2 * (base_params - linear)


def _check_model_dir(model_dir: str | Path) -> Path:
    path = Path(model_dir)
    if not path.is_dir():
        raise RecipeError(f"--model-dir {path} is not a directory (it must hold the model's config.json)")
    if not (path / "config.json").is_file():
        raise RecipeError(f"--model-dir {path} holds no config.json; save one with "
                          "transformers.AutoConfig.from_pretrained(<model id>).save_pretrained(<dir>) on a machine "
                          "with network access, or copy the model's snapshot folder")
    return path


def _load_config(recipe: Recipe, model_dir: str | Path | None) -> Any:
    from transformers import AutoConfig

    name = recipe.model.name
    if model_dir is not None:
        source = str(_check_model_dir(model_dir))
    else:
        source = name
    remote = recipe.model.trust_remote_code
    try:  # a local folder or the Hugging Face cache: no network at all
        return AutoConfig.from_pretrained(source, trust_remote_code=remote, local_files_only=True)
    except OSError:
        if model_dir is not None:
            raise RecipeError(f"cannot read the config in --model-dir {source}") from None
    hint = (f"pass --model-dir (a folder holding {name}'s config.json) or fill the Hugging Face cache "
            "on a machine with network access")
    if hub_offline():
        raise RecipeError(f"{name} is not in the Hugging Face cache and HF_HUB_OFFLINE is set: {hint}")
    if not hub_reachable():
        raise RecipeError(f"{name} is not in the Hugging Face cache and the hub cannot be reached: {hint}")
    try:
        return AutoConfig.from_pretrained(source, trust_remote_code=remote)
    except OSError as exc:
        raise RecipeError(f"cannot read the config of model {name!r} ({exc.__class__.__name__}): {hint}") from None


def _try_tokenizer(recipe: Recipe, model_dir: str | Path | None) -> Any | None:
    if model_dir is None and is_tiny(recipe):
        return build_byte_tokenizer()
    from transformers import AutoTokenizer

    try:  # local files only: the config step has already decided whether the hub is usable
        return AutoTokenizer.from_pretrained(str(model_dir) if model_dir is not None else recipe.model.name,
                                             trust_remote_code=recipe.model.trust_remote_code, local_files_only=True)
    except (OSError, ValueError):  # no tokenizer files offline: format rows as text only
        return None


def _sample_rows(recipe: Recipe, data_dir: str | Path | None, n_rows: int) -> tuple[list[dict], str]:
    if data_dir is not None:
        import datasets

        loaded = datasets.load_from_disk(str(data_dir))
        if isinstance(loaded, datasets.DatasetDict):
            loaded = loaded["train"]
        return [dict(loaded[i]) for i in range(min(n_rows, len(loaded)))], f"{data_dir} ({len(loaded):,} rows)"
    rows = synthetic.make_rows(recipe.domain, n_rows, recipe.kfca.seed)
    if recipe.dataset.name == "synthetic":
        return rows, f"synthetic ({recipe.dataset.num_rows:,} rows)"
    return rows, (f"synthetic stand-ins in the {recipe.domain} schema {COLUMNS} "
                  f"({recipe.dataset.name} is not read in a dry run; pass data_dir to format real rows)")


def build_plan(recipe: Recipe, *, model_dir: str | Path | None = None, data_dir: str | Path | None = None,
               n_rows: int = 2) -> Plan:
    """Everything a dry run reports, computed without weights, GPU or network (given local files)."""
    import torch
    from accelerate import init_empty_weights
    from peft import get_peft_model, get_peft_model_state_dict
    from peft.tuners.lora import LoraLayer
    from transformers import AutoModelForCausalLM

    notes = []
    if model_dir is None and is_tiny(recipe):
        tokenizer = _try_tokenizer(recipe, model_dir)
        config = tiny_config(recipe.model.name, len(tokenizer))
    else:
        config = _load_config(recipe, model_dir)  # fails at once offline, before any tokenizer lookup
        tokenizer = _try_tokenizer(recipe, model_dir)
    with init_empty_weights():  # meta device: shapes only
        base = AutoModelForCausalLM.from_config(config, trust_remote_code=recipe.model.trust_remote_code)
    base_params = sum(p.numel() for p in base.parameters())
    base_bytes = _base_weight_bytes(base, base_params, recipe.model.quantization)  # before peft adds linears
    try:
        model = get_peft_model(base, lora_config(recipe))
    except ValueError as exc:  # peft: target modules not found in the architecture
        raise RecipeError(f"model.lora.target-modules {list(recipe.model.lora.target_modules)} do not fit "
                          f"{config.model_type}: {exc}") from None
    adapter_params = sum(p.numel() for p in model.parameters() if p.requires_grad)
    shapes = {k: tuple(v.shape) for k, v in get_peft_model_state_dict(model).items()}
    adapted = sum(1 for m in model.modules() if isinstance(m, LoraLayer))
    # fp32 adapter weights and gradients, plus AdamW's two moments (fp32, or 8-bit for the bitsandbytes ones)
    optim_bytes = 2 if "8bit" in recipe.train.training_arguments.optim else 8
    adapter_train_bytes = adapter_params * (4 + 4 + optim_bytes)
    layout = Layout.from_shapes(shapes)

    ta = recipe.train.training_arguments
    rows, source = _sample_rows(recipe, data_dir, n_rows)
    samples = []
    for row in rows:
        if recipe.train.prompt_format == "chat-template" and (tokenizer is None or not tokenizer.chat_template):
            notes.append("the chat template needs the model's tokenizer, not available offline: rows not formatted")
            break
        prompt, response = format_example(row, recipe.domain, prompt_format=recipe.train.prompt_format,
                                          tokenizer=tokenizer)
        if tokenizer is not None:
            item = encode_example(tokenizer, prompt, response, recipe.train.seq_length)
            masked = sum(1 for label in item["labels"] if label == IGNORE_INDEX)
            samples.append(SampleRow(prompt, response, masked, len(item["labels"]) - masked))
        else:
            samples.append(SampleRow(prompt, response, None, None))
    if tokenizer is None:
        notes.append("no tokenizer available offline: token counts not shown")
    if recipe.model.quantization is not None and not torch.cuda.is_available():
        notes.append(f"this machine has no CUDA: the {recipe.model.quantization}-bit base runs on the CPU "
                     "(bitsandbytes), very slowly for a full-size model")
    return Plan(
        recipe=recipe, architecture=config.model_type, base_params=base_params, adapter_params=adapter_params,
        adapter_shapes=shapes, adapted_modules=adapted, clients_per_round=clients_per_round(recipe),
        local_steps=ta.max_steps if ta.max_steps > 0 else None, examples_per_step=TrainingPlan.of(recipe).examples_per_step,
        sign_bytes_per_update=4 * layout.n_words, base_weight_bytes=base_bytes,
        adapter_train_bytes=adapter_train_bytes, rows_source=source, samples=tuple(samples), notes=tuple(notes))


def dry_run(recipe: Recipe, *, model_dir: str | Path | None = None, data_dir: str | Path | None = None,
            n_rows: int = 2) -> str:
    """Human-readable plan of a recipe (see ``build_plan``)."""
    return build_plan(recipe, model_dir=model_dir, data_dir=data_dir, n_rows=n_rows).describe()


def _add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("recipe", help="recipe TOML file")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a recipe key (FlowerTune dotted name), e.g. --set num-server-rounds=3")
    p.add_argument("--model-dir", help="local directory with the model's config.json (and tokenizer)")
    p.add_argument("--data-dir", help="local copy of the data set (datasets.save_to_disk)")
    p.add_argument("--rows", type=int, default=2, help="sample rows to format")


def _run(args: argparse.Namespace) -> int:
    recipe = load_recipe(args.recipe, args.overrides)
    print(dry_run(recipe, model_dir=args.model_dir, data_dir=args.data_dir, n_rows=args.rows))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m kfca_llm.plan", description=__doc__.split("\n\n")[0])
    _add_arguments(p)
    return _run(p.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
