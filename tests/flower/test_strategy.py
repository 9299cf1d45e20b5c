"""KFCAStrategy driven through Flower's own Strategy.start with an in-process grid (no simulation engine).

The nodes are plain numpy models (the strategy must work for any Flower app, not only LLM adapters).
"""

import re

import numpy as np
import pytest

pytest.importorskip("flwr", reason="Flower is the optional extra kfca-llm[flower] (make install installs it)")

from flwr.serverapp.strategy import Strategy  # noqa: E402
from flower_local import SHAPES, honest_update, num_examples, numpy_node, pid, public_steps  # noqa: E402
from flower_strategy_runs import KINDS, run, updates_of  # noqa: E402

from kfca_llm import InputError, score_updates  # noqa: E402
from kfca_llm.flower import KFCAStrategy, read_ledger, update_sha256  # noqa: E402


def fedavg_by_hand(replies, weights):
    total = sum(weights)
    return {k: sum(m.content["arrays"][k].numpy() * (w / total) for m, w in zip(replies, weights)) for k in SHAPES}


@pytest.fixture(scope="module")
def mixed_run(tmp_path_factory):
    ledger = tmp_path_factory.mktemp("ledger") / "rewards.sqlite"
    strategy, inner, result = run({n: numpy_node(k) for n, k in KINDS.items()}, ledger=ledger)
    return strategy, inner, result, ledger


def test_rewards_equal_score_updates_bit_for_bit(mixed_run):
    """Round 2 is conditioned on the global's step between the arrays sent in rounds 1 and 2 (engine.public), as
    score_updates conditions it given that step; round 1 has nothing public yet."""
    strategy, inner, _, _ = mixed_run
    assert sorted(strategy.rewards) == [1, 2]
    for server_round in (1, 2):
        expected = score_updates(updates_of(inner, server_round), seed=strategy.round_seed(server_round),
                                 public=public_steps(inner.sent, server_round))
        assert strategy.rewards[server_round] == expected.rewards
        assert strategy.reports[server_round].pairwise == expected.pairwise
    assert "public_steps" not in strategy.reports[1].tasks and strategy.reports[2].tasks["public_steps"] == 1
    assert strategy.round_seed(1) != strategy.round_seed(2)


def test_flip_negative_zero_about_zero_honest_positive(mixed_run):
    strategy = mixed_run[0]
    for rewards in strategy.rewards.values():
        assert all(rewards[pid(n)] > 0.01 for n in (1, 2, 3))
        assert rewards[pid(4)] < -0.1
        assert abs(rewards[pid(5)]) < 0.02


def test_rewards_in_train_metrics(mixed_run):
    strategy, _, result, _ = mixed_run
    for server_round, rewards in strategy.rewards.items():
        metrics = result.train_metrics_clientapp[server_round]
        assert {k: v for k, v in metrics.items() if k.startswith("kfca.reward.")} == {
            f"kfca.reward.{n}": r for n, r in rewards.items()}
        assert metrics["kfca.scored"] == 1 and metrics["kfca.failed-replies"] == 0


def test_ledger_rows_match_rewards_and_sign_digests(mixed_run):
    strategy, inner, _, ledger = mixed_run
    contents = read_ledger(ledger)
    assert [(r.round, r.status) for r in contents.rounds] == [(1, "scored"), (2, "scored")]
    assert contents.failures == []
    for server_round in (1, 2):
        rows = {r.participant: r for r in contents.rewards if r.round == server_round}
        assert {n: r.reward for n, r in rows.items()} == strategy.rewards[server_round]
        updates = updates_of(inner, server_round)
        for who, row in rows.items():
            assert who == pid(int(row.node_id))
            assert row.sign_sha256 == update_sha256(updates[who])
            assert row.num_examples == num_examples(int(row.node_id))
            assert row.peers == tuple(sorted(set(rows) - {who}))
            assert row.run_id == strategy.run_id
        (round_row,) = [r for r in contents.rounds if r.round == server_round]
        assert round_row.seed == strategy.round_seed(server_round) and round_row.settings["penalty"] == "expected"
    digests = {r.sign_sha256 for r in contents.rewards if r.round == 1}
    assert len(digests) == 5  # every node's report differs (the zero node's is all non-negative)
    assert contents.totals() == pytest.approx(
        {n: strategy.rewards[1][n] + strategy.rewards[2][n] for n in strategy.rewards[1]}, rel=1e-12)


