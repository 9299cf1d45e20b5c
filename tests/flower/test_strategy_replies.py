"""KFCAStrategy and what nodes reply: broken replies, errors and strangers are recorded failures, never scored;
replies declare the participant they are paid as (``identity="declared"`` / ``"public-key"``)."""

import numpy as np
import pytest

pytest.importorskip("flwr", reason="Flower is the optional extra kfca-llm[flower] (make install installs it)")

from flwr.app import Array, ConfigRecord, Error, Message, RecordDict  # noqa: E402
from flwr.serverapp.strategy import FedAvg  # noqa: E402
from flower_local import SHAPES, LocalGrid, initial_arrays, numpy_node, pid, reply_with  # noqa: E402
from flower_strategy_runs import KINDS, RecordingFedAvg, bad_node, run, updates_of  # noqa: E402

from kfca_llm import score_updates  # noqa: E402
from kfca_llm.flower import KFCAStrategy, read_ledger  # noqa: E402


BAD = {6: ("nan", "NaN or Inf"), 7: ("inf", "NaN or Inf"), 8: ("shape", "differs from the sent shape"),
       9: ("missing", "missing from the reply: ['dense.bias']"), 10: ("extra", "not sent: ['head.weight']"),
       11: ("int", "not a floating-point type"), 12: ("float64", "differs from the sent dtype float32"),
       13: ("no-arrays", "no ArrayRecord under 'arrays' (found [])"),
       14: ("other-key", "no ArrayRecord under 'arrays' (found ['weights'])"),
       15: ("error", "out of memory"), 16: ("weight", "'num-examples' must be a finite number")}


def test_bad_replies_are_recorded_excluded_and_the_round_goes_on(tmp_path):
    nodes = {n: numpy_node(k) for n, k in KINDS.items()} | {n: bad_node(kind) for n, (kind, _) in BAD.items()}
    ledger = tmp_path / "rewards.sqlite"
    strategy, inner, result = run(nodes, rounds=1, ledger=ledger)
    failures = dict(strategy.failures[1])
    assert set(failures) == {str(n) for n in BAD}
    for node, (_, reason) in BAD.items():
        assert reason in failures[str(node)], (node, failures[str(node)])
    handed = inner.received[1]
    assert sorted(m.metadata.src_node_id for m in handed) == sorted(KINDS)
    assert strategy.rewards[1] == score_updates(updates_of(inner, 1), seed=strategy.round_seed(1)).rewards
    assert result.train_metrics_clientapp[1]["kfca.failed-replies"] == len(BAD)
    contents = read_ledger(ledger)
    assert {(f.node_id, f.reason) for f in contents.failures} == {(n, r) for n, r in failures.items()}
    assert {r.node_id for r in contents.rewards} == {str(n) for n in KINDS}
    assert contents.rounds[0].failed_replies == len(BAD) and contents.rounds[0].valid_replies == len(KINDS)


def test_a_round_whose_every_node_replied_with_an_error_stops_the_run_with_the_first_error(tmp_path):
    """``flwr run`` with 2 SuperNodes and ``kfca.attackers = "3=flip"``: every ClientApp raised, every round got
    "0 results and 2 failures", and the run ended as if it had worked."""
    from kfca_llm.flower.replies import EveryNodeFailed

    def failing(message):
        return Message(Error(code=0, reason="RecipeError: kfca.attackers names client 3,\noutside 0..1"),
                       reply_to=message)

    with pytest.raises(EveryNodeFailed, match=r"^round 1: all 2 nodes replied with an error, so the run stops; the "
                                              r"first: 'RecipeError: kfca.attackers names client 3, outside 0..1'$"):
        run({1: failing, 2: failing}, rounds=3, ledger=tmp_path / "rewards.sqlite")
    assert read_ledger(tmp_path / "rewards.sqlite").rounds == []
    # one node failing is that node's failure: the round goes on
    strategy, _, _ = run({1: failing, 2: numpy_node("honest"), 3: numpy_node("honest")}, rounds=1)
    assert list(dict(strategy.failures[1])) == ["1"]


def test_replies_from_unknown_or_repeated_nodes_are_failures():
    strategy = KFCAStrategy(FedAvg(), ledger=None)
    grid = LocalGrid({n: numpy_node("honest") for n in (1, 2, 3)})
    messages = list(strategy.configure_train(1, initial_arrays(), ConfigRecord(), grid))
    replies = grid.send_and_receive(messages)
    stranger = Message(RecordDict(), dst_node_id=99, message_type="train")
    replies += [replies[0], reply_with(stranger, replies[1].content["arrays"], examples=5)]
    strategy.aggregate_train(1, replies)
    reasons = strategy.failures[1]
    assert (str(replies[0].metadata.src_node_id), "more than one reply from this node") in reasons
    assert ("99", "reply from a node that was not sent a training message this round") in reasons
    assert sorted(strategy.rewards[1]) == sorted(pid(n) for n in (1, 2, 3))


