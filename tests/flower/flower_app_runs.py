"""The recipes' Flower app driven without a simulation engine, shared by test_app.py (the node side) and
test_server_app.py (the server side): the run config they use, a train message to a node, a node's context, the
arrays a reply carries, and the app config the pyproject declares for ``flwr run``."""

import tomllib
from pathlib import Path

import torch
from flower_local import set_task_identity
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.common.config import flatten_dict

ROOT = Path(__file__).resolve().parents[2]
CONFIG = {"train.training-arguments.max-steps": 1, "num-server-rounds": 2}


def train_message(arrays, server_round):
    set_task_identity()
    content = RecordDict({"arrays": ArrayRecord(arrays), "config": ConfigRecord({"server-round": server_round})})
    return Message(content, dst_node_id=11, message_type="train")


def node_context(node_config):
    return Context(run_id=1, node_id=11, node_config={"num-partitions": 4, **node_config}, state=RecordDict(),
                   run_config={})


def returned(reply):
    return {k: torch.from_numpy(a.numpy()) for k, a in reply.content["arrays"].items()}


def declared_config() -> dict:
    """The app config ``[tool.flwr.app.config]`` of the pyproject, flattened to Flower's dotted keys."""
    return flatten_dict(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"])
