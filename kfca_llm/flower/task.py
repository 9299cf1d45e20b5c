"""Shared code of the Flower app (FlowerTune's layout): recipe from the run config, model, data, local training.

The run config carries FlowerTune's own key names (``model.name``,
``train.training-arguments.learning-rate``...: our recipes use the same ones), applied as overrides to
the recipe named by ``recipe`` (default ``tiny``), plus the app's keys in ``APP_KEYS``. Flower's config
values are scalars, so ``kfca.attackers`` is written as one string: ``"3=flip,5=lagged:2"``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from functools import lru_cache
from typing import Any

import torch

from ..attacks import resolve_attack
from ..errors import InputError
from ..fl.client import ClientUpdate, adapter_state, train_client
from ..fl.rounds import attack_context
from ..fl.seeds import client_id
from ..fl.training_plan import TrainingPlan
from ..recipe import DEFAULT_RECIPE, Recipe, fixed_attackers, load_recipe

APP_KEYS = ("recipe", "kfca.aggregation", "kfca.ledger", "kfca.keep-signs", "kfca.identity", "kfca.resume",
            "kfca.receipt-key", "kfca.wrapped-strategy", "kfca.wrapped.num-malicious-nodes",
            "kfca.wrapped.num-nodes-to-select", "kfca.wrapped.beta", "strategy.fraction-evaluate")
"""Run-config keys of the app itself; every other key is a recipe key."""
DEFAULT_LEDGER = "rewards.sqlite"


def recipe_from_config(config: Mapping[str, Any], *, num_partitions: int | None = None) -> Recipe:
    """The recipe a run config describes; ``num_partitions`` (a node's ``num-partitions``) sets num-clients.

    The Flower app has no attack-analysis client (``kfca.attacks`` is emptied): nodes attack through
    their node config (``attack``) or ``kfca.attackers`` (by partition id).
    """
    values: dict[str, Any] = {key: value for key, value in config.items() if key not in APP_KEYS}
    if isinstance(values.get("kfca.attackers"), str):  # Flower's config values are scalars: "3=flip,5=lagged:2"
        values["kfca.attackers"] = tuple(part.strip() for part in values["kfca.attackers"].split(",") if part.strip())
    values["kfca.attacks"] = ()
    if num_partitions is not None:
        values["num-clients"] = int(num_partitions)
    return load_recipe(str(config.get("recipe", DEFAULT_RECIPE)), values=values)


def recipe_key(recipe: Recipe) -> str:
    from ..recipe import recipe_to_dict

    return json.dumps(recipe_to_dict(recipe), sort_keys=True)


@lru_cache(maxsize=2)
def _model(key: str) -> tuple[Any, Any, dict[str, torch.Tensor]]:
    """Model, tokenizer and the model's adapter as built (training and evaluation overwrite the model's
    adapter later), once per process (a Ray worker serves many nodes)."""
    from ..modeling import load_model_and_tokenizer
    from ..recipe import recipe_from_dict

    model, tokenizer = load_model_and_tokenizer(recipe_from_dict(json.loads(key)), device="cpu")
    return model, tokenizer, adapter_state(model)


@lru_cache(maxsize=2)
def _datasets(key: str) -> list:
    """Every partition's encoded examples (the IID split of `kfca-llm simulate`), once per process."""
    from ..data import load_client_datasets
    from ..recipe import recipe_from_dict

    return load_client_datasets(recipe_from_dict(json.loads(key)), _model(key)[1])


def initial_adapter(recipe: Recipe) -> dict[str, torch.Tensor]:
    """The global adapter of round 1 (the same seeded model every node builds)."""
    return {name: tensor.clone() for name, tensor in _model(recipe_key(recipe))[2].items()}


def train_partition(recipe: Recipe, partition: int, global_state: Mapping[str, torch.Tensor],
                    server_round: int) -> ClientUpdate:
    """One node, one round: ``kfca_llm.fl.client.train_client``, seeded as ``kfca-llm simulate`` seeds client
    ``partition`` (the same update for the same recipe, round and global adapter)."""
    if not 0 <= partition < recipe.num_clients:
        raise InputError(f"partition-id {partition} is outside 0..{recipe.num_clients - 1}")
    key = recipe_key(recipe)
    model, tokenizer, _ = _model(key)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    plan = TrainingPlan.of(recipe)
    return train_client(model, global_state, _datasets(key)[partition], plan, server_round=server_round,
                        seed=plan.client_seed(server_round, partition), device=torch.device("cpu"), pad_token_id=pad_id)


