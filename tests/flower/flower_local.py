"""An in-process Flower Grid and numpy nodes, to drive a strategy without a simulation engine (no Ray).

Each node is a function (instruction message -> reply message); the grid delivers a round's messages
to them in order. Used by the strategy tests and by the ledger crash test's server subprocess.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Mapping

import numpy as np
from flwr.app import Array, ArrayRecord, Message, MetricRecord, RecordDict
from flwr.proto.node_pb2 import NodeInfo  # the type Grid.get_nodes returns in flwr 1.42
from flwr.serverapp import Grid
from flwr.supercore.task_identity import TaskIdentity

SHAPES = {"conv.weight": (4, 3, 3), "dense.bias": (16,), "dense.weight": (16, 24)}


def num_examples(node: int) -> int:
    return 10 * node


def set_task_identity() -> None:
    """Messages read their run and sender from the process's task identity (a SuperLink sets it)."""
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1


def node_key(node: int) -> bytes:
    """The public key a node registered with (a SuperLink reports it through ``Grid.get_nodes``)."""
    return f"-----BEGIN PUBLIC KEY-----\nnode-{node}\n-----END PUBLIC KEY-----\n".encode()


def pid(node: int) -> str:
    """The participant a node is paid as under ``identity="public-key"``/``"auto"``: its key's fingerprint."""
    return "key:" + hashlib.sha256(node_key(node)).hexdigest()


class LocalGrid(Grid):
    """``keys``: node id -> registered public key (default ``node_key(node)``; b"": the grid reports none)."""

    def __init__(self, nodes: Mapping[int, Callable[[Message], Message]], keys: Mapping[int, bytes] | None = None):
        set_task_identity()
        self.nodes = dict(nodes)
        self.keys = {node: node_key(node) for node in self.nodes} if keys is None else dict(keys)
        self.sent: list[Message] = []

    def set_run(self, run) -> None:  # pragma: no cover - not used in process
        self._run = run

    @property
    def run(self):  # pragma: no cover
        return self._run

    def create_message(self, content, message_type, dst_node_id, group_id, ttl=None):  # pragma: no cover
        return Message(content, dst_node_id, message_type, group_id=group_id, ttl=ttl)

    def get_node_ids(self) -> Iterable[int]:
        return list(self.nodes)

    def get_nodes(self) -> Iterable[NodeInfo]:
        return [NodeInfo(node_id=node, public_key=self.keys.get(node, b"")) for node in self.nodes]

    def push_messages(self, messages):  # pragma: no cover
        raise NotImplementedError("LocalGrid answers in send_and_receive")

    def pull_messages(self, message_ids):  # pragma: no cover
        raise NotImplementedError("LocalGrid answers in send_and_receive")

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> list[Message]:
        messages = list(messages)
        self.sent.extend(messages)
        # Replies "arrive" in the order the nodes were given (FedAvg samples the nodes in a random order).
        order = list(self.nodes)
        return [self.nodes[m.metadata.dst_node_id](m)
                for m in sorted(messages, key=lambda m: order.index(m.metadata.dst_node_id))]


def initial_arrays(seed: int = 0) -> ArrayRecord:
    rng = np.random.default_rng(seed)
    return ArrayRecord({k: Array(rng.standard_normal(s).astype(np.float32)) for k, s in SHAPES.items()})


def honest_update(node: int, server_round: int) -> dict[str, np.ndarray]:
    """A shared direction per round plus node noise: honest nodes' signs agree well above chance."""
    common = np.random.default_rng(1000 + server_round)
    own = np.random.default_rng(node * 7919 + server_round)
    return {k: (common.standard_normal(s) + 0.8 * own.standard_normal(s)).astype(np.float32) * 0.01
            for k, s in SHAPES.items()}


def public_steps(sent: Mapping[int, Mapping[str, np.ndarray]], server_round: int) -> list[dict[str, np.ndarray]]:
    """The global's steps up to ``server_round`` (oldest first) from the arrays sent each round (float ones): the public
    trajectory ``KFCAStrategy`` conditions the round on."""
    rounds = sorted(t for t in sent if t <= server_round)
    return [{k: sent[new][k] - sent[old][k] for k in sent[new] if np.issubdtype(sent[new][k].dtype, np.floating)}
            for old, new in zip(rounds, rounds[1:])]


