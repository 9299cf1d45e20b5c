"""``KFCAStrategy``'s public trajectory (``flower.round_scoring.PublicTrajectory``): the steps between the newest
globals sent, each node's reception gap, and the global a node was last sent kept until it returns, so a gap longer
than the steps is the change since that global (what a free rider back after many rounds replays)."""

import numpy as np
import pytest

pytest.importorskip("flwr", reason="Flower is the optional extra kfca-llm[flower] (make install installs it)")

from flwr.app import Array, ArrayRecord  # noqa: E402

from kfca_llm.engine.public import PublicConditioning  # noqa: E402
from kfca_llm.flower.round_scoring import PublicTrajectory  # noqa: E402

SHAPES = {"a.lora_A": (3, 5), "b.lora_B": (7,)}


def globals_(n: int, seed: int = 0) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [{k: rng.normal(size=s).astype(np.float32) for k, s in SHAPES.items()} for _ in range(n)]


def record(arrays: dict[str, np.ndarray]) -> ArrayRecord:
    return ArrayRecord({k: Array(v) for k, v in arrays.items()} | {"step": Array(np.array([7], dtype=np.int64))})


def test_the_steps_are_the_differences_of_the_newest_globals_and_integers_are_left_out():
    sent = globals_(20)
    trajectory = PublicTrajectory(PublicConditioning(steps=3, magnitude_buckets=1))  # spans up to 4 steps
    for g in sent:
        trajectory.sent(record(g), [])
    steps = trajectory.steps(SHAPES)
    assert len(steps) == 4 and set(steps[0]) == set(SHAPES)
    for step, (old, new) in zip(steps, zip(sent[-5:], sent[-4:])):
        for k in SHAPES:
            np.testing.assert_array_equal(step[k], new[k] - old[k])
    assert trajectory.steps({"a.lora_A": (3, 5)}) == []  # not the layout of the globals sent


def test_a_node_back_after_more_rounds_than_the_steps_gets_the_change_since_its_global():
    sent = globals_(40)
    trajectory = PublicTrajectory(PublicConditioning(steps=5, magnitude_buckets=2))  # 16 steps
    for t, g in enumerate(sent, start=1):
        trajectory.sent(record(g), {1: [1, 2], 5: [2], 20: [3], 30: [1, 3], 38: [2, 3]}.get(t, [4]))
        if t == 30:  # node 1 back after 29 rounds, node 3 after 10 (within the steps: no change of its own)
            assert trajectory.gaps([1, 3, 4]) == [10, 29]  # node 4 was not sent this round's global
            changes = trajectory.changes([1, 3, 4])
            assert set(changes) == {29}
            for k in SHAPES:
                np.testing.assert_array_equal(changes[29][k], sent[29][k] - sent[0][k])
        if t == 38:  # node 2 back after 33 rounds
            assert set(trajectory.changes([2, 3])) == {33}
    # Every node was last sent one of the newest 17 globals: nothing older is kept.
    assert len(trajectory._globals) == 17


def test_the_globals_kept_for_returning_nodes_are_bounded_and_the_oldest_gap_is_clipped():
    conditioning = PublicConditioning(steps=3, magnitude_buckets=1)  # 4 steps: at most 4 such globals kept
    sent = globals_(30)
    trajectory = PublicTrajectory(conditioning)
    for t, g in enumerate(sent, start=1):
        nodes = [t] if t <= 8 else [100]  # nodes 1..8 each sent one global, then only node 100
        trajectory.sent(record(g), nodes)
        assert len(trajectory._globals) <= 2 * conditioning.history + 1
    trajectory.sent(record(globals_(1, seed=1)[0]), [1, 8])
    assert trajectory.gaps([1, 8]) == [23, 30]
    assert set(trajectory.changes([1, 8])) == {23}  # node 8's global kept (among the newest 4), node 1's dropped


def test_a_global_of_another_layout_starts_the_trajectory_again():
    trajectory = PublicTrajectory(PublicConditioning(steps=3, magnitude_buckets=1))
    for g in globals_(6):
        trajectory.sent(record(g), [1])
    other = {"a.lora_A": np.zeros((4, 5), dtype=np.float32)}
    trajectory.sent(record(other), [1])
    assert trajectory.gaps([1]) == [] and trajectory.steps({"a.lora_A": (4, 5)}) == []
    trajectory.sent(record({"a.lora_A": np.ones((4, 5), dtype=np.float32)}), [1])
    assert trajectory.gaps([1]) == [1] and len(trajectory.steps({"a.lora_A": (4, 5)})) == 1
