"""The recipes' ClientApp: train the global adapter on this node's partition, reply ``global + update``.

A node attacks when its node config says so (``attack = "flip"``; any spec of ``kfca_llm.attacks``) or
when ``kfca.attackers`` names its ``partition-id``: it trains honestly, then submits the attack on its own
history of honest updates (kept in the node's ``context.state``), as ``kfca-llm simulate`` does; a free rider
(``free-ride:1``, ``kfca_llm.attacks_public``) replays the change of the globals the node received, the newest it
reads kept there too. A node config ``participant = "alice"`` is sent back with every reply: the identity the
ServerApp pays (``KFCAStrategy(identity="auto" | "declared")``), stable when the SuperNode restarts under a new
node id.
A node config ``receipts-dir = "/path"`` keeps the signed receipts the server sends (``receipts.py``) there,
for ``kfca-llm verify LEDGER --receipts /path --server-key KEY.pub``.

Evaluate messages (Flower's evaluate round, ``strategy.fraction-evaluate``): the node measures the global
adapter on the held-out rows, as ``kfca-llm simulate`` does after each round, and replies ``eval-loss``,
``eval-accuracy`` (exact answers) and ``num-examples`` (the rows).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from flwr.app import Array, ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from ..attacks_public import public_window
from .receipts import RECEIPTS_DIR_KEY, receipts_in_message, save_receipts
from .replies import declare_participant
from .task import attacked_update, evaluate_global_adapter, node_attack, recipe_from_config, train_partition

HISTORY_PREFIX = "kfca.honest-update."
RECEIVED_PREFIX = "kfca.received-global."


def _history(state: RecordDict, prefix: str = HISTORY_PREFIX) -> list[dict[str, torch.Tensor]]:
    rounds = sorted(int(k[len(prefix):]) for k in state.array_records if k.startswith(prefix))
    return [state[f"{prefix}{t}"].to_torch_state_dict() for t in rounds]


def _received(state: RecordDict, server_round: int, global_state: dict[str, torch.Tensor],
              window: int) -> list[dict[str, torch.Tensor]]:
    """The globals this node received, oldest first, this round's last; the state keeps the newest ``window``."""
    state[f"{RECEIVED_PREFIX}{server_round}"] = ArrayRecord(dict(global_state))
    rounds = sorted(int(k[len(RECEIVED_PREFIX):]) for k in state.array_records if k.startswith(RECEIVED_PREFIX))
    for t in rounds[:-window]:
        del state[f"{RECEIVED_PREFIX}{t}"]
    return _history(state, RECEIVED_PREFIX)


def train_reply(msg: Message, context: Context, defaults: Mapping[str, Any] = {}) -> Message:
    """Handle one training message (the body of the ClientApp's ``@train``)."""
    config = {**defaults, **context.run_config}
    node_config = context.node_config
    if node_config.get(RECEIPTS_DIR_KEY):
        save_receipts(receipts_in_message(msg.content.config_records), str(node_config[RECEIPTS_DIR_KEY]))
    recipe = recipe_from_config(config, num_partitions=node_config.get("num-partitions"))
    partition = int(node_config["partition-id"])
    server_round = int(msg.content["config"]["server-round"])
    global_state = msg.content["arrays"].to_torch_state_dict()
    result = train_partition(recipe, partition, global_state, server_round)
    update = result.update
    spec = node_attack(recipe, node_config, partition)
    if spec is not None:
        history = _history(context.state)
        context.state[f"{HISTORY_PREFIX}{server_round}"] = ArrayRecord(dict(update))
        window = public_window(spec)
        public = _received(context.state, server_round, global_state, window) if window else []
        update = attacked_update(recipe, spec, partition, server_round, update, history, public)
    arrays = ArrayRecord({k: Array((global_state[k] + update[k]).numpy()) for k in global_state})
    metrics = MetricRecord({"num-examples": result.num_examples, "train-loss-before": result.loss_before,
                            "train-loss-after": result.loss_after})
    content = declare_participant(RecordDict({"arrays": arrays, "metrics": metrics}), node_config)
    return Message(content=content, reply_to=msg)


def evaluate_reply(msg: Message, context: Context, defaults: Mapping[str, Any] = {}) -> Message:
    """Handle one evaluate message (the body of the ClientApp's ``@evaluate``)."""
    config = {**defaults, **context.run_config}
    recipe = recipe_from_config(config, num_partitions=context.node_config.get("num-partitions"))
    scores = evaluate_global_adapter(recipe, msg.content["arrays"].to_torch_state_dict())
    metrics = MetricRecord({"num-examples": scores["rows"], "eval-loss": scores["loss"],
                            "eval-accuracy": scores["accuracy"]})
    return Message(content=RecordDict({"metrics": metrics}), reply_to=msg)


def make_client_app(defaults: Mapping[str, Any] = {}) -> ClientApp:
    """A ClientApp whose run config falls back to ``defaults`` (``run_simulation`` passes no run config)."""
    app = ClientApp()

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        return train_reply(msg, context, defaults)

    @app.evaluate()
    def evaluate(msg: Message, context: Context) -> Message:
        return evaluate_reply(msg, context, defaults)

    return app


app = make_client_app()
