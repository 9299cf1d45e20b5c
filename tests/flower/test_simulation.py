"""The repository's Flower app under Flower's simulation engine (Ray): one shared run of the tiny recipe.

Nine nodes, two rounds: partitions 0-2 train honestly, 3 flips (kfca.attackers), 4 submits zero, 5-7 run
a broken ClientApp (NaN, wrong shapes, no arrays), and 8 trains honestly but declares partition 0's
participant name (an impostor: a second live node claiming an identity already in the round). Every node
declares a participant (``org-<partition>``), as a node config ``participant`` would. The ServerApp runs
in this process, so the test reads the strategy's rewards and recomputes them with ``score_updates`` from
what was sent and received; the run keeps its signs, so ``kfca-llm verify`` recomputes it from the ledger.
"""


import numpy as np
import pytest

pytest.importorskip("flwr", reason="Flower is the optional extra kfca-llm[flower] (make install installs it)")

from flwr.app import Array, ArrayRecord, Message, MetricRecord, RecordDict  # noqa: E402
from flwr.clientapp import ClientApp  # noqa: E402
from flower_local import public_steps, run_ray_simulation  # noqa: E402

from kfca_llm import score_updates  # noqa: E402
from kfca_llm.flower import KFCAStrategy, read_ledger  # noqa: E402
from kfca_llm.cli import main  # noqa: E402
from kfca_llm.flower import declare_participant  # noqa: E402
from kfca_llm.flower.client_app import train_reply  # noqa: E402
from kfca_llm.flower.server_app import make_server_app  # noqa: E402

HONEST, FLIP, ZERO, BROKEN, IMPOSTOR = (0, 1, 2), 3, 4, {5: "nan", 6: "shape", 7: "no-arrays"}, 8
NODES, ROUNDS = 9, 2
# This ClientApp has no evaluate handler: no evaluate round (test_wrapped_simulation runs one).
CONFIG = {"num-server-rounds": ROUNDS, "strategy.fraction-train": 1.0, "strategy.fraction-evaluate": 0.0,
          "train.training-arguments.max-steps": 3,
          "kfca.attackers": f"{FLIP}=flip,{ZERO}=zero"}


class RecordingKFCA(KFCAStrategy):
    """Keeps the arrays sent and every reply received, to recompute the rewards independently."""

    sent: dict
    replies: dict

    def configure_train(self, server_round, arrays, config, grid):
        self.sent = getattr(self, "sent", {})
        self.replies = getattr(self, "replies", {})
        self.sent[server_round] = {k: a.numpy() for k, a in arrays.items()}
        return super().configure_train(server_round, arrays, config, grid)

    def aggregate_train(self, server_round, replies):
        self.replies[server_round] = list(replies)
        return super().aggregate_train(server_round, self.replies[server_round])


def _broken_reply(msg, kind):
    arrays = {k: a.numpy() for k, a in msg.content["arrays"].items()}
    name = sorted(arrays)[0]
    if kind == "nan":
        arrays[name].flat[0] = np.nan
    elif kind == "shape":
        arrays[name] = arrays[name].reshape(-1)
    content = RecordDict({"metrics": MetricRecord({"num-examples": 1, "partition-id": -1})})
    if kind != "no-arrays":
        content["arrays"] = ArrayRecord({k: Array(v) for k, v in arrays.items()})
    return Message(content=content, reply_to=msg)


client_app = ClientApp()


@client_app.train()
def _train(msg, context):
    """The repository's ClientApp, except for the broken partitions; tags replies with the partition."""
    partition = int(context.node_config["partition-id"])
    if partition in BROKEN:
        return _broken_reply(msg, BROKEN[partition])
    reply = train_reply(msg, context, CONFIG)
    reply.content["metrics"]["partition-id"] = partition
    declare_participant(reply.content, {"participant": f"org-{0 if partition == IMPOSTOR else partition}"})
    return reply


@pytest.fixture(scope="module")
def simulation(tmp_path_factory):
    ledger = tmp_path_factory.mktemp("flower") / "rewards.sqlite"
    done = {}
    server_app = make_server_app({**CONFIG, "kfca.ledger": str(ledger), "kfca.keep-signs": True},
                                 strategy_class=RecordingKFCA,
                                 on_result=lambda strategy, result: done.update(strategy=strategy, result=result))
    # Ray's workers import this module to run the ClientApp above: let them find it.
    run_ray_simulation(server_app, client_app, NODES)
    assert "strategy" in done, "the ServerApp did not finish"
    return done["strategy"], done["result"], ledger