def test_aggregation_all_hands_every_reply_to_the_wrapped_strategy(mixed_run):
    strategy, inner, result, _ = mixed_run
    last = inner.received[2]
    assert sorted(m.metadata.src_node_id for m in last) == sorted(KINDS)
    expected = fedavg_by_hand(last, [num_examples(m.metadata.src_node_id) for m in last])
    for k in SHAPES:
        np.testing.assert_allclose(result.arrays[k].numpy(), expected[k], rtol=1e-6, atol=1e-7)


def test_exclude_negative_keeps_the_flip_node_out_of_the_global_arrays():
    strategy, inner, result = run({n: numpy_node(k) for n, k in KINDS.items()}, rounds=1,
                                  aggregation="exclude-negative")
    rewards = strategy.rewards[1]
    kept = sorted(m.metadata.src_node_id for m in inner.received[1])
    assert kept == sorted(int(strategy.node_ids[1][p]) for p, r in rewards.items() if r >= 0)
    assert 4 not in kept and {1, 2, 3} <= set(kept)
    expected = fedavg_by_hand(inner.received[1], [num_examples(m.metadata.src_node_id) for m in inner.received[1]])
    sent = inner.sent[1]
    for k in SHAPES:
        np.testing.assert_allclose(result.arrays[k].numpy(), expected[k], rtol=1e-6, atol=1e-7)
        # With the flip node (weight 40 of 150) averaged in, the step would shrink visibly.
        honest_step = np.mean([honest_update(n, 1)[k] for n in (1, 2, 3)], axis=0)
        assert np.corrcoef((result.arrays[k].numpy() - sent[k]).ravel(), honest_step.ravel())[0, 1] > 0.9


def test_reward_weighted_scales_the_weight_key_by_positive_reward():
    strategy, inner, result = run({n: numpy_node(k) for n, k in KINDS.items()}, rounds=1,
                                  aggregation="reward-weighted")
    rewards = strategy.rewards[1]
    handed = inner.received[1]
    weights = [m.content["metrics"]["num-examples"] for m in handed]
    assert weights == [num_examples(m.metadata.src_node_id) * max(rewards[pid(m.metadata.src_node_id)], 0.0)
                       for m in handed]
    # A reply paid <= 0 drops out (weight 0), so robust wrapped strategies (median, Krum) never see it.
    assert rewards[pid(4)] <= 0.0 and 4 not in [m.metadata.src_node_id for m in handed]
    assert all(weight > 0 for weight in weights)
    expected = fedavg_by_hand(handed, weights)
    for k in SHAPES:
        np.testing.assert_allclose(result.arrays[k].numpy(), expected[k], rtol=1e-6, atol=1e-7)


class Unweighted(Strategy):
    def configure_train(self, *a): return []
    def aggregate_train(self, *a): return None, None
    def configure_evaluate(self, *a): return []
    def aggregate_evaluate(self, *a): return None
    def summary(self): pass


@pytest.mark.parametrize("options, message", [
    ({"strategy": "FedAvg"}, "must be a Flower message-API Strategy"),
    ({"peers": 0}, "peers must be None"),
    ({"peers": True}, "peers must be None"),
    ({"peers": 1.5}, "peers must be None"),
    ({"seed": -1}, "seed must be an integer"),
    ({"penalty": "exact"}, "penalty must be one of"),
    ({"bonus_fraction": 1.0}, "bonus_fraction must lie strictly between 0 and 1"),
    ({"bonus_fraction": "0.5"}, "bonus_fraction must be a number strictly between 0 and 1"),
    ({"backend": "cuda"}, "unknown backend 'cuda'"),
    ({"ledger": 3}, "ledger must be a file path or None"),
    ({"aggregation": "median"}, "aggregation must be one of"),
    ({"duplicates": "pay"}, "duplicates must be one of"),
    ({"identity": "node-id"}, "identity must be one of"),
    ({"resume": True}, "resume needs a ledger"),
    ({"strategy": Unweighted(), "aggregation": "reward-weighted"}, "has no `weighted_by_key`"),
])
def test_odd_constructor_arguments_raise_clear_errors(options, message):
    with pytest.raises(InputError, match=re.escape(message)):
        KFCAStrategy(**{"ledger": None, **options})


