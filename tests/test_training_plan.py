"""The recipe resolved once into what local training needs (``kfca_llm.fl.training_plan.TrainingPlan``): each field is
its recipe key's value, the derived numbers follow Hugging Face's rules, training from the plan trains what main's
code path trained from the whole recipe (``training_plan_cases``), and ``fl/client.py`` reads nothing of the recipe.
"""

from __future__ import annotations

import ast
import dataclasses
import math
import tomllib

import pytest
import torch
from helpers import RECIPES, ROOT, TINY
from training_plan_cases import RECORDED, RECORDED_ON, ROUND_CASES, case_inputs, machine, summary

from kfca_llm.fl.client import train_client, train_reference
from kfca_llm.fl.seeds import REFERENCE_TRAIN, derive_seed, train_seed
from kfca_llm.fl.training_plan import TrainingPlan
from kfca_llm.recipe import load_recipe

SHIPPED = sorted(RECIPES.glob("*.toml"))
# plan field -> its recipe key (train.training-arguments.<key> where the key has no dot)
KEYS = {"optim": "optim", "lr_scheduler_type": "lr-scheduler-type", "warmup_steps": "warmup-steps",
        "warmup_ratio": "warmup-ratio", "per_device_train_batch_size": "per-device-train-batch-size",
        "gradient_accumulation_steps": "gradient-accumulation-steps", "num_train_epochs": "num-train-epochs",
        "max_steps": "max-steps", "max_grad_norm": "max-grad-norm", "seed": "kfca.seed",
        "dynamic_data_seed": "train.dynamic-data-seed"}


def toml_value(table: dict, key: str):
    """The value a recipe file writes for ``key`` (None: left to the default)."""
    path = key.split(".") if "." in key else ["train", "training-arguments", key]
    for part in path:
        if not isinstance(table, dict) or part not in table:
            return None
        table = table[part]
    return table


def cosine(t: int, rounds: int, lo: float, hi: float) -> float:
    """FlowerTune's learning rate of round t of T, written out."""
    return lo + 0.5 * (hi - lo) * (1.0 + math.cos(math.pi * t / rounds))


@pytest.mark.parametrize("path", SHIPPED, ids=[p.stem for p in SHIPPED])
def test_the_plan_of_each_shipped_recipe_holds_the_recipes_values(path):
    table = tomllib.loads(path.read_text())
    recipe = load_recipe(path)
    plan = TrainingPlan.of(recipe)
    ta = recipe.train.training_arguments
    defaults = {**{field: getattr(ta, field) for field in KEYS if hasattr(ta, field)}, "seed": recipe.kfca.seed,
                "dynamic_data_seed": recipe.train.dynamic_data_seed}
    for field, key in KEYS.items():
        written = toml_value(table, key)
        assert getattr(plan, field) == (defaults[field] if written is None else written), field
    rounds = table["num-server-rounds"]
    lo, hi = table["train"]["learning-rate-min"], table["train"]["learning-rate-max"]
    assert len(plan.learning_rates) == rounds
    assert [plan.lr(t) for t in range(1, rounds + 1)] == pytest.approx([cosine(t, rounds, lo, hi)
                                                                         for t in range(1, rounds + 1)], rel=1e-12)
    assert plan.examples_per_step == plan.per_device_train_batch_size * plan.gradient_accumulation_steps


def test_every_field_reads_its_own_key():
    """Every training key set to a value no other key has: a field read from the wrong key fails."""
    recipe = load_recipe(TINY, ["num-server-rounds=4", "train.learning-rate-max=0.02", "train.learning-rate-min=0.001",
                                "train.training-arguments.optim=sgd", "train.training-arguments.lr-scheduler-type=cosine",
                                "train.training-arguments.warmup-steps=3", "train.training-arguments.warmup-ratio=0.2",
                                "train.training-arguments.per-device-train-batch-size=5",
                                "train.training-arguments.gradient-accumulation-steps=7",
                                "train.training-arguments.num-train-epochs=2", "train.training-arguments.max-steps=11",
                                "train.training-arguments.max-grad-norm=0.25", "kfca.seed=13",
                                "train.dynamic-data-seed=false"])
    assert TrainingPlan.of(recipe) == TrainingPlan(
        optim="sgd", learning_rates=tuple(cosine(t, 4, 0.001, 0.02) for t in range(1, 5)), lr_scheduler_type="cosine",
        warmup_steps=3, warmup_ratio=0.2, per_device_train_batch_size=5, gradient_accumulation_steps=7,
        num_train_epochs=2, max_steps=11, max_grad_norm=0.25, seed=13, dynamic_data_seed=False)
    # A field added to the plan is added here too (and to KEYS above).
    assert {f.name for f in dataclasses.fields(TrainingPlan)} == {*KEYS, "learning_rates"}


