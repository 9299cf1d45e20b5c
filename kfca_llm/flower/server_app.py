"""The recipes' ServerApp: FedAvg over the nodes' LoRA adapters, every reply paid by ``KFCAStrategy``.

Run config (pyproject ``[tool.flwr.app.config]``, ``flwr run . --run-config 'key=value ...'``): the recipe's
FlowerTune keys, plus ``recipe`` (a shipped name or a file), ``kfca.aggregation`` (``all``, ``exclude-negative``,
``reward-weighted``), ``kfca.ledger`` (the SQLite file, relative to the directory the ServerApp runs in),
``kfca.identity`` (``auto``, ``public-key``, ``declared``), ``kfca.keep-signs`` (store the packed signs for
``kfca-llm verify`` to recompute; default true), ``kfca.resume`` (continue the ledger's last run from the arrays
its last committed round produced), ``kfca.receipt-key`` (the server's Ed25519 key file that signs each
participant's receipts; empty: no receipts), ``kfca.wrapped-strategy`` (Flower's own strategy that aggregates what
KFCA keeps: ``WRAPPED_STRATEGIES``, with ``kfca.wrapped.num-malicious-nodes`` for krum/multikrum/bulyan,
``kfca.wrapped.num-nodes-to-select`` for multikrum, ``kfca.wrapped.beta`` for fedtrimmedavg; a parameter the chosen
strategy does not take is ignored) and ``strategy.fraction-evaluate`` (the share of nodes that evaluate the global
adapter on the held-out rows after each round: Flower's evaluate round, its loss and exact-answer accuracy in the
run's ``evaluate_metrics_clientapp``). The recipe key ``kfca.reference-rows = N`` (with ``kfca.reference-weight``)
makes the server train a trusted reference each round on N held-out rows, from the round's global adapter, as
``kfca-llm simulate`` does (``task.reference_update``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from logging import INFO
from typing import Any

from flwr.app import ArrayRecord, Context
from flwr.common import log
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import Bulyan, FedAvg, FedMedian, FedTrimmedAvg, Krum, MultiKrum, Result

from ..errors import InputError
from ..fl.scoring import pool_arguments, pool_settings
from ..recipe import Recipe
from .logs import report_input_errors_on_one_line
from .strategy import KFCAStrategy
from .task import DEFAULT_LEDGER, initial_adapter, recipe_from_config, reference_rows, reference_update


def _flag(config: Mapping[str, Any], key: str, default: bool = False) -> bool:
    value = config.get(key, default)
    if not isinstance(value, bool):
        raise InputError(f"run-config key {key!r} must be true or false, got {value!r}")
    return value


WRAPPED_STRATEGIES: dict[str, type] = {"fedavg": FedAvg, "fedmedian": FedMedian, "fedtrimmedavg": FedTrimmedAvg,
                                        "krum": Krum, "multikrum": MultiKrum, "bulyan": Bulyan}
"""``kfca.wrapped-strategy`` -> Flower's class (``flwr.serverapp.strategy``)."""
WRAPPED_PARAMETERS = {"kfca.wrapped.num-malicious-nodes": ("num_malicious_nodes", ("krum", "multikrum", "bulyan")),
                      "kfca.wrapped.num-nodes-to-select": ("num_nodes_to_select", ("multikrum",)),
                      "kfca.wrapped.beta": ("beta", ("fedtrimmedavg",))}
"""Run-config key -> (the Flower class's argument, the strategies that take it)."""


def _number(config: Mapping[str, Any], key: str, default: float, kind: type, low: float, high: float) -> float:
    value = config.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and not float(value).is_integer()):
        raise InputError(f"run-config key {key!r} must be {'an integer' if kind is int else 'a number'}, got {value!r}")
    if not low <= value <= high:
        raise InputError(f"run-config key {key!r} must lie in [{low}, {high}], got {value!r}")
    return kind(value)


