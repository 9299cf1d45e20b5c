"""Local training (kfca_llm.fl.client.train_client) against a plain reference loop written here.

Every example of the client is the same row, so every micro-batch is the same batch whatever the data
order: the reference can take one gradient per step and apply Hugging Face's definitions of the
schedule, the clipping and the accumulation by hand. Dropout is 0 (train mode equals eval mode).
"""

import math

import pytest
import torch
from helpers import TINY

from kfca_llm.data import collate, load_client_datasets
from kfca_llm.engine.layout import FlatUpdate
from kfca_llm.fl.client import adapter_state, load_adapter_state, make_optimizer, train_client
from kfca_llm.fl.training_plan import TrainingPlan
from kfca_llm.modeling import load_model_and_tokenizer
from kfca_llm.recipe import load_recipe

ROUNDS, ROUND = 4, 3
LR_MAX, LR_MIN = 2e-2, 1e-3


def round_lr() -> float:
    # FlowerTune's cosine over rounds, written out: the value round 3 of 4 starts from.
    return LR_MIN + 0.5 * (LR_MAX - LR_MIN) * (1 + math.cos(math.pi * ROUND / ROUNDS))


def hf_factor(kind: str, step: int, steps: int, warmup: int) -> float:
    """Hugging Face's multiplier of the learning rate at optimizer step ``step`` (0-based)."""
    if kind != "constant" and step < warmup:
        return step / max(1, warmup)
    progress = (step - warmup) / max(1, steps - warmup)
    return {"constant": 1.0, "constant_with_warmup": 1.0, "linear": max(0.0, 1.0 - progress),
            "cosine": 0.5 * (1.0 + math.cos(math.pi * progress))}[kind]


def recipe_for(*overrides):
    return load_recipe(TINY, [f"num-server-rounds={ROUNDS}", f"train.learning-rate-max={LR_MAX}",
                              f"train.learning-rate-min={LR_MIN}", "train.training-arguments.per-device-train-batch-size=2",
                              *overrides])


@pytest.fixture(scope="module")
def setup():
    recipe = recipe_for()
    model, tok = load_model_and_tokenizer(recipe)
    row = load_client_datasets(recipe, tok)[0][0]
    # Train lora_B away from zero once, so lora_A gets gradients too.
    global_state = {k: v + 0.01 * torch.randn(v.shape, generator=torch.Generator().manual_seed(3))
                    for k, v in adapter_state(model).items()}
    return model, tok, [row] * 6, global_state


def reference_sgd(model, global_state, batch, *, steps, factors, max_grad_norm):
    load_adapter_state(model, global_state)
    params = [p for p in model.parameters() if p.requires_grad]
    model.train()
    for step in range(steps):
        grads = torch.autograd.grad(model(**batch).loss, params)  # the mean over accumulated micro-batches
        if max_grad_norm > 0:
            norm = torch.sqrt(sum((g.double() ** 2).sum() for g in grads))
            grads = [g * min(1.0, max_grad_norm / (float(norm) + 1e-6)) for g in grads]
        with torch.no_grad():
            for p, g in zip(params, grads):
                p -= round_lr() * factors[step] * g
    local = adapter_state(model)
    return {k: local[k] - global_state[k] for k in global_state}


def run_client(setup, recipe, seed=0):
    model, tok, examples, global_state = setup
    return train_client(model, global_state, examples, TrainingPlan.of(recipe), server_round=ROUND, seed=seed,
                        device=torch.device("cpu"), pad_token_id=tok.pad_token_id).update


