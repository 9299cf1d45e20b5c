"""Rounds KFCAStrategy cannot score are recorded as not scored, and the run goes on: fewer than two valid replies,
or replies with no informative coordinate (every update zero: two free riders sampled together)."""

import numpy as np
import pytest

pytest.importorskip("flwr", reason="Flower is the optional extra kfca-llm[flower] (make install installs it)")

from flower_local import numpy_node  # noqa: E402
from flower_strategy_runs import bad_node, run  # noqa: E402

from kfca_llm.errors import NoTasksError  # noqa: E402
from kfca_llm.flower import read_ledger  # noqa: E402


def test_fewer_than_two_valid_replies_leave_the_round_unscored(tmp_path):
    ledger = tmp_path / "rewards.sqlite"
    strategy, inner, result = run({1: numpy_node("honest"), 2: bad_node("nan")}, rounds=1, ledger=ledger,
                                  aggregation="exclude-negative")
    assert strategy.rewards == {}
    assert [m.metadata.src_node_id for m in inner.received[1]] == [1]  # aggregated as it is, unscored
    assert result.train_metrics_clientapp[1]["kfca.scored"] == 0
    contents = read_ledger(ledger)
    assert [(r.round, r.status, r.valid_replies) for r in contents.rounds] == [(1, "not-scored", 1)]
    assert contents.rewards == []
    assert any(f.node_id is None and "KFCA needs at least two" in f.reason for f in contents.failures)
    np.testing.assert_array_equal(result.arrays["dense.bias"].numpy(),
                                  inner.received[1][0].content["arrays"]["dense.bias"].numpy())


def test_a_round_of_zero_updates_is_not_scored_and_the_next_round_is(tmp_path):
    """Two free riders in one round (FlowerTune trains two a round): no coordinate is a task, so KFCA cannot form
    its bonus and penalty sets. The round is recorded as not scored, with the reason, and the run goes on."""
    ledger = tmp_path / "rewards.sqlite"
    strategy, inner, result = run({1: numpy_node("zero"), 2: numpy_node("zero")}, rounds=2, ledger=ledger,
                                  aggregation="exclude-negative")
    assert strategy.rewards == {} and sorted(inner.received) == [1, 2]
    assert [result.train_metrics_clientapp[t]["kfca.scored"] for t in (1, 2)] == [0, 0]
    contents = read_ledger(ledger)
    assert [(r.round, r.status, r.valid_replies) for r in contents.rounds] == [(1, "not-scored", 2),
                                                                              (2, "not-scored", 2)]
    assert all(any(f.node_id is None and "too few informative coordinates" in f.reason for f in contents.failures
                   if f.round == t) for t in (1, 2))
    # The same round is still an error where a caller asked for its scores directly.
    with pytest.raises(NoTasksError):
        from kfca_llm import score_updates
        score_updates({"a": {"w": np.zeros(64, dtype=np.float32)}, "b": {"w": np.zeros(64, dtype=np.float32)}})