def test_steps_warmup_and_seeds_follow_their_rules():
    plan = TrainingPlan.of(load_recipe(TINY, ["train.training-arguments.max-steps=0",
                                              "train.training-arguments.num-train-epochs=2",
                                              "train.training-arguments.per-device-train-batch-size=3",
                                              "train.training-arguments.gradient-accumulation-steps=2",
                                              "train.training-arguments.lr-scheduler-type=linear",
                                              "train.training-arguments.warmup-ratio=0.25", "kfca.seed=5"]))
    assert plan.examples_per_step == 6
    assert [plan.local_steps(n) for n in (1, 6, 7, 13)] == [2, 2, 4, 6]  # ceil(n / 6) epochs of steps, at least one
    assert dataclasses.replace(plan, max_steps=9).local_steps(1000) == 9  # max-steps caps the epochs
    assert [plan.warmup(s) for s in (1, 4, 5)] == [1, 1, 2]  # ceil(0.25 * steps)
    assert dataclasses.replace(plan, warmup_steps=3).warmup(100) == 3  # warmup-steps wins
    assert plan.client_seed(4, 2) == train_seed(5, 4, 2, True) != plan.client_seed(5, 2)
    assert dataclasses.replace(plan, dynamic_data_seed=False).client_seed(4, 2) == train_seed(5, 7, 2, False)
    assert plan.reference_seed(3) == derive_seed(5, REFERENCE_TRAIN, 3)
    for bad in (0, len(plan.learning_rates) + 1):
        with pytest.raises(ValueError, match="outside"):
            plan.lr(bad)
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.max_steps = 1


@pytest.mark.parametrize("name", list(ROUND_CASES))
def test_training_from_the_plan_trains_what_mains_recipe_path_trained(name):
    recipe, model, pad, examples, global_state, server_round, seed, reference = case_inputs(name)
    plan, cpu = TrainingPlan.of(recipe), torch.device("cpu")
    if reference:
        got = summary(train_reference(model, global_state, examples, plan, server_round=server_round, device=cpu,
                                      pad_token_id=pad))
    else:
        result = train_client(model, global_state, examples, plan, server_round=server_round, seed=seed, device=cpu,
                              pad_token_id=pad)
        got = summary(result.update, result.loss_before, result.loss_after)
    want = RECORDED[name]
    for key in ("loss_before", "loss_after"):
        assert got[key] == (None if want[key] is None else pytest.approx(want[key], rel=1e-4)), key
    # Anywhere: the same update to float tolerance (another round's learning rate, one step more or less, another
    # schedule or data order moves the per-tensor sums by percents).
    assert list(got["sums"]) == list(want["sums"])
    sums, wanted = torch.tensor(list(got["sums"].values())), torch.tensor(list(want["sums"].values()))
    assert float((sums - wanted).norm()) <= 1e-3 * float(wanted.norm())
    if machine() == RECORDED_ON:  # the torch build and CPU kernels that recorded it: bit for bit
        assert got == want


def test_local_training_reads_nothing_of_the_recipe():
    """``fl/client.py`` trains from the plan: it imports nothing of ``kfca_llm.recipe`` and names no recipe key."""
    source = (ROOT / "kfca_llm" / "fl" / "client.py").read_text()
    imported = {node.module for node in ast.walk(ast.parse(source)) if isinstance(node, ast.ImportFrom)}
    assert not {m for m in imported if m and m.lstrip(".").startswith(("recipe", "kfca_llm.recipe"))}
    assert "training_arguments" not in source and "recipe." not in source