def reply_with(message: Message, arrays: ArrayRecord | None, examples=None, *, key: str = "arrays") -> Message:
    node = message.metadata.dst_node_id
    content = RecordDict({"metrics": MetricRecord({"num-examples": 10 * node if examples is None
                                                   else examples})})
    if arrays is not None:
        content[key] = arrays
    return Message(content=content, reply_to=message)


def numpy_node(kind: str, copy_of: int | None = None) -> Callable[[Message], Message]:
    """A node that trains 'honestly' (returns global + its update), or flips or zeroes that update;
    with ``copy_of`` the update is that node's honest update (a copier)."""
    def answer(message: Message) -> Message:
        node = message.metadata.dst_node_id
        server_round = int(message.content["config"]["server-round"])
        sent = {k: a.numpy() for k, a in message.content["arrays"].items()}
        update = honest_update(node if copy_of is None else copy_of, server_round)
        factor = {"honest": 1.0, "flip": -1.0, "zero": 0.0}[kind]
        # Arrays it does not train (e.g. an integer counter) go back as they came.
        return reply_with(message, ArrayRecord({k: Array(sent[k] + factor * update[k] if k in update else sent[k])
                                                for k in sent}))

    return answer


def serve_with_receipts(folder, *, keep_signs: bool, nodes: Mapping[int, str], rounds: int = 3):
    """A KFCAStrategy run over ``nodes`` (node id -> numpy_node kind) writing ``folder/rewards.sqlite`` with a
    receipt key ``folder/keys/server.key``; node N keeps its receipts in ``folder/receipts-N/`` as the recipes'
    ClientApp does (the evaluate round delivers the last round's), and the global it was sent in round T as
    ``folder/sent-N/roundT.safetensors`` (what ``kfca-llm verify --sent`` reads). The ledger is left in one file (no
    WAL)."""
    import sqlite3
    from pathlib import Path

    from flwr.serverapp.strategy import FedAvg

    from kfca_llm.flower import KFCAStrategy
    from kfca_llm.flower.receipts import receipts_in_message, save_receipts

    folder = Path(folder)

    def keeping(kind: str, node: int):
        answer = numpy_node(kind)

        def reply(message: Message) -> Message:
            from safetensors.numpy import save_file

            save_receipts(receipts_in_message(message.content.config_records), folder / f"receipts-{node}")
            if "arrays" in message.content.array_records:
                sent = folder / f"sent-{node}"
                sent.mkdir(exist_ok=True)
                save_file({k: a.numpy() for k, a in message.content["arrays"].items()},
                          str(sent / f"round{int(message.content['config']['server-round'])}.safetensors"))
            return answer(message)

        return reply

    strategy = KFCAStrategy(FedAvg(fraction_evaluate=1.0), ledger=folder / "rewards.sqlite", seed=3,
                            keep_signs=keep_signs, receipt_key=folder / "keys" / "server.key")
    strategy.start(grid=LocalGrid({n: keeping(k, n) for n, k in nodes.items()}), initial_arrays=initial_arrays(),
                   num_rounds=rounds)
    conn = sqlite3.connect(folder / "rewards.sqlite")
    try:
        conn.execute("PRAGMA journal_mode=DELETE")
    finally:
        conn.close()
    return folder


def run_ray_simulation(server_app, client_app, num_supernodes: int) -> None:
    """``flwr.simulation.run_simulation`` on one CPU per node, with this folder on the Ray workers' PYTHONPATH
    (their ClientApps import the tests' helper modules)."""
    import os
    from pathlib import Path

    from flwr.simulation import run_simulation

    saved = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = str(Path(__file__).resolve().parent) + (os.pathsep + saved if saved else "")
    try:
        run_simulation(server_app=server_app, client_app=client_app, num_supernodes=num_supernodes,
                       backend_config={"client_resources": {"num_cpus": 1}, "init_args": {"num_cpus": 1}})
    finally:
        if saved is None:
            os.environ.pop("PYTHONPATH")
        else:
            os.environ["PYTHONPATH"] = saved
