"""The recipes' ServerApp: FedAvg over the nodes' LoRA adapters, every reply paid by ``KFCAStrategy``.

Run config (pyproject ``[tool.flwr.app.config]``, ``flwr run . --run-config 'key=value ...'``): the
recipe's FlowerTune keys, plus ``recipe`` (a shipped name or a file), ``kfca.aggregation`` (``all``,
``exclude-negative``, ``reward-weighted``), ``kfca.ledger`` (the SQLite file, relative to the
directory the ServerApp runs in), ``kfca.identity`` (``auto``, ``public-key``, ``declared``),
``kfca.keep-signs`` (store the packed signs for ``kfca-llm verify``), ``kfca.resume`` (continue the
ledger's last run from the arrays its last committed round produced) and ``kfca.receipt-key`` (the server's
Ed25519 key file that signs each participant's receipts; empty: no receipts).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from logging import INFO
from typing import Any

from flwr.app import ArrayRecord, Context
from flwr.common import log
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg, Result

from ..errors import InputError
from ..recipe import Recipe
from .logs import report_input_errors_on_one_line
from .strategy import KFCAStrategy
from .task import DEFAULT_LEDGER, initial_adapter, recipe_from_config


def _flag(config: Mapping[str, Any], key: str) -> bool:
    value = config.get(key, False)
    if not isinstance(value, bool):
        raise InputError(f"run-config key {key!r} must be true or false, got {value!r}")
    return value


def build_strategy(recipe: Recipe, config: Mapping[str, Any], strategy_class: type = KFCAStrategy
                   ) -> KFCAStrategy:
    """KFCAStrategy around FedAvg (weighted by examples) with the recipe's sampling and KFCA settings."""
    fedavg = FedAvg(fraction_train=recipe.strategy.fraction_train, fraction_evaluate=0.0,
                    min_train_nodes=2, min_available_nodes=2)
    return strategy_class(fedavg, peers=recipe.kfca.peers, seed=recipe.kfca.seed, penalty=recipe.kfca.penalty,
                          bonus_fraction=recipe.kfca.bonus_fraction,
                          ledger=str(config.get("kfca.ledger", DEFAULT_LEDGER)),
                          aggregation=str(config.get("kfca.aggregation", "all")),
                          duplicates=recipe.kfca.duplicates, identity=str(config.get("kfca.identity", "auto")),
                          keep_signs=_flag(config, "kfca.keep-signs"), resume=_flag(config, "kfca.resume"),
                          receipt_key=str(config.get("kfca.receipt-key", "")) or None,
                          min_peers=recipe.kfca.min_peers, pool_window=recipe.kfca.pool_window,
                          pool_peers=recipe.kfca.pool_peers, pool_weight=recipe.kfca.pool_weight)


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
