"""The ClientApp of ``flower_few_peers.py`` (its own module: Ray's workers import it by name): the repository's
ClientApp (``train_reply``), each reply tagged with its partition id so the benchmark can name the nodes."""

import json
import os

from flwr.clientapp import ClientApp

from kfca_llm.flower.client_app import train_reply

CONFIG_VARIABLE = "KFCA_FEW_PEERS_CONFIG"
CONFIG: dict = json.loads(os.environ.get(CONFIG_VARIABLE, "{}"))
"""The run config, from the environment ``flower_few_peers.main`` sets (Ray's workers inherit it)."""

client_app = ClientApp()


@client_app.train()
def _train(msg, context):
    reply = train_reply(msg, context, CONFIG)
    reply.content["metrics"]["partition-id"] = int(context.node_config["partition-id"])
    return reply