def partitions(strategy, server_round):
    return {str(m.metadata.src_node_id): int(m.content["metrics"]["partition-id"])
            for m in strategy.replies[server_round] if m.has_content() and "metrics" in m.content}


def test_rewards_equal_score_updates_bit_for_bit(simulation):
    strategy, _, _ = simulation
    assert sorted(strategy.rewards) == list(range(1, ROUNDS + 1))
    for server_round, rewards in strategy.rewards.items():
        sent = strategy.sent[server_round]
        participant_of = {node: who for who, node in strategy.node_ids[server_round].items()}
        updates = {participant_of[str(m.metadata.src_node_id)]: {k: a.numpy() - sent[k]
                                                                 for k, a in m.content["arrays"].items()}
                   for m in strategy.replies[server_round] if str(m.metadata.src_node_id) in participant_of}
        assert sorted(updates) == [f"name:org-{p}" for p in (*HONEST, FLIP, ZERO)]
        assert rewards == score_updates(updates, seed=strategy.round_seed(server_round),
                                        public=public_steps(strategy.sent, server_round)).rewards


def test_flip_node_negative_zero_node_about_zero_honest_nodes_positive(simulation):
    strategy, _, _ = simulation
    for server_round, rewards in strategy.rewards.items():
        by_partition = {int(who.removeprefix("name:org-")): r for who, r in rewards.items()}
        assert sorted(by_partition) == [*HONEST, FLIP, ZERO]
        # > 0, not a margin: round 2 is conditioned on round 1's step, which the honest updates largely follow
        assert all(by_partition[p] > 0 for p in HONEST), by_partition
        assert by_partition[FLIP] < -0.05, by_partition
        assert abs(by_partition[ZERO]) < 0.02, by_partition


def test_broken_replies_and_the_impostor_are_recorded_and_excluded_and_the_run_completes(simulation):
    strategy, result, ledger = simulation
    assert sorted(result.train_metrics_clientapp) == list(range(1, ROUNDS + 1))
    expected = {"nan": "holds NaN or Inf", "shape": "differs from the sent shape", "no-arrays": "no ArrayRecord"}
    contents = read_ledger(ledger)
    kept = []
    for server_round in range(1, ROUNDS + 1):
        tags = partitions(strategy, server_round)
        broken_nodes = {node for node, p in tags.items() if p == -1} | {
            str(m.metadata.src_node_id) for m in strategy.replies[server_round] if "arrays" not in m.content}
        failures = dict(strategy.failures[server_round])
        refused = {node for node, reason in failures.items() if "a second live node claiming it is refused" in reason}
        claimants = {node for node, p in tags.items() if p in (0, IMPOSTOR)}
        # One of the two nodes claiming org-0 is paid, the other refused; the same one keeps it in round 2.
        assert len(refused) == 1 and refused < claimants
        kept.append(strategy.node_ids[server_round]["name:org-0"])
        assert {kept[-1]} == claimants - refused
        assert set(failures) == broken_nodes | refused and len(broken_nodes) == len(BROKEN)
        assert sorted(any(text in reason for reason in failures.values()) for text in expected.values()) == [True] * 3
        rows = [r for r in contents.rewards if r.round == server_round]
        assert {r.participant: r.reward for r in rows} == strategy.rewards[server_round]
        assert {r.participant: r.node_id for r in rows} == strategy.node_ids[server_round]
        assert {f.node_id for f in contents.failures if f.round == server_round} == broken_nodes | refused
    assert kept[0] == kept[1]
    assert [r.status for r in contents.rounds] == ["scored"] * ROUNDS
    assert {p.participant for p in contents.participants} == {f"name:org-{p}" for p in (*HONEST, FLIP, ZERO)}


def test_the_simulated_run_verifies_from_its_ledger(simulation, capsys):
    _, _, ledger = simulation
    assert main(["verify", str(ledger)]) == 0
    assert f"{ROUNDS} match, 0 mismatch, 0 unverifiable" in capsys.readouterr().out