def test_non_float_arrays_must_come_back_unchanged_in_type_and_are_not_scored():
    """A numpy model with an integer counter (like BatchNorm's num_batches_tracked) beside its weights."""
    arrays = initial_arrays()
    arrays["bn.num_batches"] = Array(np.array([7], dtype=np.int64))

    def float_counter(message):
        reply = numpy_node("honest")(message)
        counter = reply.content["arrays"]["bn.num_batches"].numpy()
        reply.content["arrays"]["bn.num_batches"] = Array(counter.astype(np.float64))
        return reply

    nodes = {1: numpy_node("honest"), 2: numpy_node("honest"), 3: numpy_node("flip"), 4: float_counter}
    strategy = KFCAStrategy(RecordingFedAvg(), ledger=None)
    result = strategy.start(grid=LocalGrid(nodes), initial_arrays=arrays, num_rounds=1)
    assert dict(strategy.failures[1]) == {"4": "array 'bn.num_batches': dtype float64 differs from the sent dtype int64"}
    updates = {n: {k: v for k, v in u.items() if k in SHAPES} for n, u in updates_of(strategy.strategy, 1).items()}
    assert sorted(updates) == sorted(pid(n) for n in (1, 2, 3))
    assert strategy.rewards[1] == score_updates(updates, seed=strategy.round_seed(1)).rewards
    assert result.arrays["bn.num_batches"].numpy().tolist() == [7]


def declaring(kind: str, name: str):
    """A numpy node whose replies declare the participant ``name`` (as a node config ``participant`` would)."""
    from kfca_llm.flower import declare_participant

    answer = numpy_node(kind)

    def reply(message):
        out = answer(message)
        declare_participant(out.content, {"participant": name})
        return out

    return reply


def test_declared_identities_keep_a_restarted_nodes_balance_and_refuse_a_second_claimant(tmp_path):
    """Nodes 1-4 declare org-1..org-4; node 9 claims org-1 as well. Round 2: org-1's SuperNode restarted and
    replies from node 11. Round 3: the impostor's reply arrives first, but org-1 was last paid from node 11."""
    ledger = tmp_path / "rewards.sqlite"
    nodes = {n: declaring("honest" if n != 4 else "flip", f"org-{n}") for n in (1, 2, 3, 4)}
    impostor, restarted = declaring("honest", "org-1"), declaring("honest", "org-1")
    rounds = [{**nodes, 9: impostor},                                              # node 1 replies first
              {11: restarted, **{n: nodes[n] for n in (2, 3, 4)}, 9: impostor},  # node 1 is gone
              {9: impostor, **{n: nodes[n] for n in (2, 3, 4)}, 11: restarted}]  # the impostor replies first
    paid_from, refused = [], []
    for t, grid_nodes in enumerate(rounds, start=1):
        strategy = KFCAStrategy(FedAvg(fraction_evaluate=0.0), ledger=ledger, identity="declared", resume=t > 1)
        strategy.start(grid=LocalGrid(grid_nodes), initial_arrays=initial_arrays(), num_rounds=1)
        assert sorted(strategy.rewards[t]) == [f"name:org-{n}" for n in (1, 2, 3, 4)]
        paid_from.append(strategy.node_ids[t]["name:org-1"])
        refused += [(t, node) for node, reason in strategy.failures[t] if "a second live node claiming it" in reason]
    assert paid_from == ["1", "11", "11"] and refused == [(1, "9"), (2, "9"), (3, "9")]
    contents = read_ledger(ledger)
    assert len({r.run_id for r in contents.rounds}) == 1  # one run, resumed twice
    nodes_used = {}
    for row in contents.rewards:
        nodes_used.setdefault(row.participant, []).append(row.node_id)
    assert nodes_used["name:org-1"] == ["1", "11", "11"] and nodes_used["name:org-2"] == ["2"] * 3
    assert contents.totals()["name:org-1"] == sum(r.reward for r in contents.rewards if r.participant == "name:org-1")
    assert {p.participant: p.first_node_id for p in contents.participants}["name:org-1"] == "1"
    # Undeclared replies have no identity under "declared": refused, never paid.
    strategy = KFCAStrategy(FedAvg(fraction_evaluate=0.0), ledger=None, identity="declared")
    strategy.start(grid=LocalGrid({**nodes, 5: numpy_node("honest")}), initial_arrays=initial_arrays(), num_rounds=1)
    assert "no participant identity" in dict(strategy.failures[1])["5"] and len(strategy.rewards[1]) == 4


def test_public_key_identities_refuse_a_name_pinned_to_another_key(tmp_path):
    ledger = tmp_path / "rewards.sqlite"
    nodes = {n: declaring("honest", f"org-{n}") for n in (1, 2, 3)}
    first = KFCAStrategy(FedAvg(fraction_evaluate=0.0), ledger=ledger, identity="public-key")
    first.start(grid=LocalGrid(nodes), initial_arrays=initial_arrays(), num_rounds=1)
    assert {p.participant: p.label for p in read_ledger(ledger).participants} == {pid(n): f"org-{n}" for n in nodes}
    # Node 7, another key, declares org-1: the name is pinned to node 1's key.
    later = KFCAStrategy(FedAvg(fraction_evaluate=0.0), ledger=ledger, identity="public-key", resume=True)
    later.start(grid=LocalGrid({**nodes, 7: declaring("honest", "org-1")}), initial_arrays=initial_arrays(),
                num_rounds=1)
    assert "pinned on first sight" in dict(later.failures[2])["7"] and pid(7) not in later.rewards[2]
