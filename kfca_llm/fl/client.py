"""Local training of one client in one round: global adapter in, ``local - global`` update out.

Every training key of the recipe acts here, read from the ``TrainingPlan`` the caller resolved from the recipe once
(``fl.training_plan``), with Hugging Face ``Trainer`` semantics: ``optim`` picks the optimizer, ``lr-scheduler-type``
(with ``warmup-steps`` / ``warmup-ratio``) shapes the learning rate over the round's optimizer steps starting from the
round's FlowerTune cosine value, each micro-batch loss is divided by ``gradient-accumulation-steps``, and gradients
are clipped to ``max-grad-norm`` (0: off). Data order, dropout and LoRA noise are seeded from the client's seed alone
(``plan.client_seed``, ``fl.seeds.train_seed``: by the round only with ``train.dynamic-data-seed``), so the update
does not depend on which process trains the client or what it trained before.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ..engine.layout import FlatUpdate, Layout
from ..errors import InputError
from ..tensors import StateDict
from .seeds import derive_seed
from .training_plan import TrainingPlan


@dataclass(frozen=True)
class ClientUpdate:
    """What one client returns after a round of local training."""

    update: Mapping[str, torch.Tensor]
    """``local adapter - global adapter`` (float32, CPU), sorted tensor names: a ``FlatUpdate`` (one padded flat
    buffer, which the scoring engine packs in one pass; a read-only mapping of views)."""
    num_examples: int
    loss_before: float
    """Loss on the probe batch (the first optimizer step's examples), eval mode, before training."""
    loss_after: float


def make_optimizer(params: list[torch.nn.Parameter], lr: float, optim: str) -> torch.optim.Optimizer:
    """The optimizer a Hugging Face ``optim`` name stands for (weight decay 0, Trainer's default)."""
    if optim == "adamw_torch":
        return torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    if optim == "sgd":
        return torch.optim.SGD(params, lr=lr)
    import bitsandbytes as bnb  # runs on CUDA and (slowly) on the CPU

    if optim == "adamw_bnb_8bit":
        return bnb.optim.AdamW8bit(params, lr=lr, weight_decay=0.0)
    if optim == "paged_adamw_8bit":
        return bnb.optim.PagedAdamW8bit(params, lr=lr, weight_decay=0.0)
    if optim == "paged_adamw_32bit":
        return bnb.optim.PagedAdamW(params, lr=lr, weight_decay=0.0)
    raise InputError(f"unknown optimizer {optim!r}")  # the recipe validates it first


def make_scheduler(optimizer: torch.optim.Optimizer, plan: TrainingPlan, steps: int):
    from transformers import get_scheduler

    return get_scheduler(plan.lr_scheduler_type, optimizer, num_warmup_steps=plan.warmup(steps),
                         num_training_steps=steps)


def example_order(num_examples: int, count: int, g: torch.Generator) -> list[int]:
    """``count`` example indices: seeded reshuffled epochs, concatenated (each epoch sees every example)."""
    order: list[int] = []
    while len(order) < count:
        order.extend(torch.randperm(num_examples, generator=g).tolist())
    return order[:count]


def batch_loss(model, batch: Sequence[Mapping[str, Any]], pad_token_id: int, device: torch.device) -> torch.Tensor:
    from ..data import collate

    tensors = {k: v.to(device) for k, v in collate(batch, pad_token_id).items()}
    return model(**tensors).loss


def _probe_loss(model, batch, pad_token_id: int, device: torch.device) -> float:
    was_training = model.training
    model.eval()
    with torch.no_grad():
        loss = float(batch_loss(model, batch, pad_token_id, device))
    model.train(was_training)
    return loss


def adapter_state(model) -> StateDict:
    """The adapter's trainable state (float32 copies on the CPU, sorted names)."""
    from peft import get_peft_model_state_dict

    state = get_peft_model_state_dict(model)
    # Sorted names: the same order as a safetensors file read back on resume.
    return {k: state[k].detach().to("cpu", torch.float32).clone() for k in sorted(state)}


def load_adapter_state(model, state: Mapping[str, torch.Tensor]) -> None:
    from peft import set_peft_model_state_dict

    result = set_peft_model_state_dict(model, dict(state))
    unexpected = getattr(result, "unexpected_keys", None)
    if unexpected:
        raise InputError(f"adapter state has tensors the model lacks: {unexpected[:5]}")


def reproducible_on_cuda() -> None:
    """The same seed trains the same update on a GPU as well (a resumed run continues bit for bit, as on the CPU):
    torch's deterministic kernels where an op has one, and the fixed cuBLAS workspace they need, which torch reads
    at each call. Without it an H100 resumed the tiny recipe to other rewards; with it an H200 reproduced them bit
    for bit. An op with no deterministic kernel warns (``warn_only``) rather than stopping a long run."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True, warn_only=True)


def train_client(model, global_state: Mapping[str, torch.Tensor], examples: Sequence[Mapping[str, Any]],
                 plan: TrainingPlan, *, server_round: int, seed: int, device: torch.device, pad_token_id: int,
                 step_callback: Callable[[], None] | None = None) -> ClientUpdate:
    """Train one client for round ``server_round`` (1-based) from the global adapter.

    ``seed`` (``plan.client_seed``) seeds the data order and the dropout of this client in this round."""
    if not examples:
        raise InputError("a client has no training examples")
    if torch.device(device).type == "cuda":
        reproducible_on_cuda()
    load_adapter_state(model, global_state)
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(derive_seed(seed, 0))  # dropout: the same for this client on any process
    steps = plan.local_steps(len(examples))
    micro, accumulation = plan.per_device_train_batch_size, plan.gradient_accumulation_steps
    per_step = plan.examples_per_step
    order = example_order(len(examples), steps * per_step, g)
    probe = [examples[i] for i in order[:per_step]]
    loss_before = _probe_loss(model, probe, pad_token_id, device)

    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = make_optimizer(params, plan.lr(server_round), plan.optim)
    scheduler = make_scheduler(optimizer, plan, steps)
    model.train()
    for step in range(steps):
        chunk = order[step * per_step:(step + 1) * per_step]
        optimizer.zero_grad(set_to_none=True)
        for start in range(0, per_step, micro):
            batch = [examples[i] for i in chunk[start:start + micro]]
            (batch_loss(model, batch, pad_token_id, device) / accumulation).backward()
        if plan.max_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(params, plan.max_grad_norm)
        optimizer.step()
        scheduler.step()
        if step_callback is not None:
            step_callback()
    loss_after = _probe_loss(model, probe, pad_token_id, device)
    local = adapter_state(model)
    # The update lives in one padded flat buffer (the scoring engine packs it with no per-tensor work).
    layout = Layout.from_shapes({k: tuple(v.shape) for k, v in global_state.items()})
    update = FlatUpdate(layout, layout.flat_buffer(torch.result_type(*_first_pair(local, global_state))))
    for k in global_state:
        torch.sub(local[k], global_state[k], out=update[k])
    return ClientUpdate(update, len(examples), loss_before, loss_after)


def train_reference(model, global_state: Mapping[str, torch.Tensor], examples: Sequence[Mapping[str, Any]],
                    plan: TrainingPlan, *, server_round: int, device: torch.device, pad_token_id: int) -> StateDict:
    """The server's trusted reference update of round ``server_round`` (``kfca.reference-rows``, ``fl.reference``):
    a client's training (``train_client``) from the round's global adapter on the server's held-out ``examples``,
    seeded by the run's seed and the round alone (``plan.reference_seed``: ``kfca-llm simulate`` and the Flower app
    train the same one)."""
    return train_client(model, global_state, examples, plan, server_round=server_round,
                        seed=plan.reference_seed(server_round), device=device, pad_token_id=pad_token_id).update


def _first_pair(local: Mapping[str, torch.Tensor], global_state: Mapping[str, torch.Tensor]):
    name = next(iter(global_state))
    return local[name], global_state[name]