@lru_cache(maxsize=2)
def _heldout(key: str) -> list:
    """The held-out rows every node evaluates the global adapter on (``data.load_heldout_examples``)."""
    from ..data import load_heldout_examples
    from ..recipe import recipe_from_dict

    return load_heldout_examples(recipe_from_dict(json.loads(key)), _model(key)[1])


def evaluate_global_adapter(recipe: Recipe, global_state: Mapping[str, torch.Tensor]) -> dict[str, float | int]:
    """The global adapter's held-out loss and exact-answer accuracy (``fl.evaluate``), as ``kfca-llm simulate``
    measures them after each round."""
    from ..fl.evaluate import evaluate_global

    key = recipe_key(recipe)
    examples = _heldout(key)
    if not examples:
        raise InputError(f"data set {recipe.dataset.name!r} has no held-out rows to evaluate on "
                         "(dataset.heldout-rows = 0); set strategy.fraction-evaluate = 0 or dataset.heldout-rows > 0")
    model, tokenizer, _ = _model(key)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    return evaluate_global(model, global_state, examples, pad_id, torch.device("cpu"))


def reference_rows(recipe: Recipe) -> list:
    """The server's ``kfca.reference-rows`` held-out rows (encoded), once per process; InputError where the data
    set cannot set them aside."""
    return _reference_rows(recipe_key(recipe))


@lru_cache(maxsize=2)
def _reference_rows(key: str) -> list:
    """The server's held-out rows for its reference (``data.load_reference_examples``: rows no node trains on)."""
    from ..data import load_reference_examples
    from ..recipe import recipe_from_dict

    recipe = recipe_from_dict(json.loads(key))
    try:
        return load_reference_examples(recipe, _model(key)[1], recipe.kfca.reference_rows)
    except ValueError as exc:
        raise InputError(str(exc)) from None


def reference_update(recipe: Recipe, global_arrays: Mapping[str, Any], server_round: int) -> dict[str, Any]:
    """The server's trusted reference update of ``server_round`` (``kfca.reference-rows`` held-out rows, trained from
    the round's global arrays as ``kfca-llm simulate`` trains it: ``fl.client.train_reference``), as numpy arrays
    (name -> local - global) for ``KFCAStrategy(reference=...)``."""
    from ..fl.client import train_reference

    key = recipe_key(recipe)
    model, tokenizer, _ = _model(key)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    global_state = {name: torch.as_tensor(array) for name, array in global_arrays.items()}
    update = train_reference(model, global_state, reference_rows(recipe), TrainingPlan.of(recipe),
                             server_round=server_round, device=torch.device("cpu"), pad_token_id=pad_id)
    return {name: update[name].detach().cpu().numpy() for name in global_state}


def node_attack(recipe: Recipe, node_config: Mapping[str, Any], partition: int) -> str | None:
    """The node's attack spec: its node config's ``attack``, else ``kfca.attackers`` for its partition."""
    spec = node_config.get("attack") or fixed_attackers(recipe).get(partition)
    if spec:
        resolve_attack(str(spec))  # an unknown spec names the valid ones
    return str(spec) if spec else None


def attacked_update(recipe: Recipe, spec: str, partition: int, server_round: int,
                    honest: dict[str, torch.Tensor], history: list[dict[str, torch.Tensor]],
                    public: list[dict[str, torch.Tensor]] = ()) -> dict[str, torch.Tensor]:
    """A node's submission under attack ``spec``, with the noise `kfca-llm simulate` gives that client
    (``public``: the globals the node received, oldest first, this round's last).

    A node sees no other node's update, so attacks that need one (``copy``) raise ``InputError``: the
    node replies with an error, which the strategy records."""
    cid = client_id(partition)
    context = attack_context(recipe.kfca.seed, server_round, cid, f"{cid}={spec}", {cid: honest}, history, public)
    return resolve_attack(spec).submit(context)