def build_wrapped_strategy(recipe: Recipe, config: Mapping[str, Any]):
    """Flower's strategy named by ``kfca.wrapped-strategy`` (default fedavg), weighted by examples, with the
    recipe's sampling and its parameters from the run config."""
    name = str(config.get("kfca.wrapped-strategy", "fedavg"))
    if name not in WRAPPED_STRATEGIES:
        raise InputError(f"run-config key 'kfca.wrapped-strategy' must be one of {sorted(WRAPPED_STRATEGIES)}, "
                         f"got {name!r}")
    limits = {"kfca.wrapped.num-malicious-nodes": (0, int, 0, 1e9), "kfca.wrapped.num-nodes-to-select": (1, int, 1, 1e9),
              "kfca.wrapped.beta": (0.2, float, 0.0, 0.5)}
    options = {argument: _number(config, key, *limits[key]) for key, (argument, takers) in WRAPPED_PARAMETERS.items()
               if name in takers}
    fraction_evaluate = _number(config, "strategy.fraction-evaluate", 1.0, float, 0.0, 1.0)
    return WRAPPED_STRATEGIES[name](fraction_train=recipe.strategy.fraction_train, fraction_evaluate=fraction_evaluate,
                                    min_train_nodes=2, min_available_nodes=2, **options)


def build_strategy(recipe: Recipe, config: Mapping[str, Any], strategy_class: type = KFCAStrategy
                   ) -> KFCAStrategy:
    """KFCAStrategy around the wrapped Flower strategy (``build_wrapped_strategy``) with the recipe's KFCA settings
    (``kfca.reference-rows``: the server's reference, ``task.reference_update``)."""
    reference = None
    if recipe.kfca.reference_rows:
        reference_rows(recipe)  # rows no node has: a data set too small to set them aside fails now, clearly
        reference = functools.partial(reference_update, recipe)
    return strategy_class(build_wrapped_strategy(recipe, config), peers=recipe.kfca.peers, seed=recipe.kfca.seed,
                          penalty=recipe.kfca.penalty, bonus_fraction=recipe.kfca.bonus_fraction,
                          ledger=str(config.get("kfca.ledger", DEFAULT_LEDGER)),
                          aggregation=str(config.get("kfca.aggregation", "all")),
                          duplicates=recipe.kfca.duplicates, identity=str(config.get("kfca.identity", "auto")),
                          keep_signs=_flag(config, "kfca.keep-signs", True), resume=_flag(config, "kfca.resume"),
                          receipt_key=str(config.get("kfca.receipt-key", "")) or None,
                          **pool_arguments(pool_settings(recipe)),
                          reference=reference, reference_weight=recipe.kfca.reference_weight,
                          weak_verdict=recipe.kfca.weak_verdict, public_steps=recipe.kfca.public_steps,
                          public_buckets=recipe.kfca.public_buckets)


def make_server_app(defaults: Mapping[str, Any] = {}, *, strategy_class: type = KFCAStrategy,
                    on_result: Callable[[KFCAStrategy, Result], None] | None = None) -> ServerApp:
    """A ServerApp whose run config falls back to ``defaults``; ``on_result`` sees the strategy at the end.

    A wrong setting raises ``InputError`` out of the app (so Flower marks the run failed), logged on one line.
    """
    report_input_errors_on_one_line()
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        config = {**defaults, **context.run_config}
        recipe = recipe_from_config(config)
        strategy = build_strategy(recipe, config, strategy_class)
        # A resumed run starts from the arrays its last committed round produced, for the rounds left.
        initial = strategy.resume_arrays() or ArrayRecord(initial_adapter(recipe))
        rounds_left = recipe.num_server_rounds - strategy.round_offset
        if rounds_left < 1:
            log(INFO, "KFCA: the ledger's run already has %s rounds; nothing to resume", strategy.round_offset)
            return
        result = strategy.start(grid=grid, initial_arrays=initial, num_rounds=rounds_left)
        if on_result is not None:
            on_result(strategy, result)

    return app


app = make_server_app()
