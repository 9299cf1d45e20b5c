"""KFCAStrategy over the in-process grid (``flower_local``) wrapping a FedAvg that records what it sent and was
handed, and nodes whose replies are broken: shared by the strategy tests."""

import numpy as np
from flower_local import LocalGrid, initial_arrays, numpy_node, pid, reply_with
from flwr.app import Array, ArrayRecord, Error, Message
from flwr.serverapp.strategy import FedAvg

from kfca_llm.flower import KFCAStrategy

KINDS = {1: "honest", 2: "honest", 3: "honest", 4: "flip", 5: "zero"}


class RecordingFedAvg(FedAvg):
    """FedAvg that keeps what it sent and the replies it was handed (to recompute rewards independently)."""

    def __init__(self, **kwargs):
        super().__init__(fraction_evaluate=0.0, **kwargs)
        self.sent, self.received = {}, {}

    def configure_train(self, server_round, arrays, config, grid):
        self.sent[server_round] = {k: a.numpy() for k, a in arrays.items()}
        return super().configure_train(server_round, arrays, config, grid)

    def aggregate_train(self, server_round, replies):
        replies = list(replies)
        self.received[server_round] = replies
        return super().aggregate_train(server_round, replies)


def run(nodes, *, rounds=2, ledger=None, **options):
    inner = RecordingFedAvg()
    strategy = KFCAStrategy(inner, ledger=ledger, **options)
    result = strategy.start(grid=LocalGrid(nodes), initial_arrays=initial_arrays(), num_rounds=rounds)
    return strategy, inner, result


def updates_of(inner, server_round):
    sent = inner.sent[server_round]
    return {pid(m.metadata.src_node_id): {k: a.numpy() - sent[k] for k, a in m.content["arrays"].items()}
            for m in inner.received[server_round]}


def bad_node(kind):
    """A node whose reply is broken in one way (the reply of an honest node, then damaged)."""
    honest = numpy_node("honest")

    def answer(message):
        arrays = honest(message).content["arrays"]
        values = {k: a.numpy() for k, a in arrays.items()}
        if kind == "error":
            return Message(Error(code=0, reason="out of memory"), reply_to=message)
        if kind == "no-arrays":
            return reply_with(message, None)
        if kind == "other-key":
            return reply_with(message, arrays, key="weights")
        if kind == "nan":
            values["dense.weight"][3, 5] = np.nan
        elif kind == "inf":
            values["conv.weight"][0, 0, 0] = -np.inf
        elif kind == "shape":
            values["dense.weight"] = values["dense.weight"].T.copy()
        elif kind == "missing":
            del values["dense.bias"]
        elif kind == "extra":
            values["head.weight"] = np.ones(3, np.float32)
        elif kind == "int":
            values["dense.bias"] = values["dense.bias"].astype(np.int32)
        elif kind == "float64":
            values["dense.bias"] = values["dense.bias"].astype(np.float64)
        elif kind == "weight":
            return reply_with(message, arrays, examples=float("nan"))
        return reply_with(message, ArrayRecord({k: Array(v) for k, v in values.items()}))

    return answer
