"""Value sketches (``fl.pool_values``, pool rule 11): the sampled coordinates, the rounding slack of a Flower round
trip, and what tells a replay from a retrain whose signs all repeat; kept through a pool's and a pending round's
arrays."""

import numpy as np
import pytest
import torch

from kfca_llm.api import pack_updates
from kfca_llm.engine.duplicates import DuplicateRule
from kfca_llm.engine.layout import Layout
from kfca_llm.fl.peer_pool import PeerPool, score_with_pool
from kfca_llm.fl.pool_close import ClosingRound, close_round
from kfca_llm.fl.pool_settle import pending_from_arrays, pending_to_arrays
from kfca_llm.fl.pool_values import VALUE_SAMPLES, replays_values, value_positions, value_sketch

SHAPES = {"a.lora_A": (8, 300), "a.lora_B": (300, 8), "b.bias": (7,)}


def random_update(seed: int, dtype=np.float32) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {k: (rng.standard_normal(s) * 1e-3).astype(dtype) for k, s in SHAPES.items()}


def test_the_samples_spread_over_every_tensor_in_layout_order():
    layout = Layout.from_shapes(SHAPES)
    positions = value_positions(layout)
    total = sum(int(np.prod(s)) for s in SHAPES.values())
    assert sum(o.size for _, o in positions) == VALUE_SAMPLES < total
    flat = np.concatenate([o + sum(slot.numel for slot in layout.slots[:[s.name for s in layout.slots].index(name)])
                           for name, o in positions])
    assert np.array_equal(flat, np.arange(VALUE_SAMPLES) * total // VALUE_SAMPLES)
    small = Layout.from_shapes({"w": (5, 3)})  # fewer coordinates than samples: every one
    assert [(n, o.tolist()) for n, o in value_positions(small)] == [("w", list(range(15)))]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_a_torch_update_sketches_as_its_numpy_values(dtype):
    layout = Layout.from_shapes(SHAPES)
    update = {k: torch.from_numpy(v.astype(np.float64)).to(dtype) for k, v in random_update(3).items()}
    as_numpy = {k: v.to(torch.float64).numpy() for k, v in update.items()}
    sketch = value_sketch(update, layout)
    assert sketch.shape == (2, VALUE_SAMPLES) and sketch.dtype == np.float64
    assert np.array_equal(sketch, value_sketch(as_numpy, layout)) and not sketch[1].any()
    assert np.count_nonzero(sketch[0]) > VALUE_SAMPLES // 2


def round_trip(update: dict[str, np.ndarray], seed: int):
    """(update the server recovers, sketch) when a client returns ``global + update`` for a random global of the
    update's dtype."""
    rng = np.random.default_rng(seed)
    sent = {k: rng.uniform(-0.5, 0.5, u.shape).astype(u.dtype) for k, u in update.items()}
    returned = {k: sent[k] + update[k] for k in update}
    recovered = {k: returned[k] - sent[k] for k in update}
    return recovered, value_sketch(recovered, Layout.from_shapes(SHAPES), sent, returned)


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64])
def test_a_replay_through_two_round_trips_matches_a_retrain_with_the_same_signs_does_not(dtype):
    update = random_update(5, dtype)
    first, earlier = round_trip(update, 1)
    again, replay = round_trip(update, 2)
    # the round trip changed the bytes (another global rounds otherwise), so a byte digest would miss the replay
    assert any(not np.array_equal(first[k], again[k]) for k in update)
    assert replays_values(replay, earlier)
    # an honest retrain: the same signs, values 1% apart (Flower's app: 13%, the learning rates' ratio). Where the
    # adapter travels in float16, an update of a few of the global's spacings is rounded away by the round trip: the
    # retrain reads as a replay there (docs/few-peers.md, "Where its guarantees stop")
    rng = np.random.default_rng(9)
    retrained = {k: u * rng.uniform(0.99, 1.01, u.shape).astype(dtype) for k, u in update.items()}
    _, retrain = round_trip(retrained, 2)
    assert all(np.array_equal(np.signbit(retrained[k]), np.signbit(update[k])) for k in update)
    assert replays_values(retrain, earlier) == (dtype == np.float16)
    # the slack is a few spacings of the global: a value moved by 3 of them at one sampled coordinate is no replay
    nudged = replay.copy()
    nudged[0, 10] += 3 * (replay[1, 10] + earlier[1, 10])
    assert not replays_values(nudged, earlier)
    # without the slack (exact updates) only equal values match
    exact = value_sketch(update, Layout.from_shapes(SHAPES))
    assert replays_values(exact, exact.copy()) and not replays_values(exact, replay * [[1.0], [0.0]])


def test_a_missing_sketch_leaves_the_signs_to_decide_and_another_layout_never_matches():
    sketch = value_sketch(random_update(1), Layout.from_shapes(SHAPES))
    assert replays_values(None, sketch) and replays_values(sketch, None)
    assert not replays_values(sketch, sketch[:, :10])
    nan = sketch.copy()
    nan[0, 0] = np.nan  # a hostile store's value: never a match, never an error
    assert not replays_values(nan, sketch)


def test_the_sketches_survive_a_pools_and_a_pending_rounds_arrays():
    pool = PeerPool()
    updates = {"c0": random_update(1), "c1": random_update(2)}
    updates["c1"] = {k: -v for k, v in updates["c0"].items()}  # they disagree: round 1 is undetermined
    packer = pack_updates(updates)
    values = {c: value_sketch(u, packer.layout) for c, u in updates.items()}
    scored = score_with_pool(packer, pool, 1, seed=1, values=values)
    close_round(pool, ClosingRound.scored(packer, 1, scored, words=packer.words(), participants=["c0", "c1"], seed=1,
                                          penalty="expected", bonus_fraction=0.5, duplicates="zero",
                                          duplicate_rule=DuplicateRule(), values=values))
    again = PeerPool.from_arrays(pool.settings, *pool.to_arrays())
    assert all(np.array_equal(again.values_of(f"{c}@1"), values[c]) for c in values)
    assert set(pool.pending) == {1} and set(pool.pending[1].values) == {"c0", "c1"}
    arrays, records = pending_to_arrays(pool)
    (back,) = pending_from_arrays(arrays, records).values()
    assert all(np.array_equal(back.values[c], values[c]) for c in values)


def test_sketches_are_judged_only_under_the_static_orders_limit_with_the_pool_on():
    from kfca_llm.fl.pool_store import PoolSettings

    assert PoolSettings().judges_values
    assert not PoolSettings(own_replay_limit=0.02).judges_values  # a dynamic order: 2% of the signs decide
    assert not PoolSettings(min_peers=0).judges_values  # no pool