def test_a_ledger_path_that_is_a_directory_or_not_sqlite_is_refused(tmp_path):
    with pytest.raises(InputError, match="not a regular file"):
        KFCAStrategy(ledger=tmp_path)
    junk = tmp_path / "junk.sqlite"
    junk.write_bytes(b"not a database at all" * 100)
    with pytest.raises(InputError, match="cannot use .* as a reward ledger"):
        KFCAStrategy(ledger=junk)


def test_two_nodes_replying_the_same_update_are_paid_nothing_and_recorded(tmp_path):
    nodes = {n: numpy_node(k) for n, k in KINDS.items()} | {6: numpy_node("honest", copy_of=1)}
    ledger = tmp_path / "rewards.sqlite"
    strategy, inner, result = run(nodes, rounds=1, ledger=ledger)
    flag = score_updates(updates_of(inner, 1), seed=strategy.round_seed(1), duplicates="flag")
    paid = strategy.rewards[1]
    assert paid[pid(1)] == paid[pid(6)] == 0.0 < flag.rewards[pid(1)]
    others = [pid(n) for n in (2, 3, 4, 5)]
    assert {n: paid[n] for n in others} == {n: flag.rewards[n] for n in others}
    assert paid[pid(2)] > 0 and result.train_metrics_clientapp[1]["kfca.copies"] == 2
    rows = {r.participant: r for r in read_ledger(ledger).rewards}
    assert {n: r.reward for n, r in rows.items()} == paid
    assert {n: r.unadjusted_reward for n, r in rows.items()} == flag.rewards
    group = tuple(sorted((pid(1), pid(6))))
    assert {n: r.duplicate_group for n, r in rows.items() if r.duplicate_group} == {pid(1): group, pid(6): group}
    # reward-weighted acts on the paid reward: the copies (and the flipper) weigh nothing, so drop out
    weighted, inner, _ = run(nodes, rounds=1, aggregation="reward-weighted")
    assert weighted.rewards[1] == paid
    weights = {m.metadata.src_node_id: m.content["metrics"]["num-examples"] for m in inner.received[1]}
    assert {1, 4, 6}.isdisjoint(weights) and weights[2] > 0
    # "flag" records the group but pays the unadjusted reward
    flagged, _, _ = run(nodes, rounds=1, duplicates="flag")
    assert flagged.rewards[1] == flag.rewards and flagged.reports[1].duplicates == flag.duplicates


V1_REWARDS = """CREATE TABLE rewards (run_id TEXT, round INTEGER, node_id TEXT, reward REAL, peers TEXT, penalty TEXT,
    seed INTEGER, categorical_world INTEGER, num_examples INTEGER, sign_sha256 TEXT);
CREATE TABLE failures (run_id TEXT, round INTEGER, node_id TEXT, reason TEXT);
CREATE TABLE rounds (run_id TEXT, round INTEGER, status TEXT, seed INTEGER, categorical_world INTEGER,
    valid_replies INTEGER, failed_replies INTEGER, recorded_at TEXT);
INSERT INTO rewards VALUES ('r', 1, '7', 0.25, '["8"]', 'expected', 3, 1, 10, 'abc');
PRAGMA user_version=1;"""


def test_a_version_1_ledger_is_read_but_not_appended_to(tmp_path):
    import sqlite3

    old = tmp_path / "v1.sqlite"
    conn = sqlite3.connect(old)
    conn.executescript(V1_REWARDS)
    conn.close()
    (row,) = read_ledger(old).rewards
    assert (row.reward, row.unadjusted_reward, row.duplicate_group, row.peers) == (0.25, 0.25, None, ("8",))
    with pytest.raises(InputError, match="schema version 1.*new ledger file"):
        KFCAStrategy(ledger=old)