@pytest.mark.parametrize("scheduler, warmup, accumulation, max_grad_norm", [
    ("linear", 0, 2, 0.0),                 # schedule, round LR, division by the accumulation steps
    ("cosine", 1, 1, 0.0),                 # warmup then cosine within the round
    ("constant_with_warmup", 2, 2, 0.0),
    ("constant", 0, 1, 0.05),              # clipping active (asserted below)
])
def test_sgd_steps_match_hugging_face_definitions(setup, scheduler, warmup, accumulation, max_grad_norm):
    steps = 4
    recipe = recipe_for("train.training-arguments.optim=sgd", f"train.training-arguments.max-steps={steps}",
                        f"train.training-arguments.lr-scheduler-type={scheduler}",
                        f"train.training-arguments.warmup-steps={warmup}",
                        f"train.training-arguments.gradient-accumulation-steps={accumulation}",
                        f"train.training-arguments.max-grad-norm={max_grad_norm}")
    model, tok, examples, global_state = setup
    got = run_client(setup, recipe)
    batch = collate(examples[:2], tok.pad_token_id)
    factors = [hf_factor(scheduler, k, steps, warmup) for k in range(steps)]
    want = reference_sgd(model, global_state, batch, steps=steps, factors=factors, max_grad_norm=max_grad_norm)
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=2e-4, atol=1e-8, msg=name)
    if max_grad_norm:
        unclipped = reference_sgd(model, global_state, batch, steps=steps, factors=factors, max_grad_norm=0.0)
        assert any(not torch.allclose(unclipped[k], want[k], rtol=1e-2) for k in want)  # clipping did act


def test_adamw_first_step_moves_each_weight_by_the_learning_rate(setup):
    # AdamW's first step (no weight decay) is -lr * g / (|g| + eps): about lr where the gradient is not tiny.
    recipe = recipe_for("train.training-arguments.optim=adamw_torch", "train.training-arguments.max-steps=1",
                        "train.training-arguments.max-grad-norm=0")
    model, tok, examples, global_state = setup
    got = run_client(setup, recipe)
    # The update lives in one padded flat buffer (what the scoring engine packs with no per-tensor work),
    # holding exactly local - global.
    assert isinstance(got, FlatUpdate) and list(got) == sorted(global_state)
    local = adapter_state(model)
    assert all(torch.equal(got[k], local[k] - global_state[k]) for k in global_state)
    load_adapter_state(model, global_state)
    params = dict((n, p) for n, p in model.named_parameters() if p.requires_grad)
    grads = torch.autograd.grad(model(**collate(examples[:2], tok.pad_token_id)).loss, list(params.values()))
    want = torch.cat([(-round_lr() * g / (g.abs() + 1e-8)).flatten() for g in grads])
    flat = torch.cat([got[k].flatten() for k in sorted(got)])
    assert flat.numel() == want.numel()
    torch.testing.assert_close(torch.sort(flat).values, torch.sort(want).values, rtol=1e-3, atol=1e-7)


@pytest.mark.parametrize("name, cls", [("adamw_torch", "torch.optim.AdamW"), ("sgd", "torch.optim.SGD"),
                                       ("adamw_bnb_8bit", "bitsandbytes.optim.AdamW8bit"),
                                       ("paged_adamw_8bit", "bitsandbytes.optim.PagedAdamW8bit"),
                                       ("paged_adamw_32bit", "bitsandbytes.optim.PagedAdamW")])
def test_optimizer_names_map_to_their_optimizers(name, cls):
    import importlib

    module, _, attr = cls.rpartition(".")
    optimizer = make_optimizer([torch.nn.Parameter(torch.randn(64, 64))], 0.1, name)
    assert type(optimizer) is getattr(importlib.import_module(module), attr)
    assert optimizer.param_groups[0]["lr"] == 0.1


def test_dropout_is_seeded_per_client_not_by_the_process(setup):
    _, tok, examples, global_state = setup
    recipe = recipe_for("model.lora.peft-lora-dropout=0.3", "train.training-arguments.max-steps=2")
    dropout_model, _ = load_model_and_tokenizer(recipe)
    with_dropout = (dropout_model, tok, examples, global_state)
    torch.manual_seed(1)
    a = run_client(with_dropout, recipe, seed=5)
    torch.manual_seed(2)  # another process, or the same one after other clients: another global RNG state
    b = run_client(with_dropout, recipe, seed=5)
    assert all(torch.equal(a[k], b[k]) for k in a)
    c = run_client(with_dropout, recipe, seed=6)  # another client: other masks (every example is the same)
    assert any(not torch.equal(a[k], c[k]) for k in a)
