"""Categorical MTPP library: delta matrices, score matrices, payments, and agreement with the engine."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from kfca_llm.engine.stats import RoundCounts, delta_from_joint, pair_payment
from kfca_llm.errors import InputError
from kfca_llm.mechanism import (
    ca_score_matrix,
    categorical_world,
    delta_matrix,
    expected_reward,
    kfca_score_matrix,
    mtpp_payment,
)
from kfca_llm.kernels.pair_counts.reference import binary_gram
from kfca_llm.kernels.sampled_penalty.reference import sampled_matches
from kfca_llm.kernels.sign_pack.reference import pack_signs
from kfca_llm.partition import partition_classes, task_partition
from kfca_llm.theory import signal_delta

FAST = settings(max_examples=25, deadline=None)


def noisy_identity(num_labels: int, error: float) -> np.ndarray:
    c = np.full((num_labels, num_labels), error / (num_labels - 1))
    np.fill_diagonal(c, 1.0 - error)
    return c


# ---------------------------------------------------------------- delta matrix / categorical world

def test_delta_matrix_hand_example():
    r1 = np.array([0, 0, 1, 1, 2])
    r2 = np.array([0, 1, 1, 1, 2])
    # joint: (0,0)=.2 (0,1)=.2 (1,1)=.4 (2,2)=.2; marginals P1=(.4,.4,.2), P2=(.2,.6,.2)
    expected = np.array([
        [0.2 - 0.4 * 0.2, 0.2 - 0.4 * 0.6, 0.0 - 0.4 * 0.2],
        [0.0 - 0.4 * 0.2, 0.4 - 0.4 * 0.6, 0.0 - 0.4 * 0.2],
        [0.0 - 0.2 * 0.2, 0.0 - 0.2 * 0.6, 0.2 - 0.2 * 0.2],
    ])
    d = delta_matrix(r1, r2, 3)
    assert d.shape == (3, 3) and d.dtype == np.float64
    np.testing.assert_allclose(d, expected, atol=1e-15)
    assert categorical_world(d)


@FAST
@given(num_labels=st.integers(2, 5), m=st.integers(1, 60), seed=st.integers(0, 2**32 - 1))
def test_delta_matrix_properties(num_labels, m, seed):
    rng = np.random.default_rng(seed)
    r1 = rng.integers(0, num_labels, m)
    r2 = rng.integers(0, num_labels, m)
    d = delta_matrix(r1, r2, num_labels)
    np.testing.assert_allclose(d.sum(axis=0), 0.0, atol=1e-12)
    np.testing.assert_allclose(d.sum(axis=1), 0.0, atol=1e-12)
    # direct, task-by-task reading of Definition 2.2
    for a, b in itertools.product(range(num_labels), repeat=2):
        direct = np.mean((r1 == a) & (r2 == b)) - np.mean(r1 == a) * np.mean(r2 == b)
        assert d[a, b] == pytest.approx(direct, abs=1e-12)
    np.testing.assert_allclose(delta_matrix(r2, r1, num_labels), d.T, atol=1e-15)


def test_categorical_world_cases():
    assert categorical_world(signal_delta(np.array([0.5, 0.3, 0.2]), noisy_identity(3, 0.3), noisy_identity(3, 0.2)))
    # the label-flipped pair of the paper's worked example: sign pattern inverted
    assert not categorical_world([[-0.25, 0.25], [0.25, -0.25]])
    # strict inequalities: a zero off-diagonal entry (labels 1 and 2 independent) is not categorical
    assert not categorical_world([[0.2, -0.1, -0.1], [-0.1, 0.1, 0.0], [-0.1, 0.0, 0.1]])
    # a zero diagonal entry neither
    assert not categorical_world([[0.0, 0.0], [0.0, 0.0]])


def test_score_matrices():
    np.testing.assert_array_equal(kfca_score_matrix(3), np.eye(3))
    d = np.array([[0.1, -0.1], [-0.1, 0.1]])
    np.testing.assert_array_equal(ca_score_matrix(d), np.eye(2))
    np.testing.assert_array_equal(ca_score_matrix(-d), 1.0 - np.eye(2))
    np.testing.assert_array_equal(ca_score_matrix(np.zeros((2, 2))), np.zeros((2, 2)))


# ---------------------------------------------------------------- the paper's worked CA example

def test_worked_label_flip_example():
    truthful = np.array([1, 0, 1, 0, 1, 0])
    flipped = 1 - truthful
    identity = np.arange(2)

    d_flip = delta_matrix(truthful, flipped, 2)
    np.testing.assert_allclose(d_flip, [[-0.25, 0.25], [0.25, -0.25]], atol=1e-15)
    d_truth = delta_matrix(truthful, truthful, 2)

    # CA with delta estimated from the reports pays the flipped pair exactly what it pays a truthful one
    ca_flip = expected_reward(d_flip, identity, identity, ca_score_matrix(d_flip))
    ca_truth = expected_reward(d_truth, identity, identity, ca_score_matrix(d_truth))
    assert ca_flip == pytest.approx(0.5, abs=1e-15)
    assert ca_flip == ca_truth
    # KFCA pays agreement only: the flipper is penalised, the truthful pair is not
    assert expected_reward(d_flip, identity, identity, kfca_score_matrix(2)) == pytest.approx(-0.5, abs=1e-15)
    assert expected_reward(d_truth, identity, identity, kfca_score_matrix(2)) == pytest.approx(0.5, abs=1e-15)

    # the same through the MTPP payment on many repetitions of the six tasks
    r_truth, r_flip = np.tile(truthful, 500), np.tile(flipped, 500)
    for mode in ("expected", "sampled"):
        pay = {
            name: mtpp_payment(r_truth, r, score(delta_matrix(r_truth, r, 2)), seed=7, penalty=mode)
            for name, r, score in (("ca_truth", r_truth, ca_score_matrix), ("ca_flip", r_flip, ca_score_matrix),
                                   ("kfca_truth", r_truth, lambda _: kfca_score_matrix(2)),
                                   ("kfca_flip", r_flip, lambda _: kfca_score_matrix(2)))
        }
        assert pay["ca_flip"] == pay["ca_truth"] > 0
        assert pay["kfca_flip"] < 0 < pay["kfca_truth"]


@FAST
@given(num_labels=st.integers(2, 4), m=st.integers(40, 200), seed=st.integers(0, 2**32 - 1),
       mode=st.sampled_from(["expected", "sampled"]))
def test_ca_cannot_tell_a_permuted_peer_from_a_truthful_one(num_labels, m, seed, mode):
    rng = np.random.default_rng(seed)
    r = rng.integers(0, num_labels, m)
    perm = rng.permutation(num_labels)
    part = task_partition(m, seed=seed)
    assume(min(part.bonus.size, part.penalty_1.size, part.penalty_2.size) > 0)
    truth = mtpp_payment(r, r, ca_score_matrix(delta_matrix(r, r, num_labels)), seed=seed, penalty=mode)
    permuted = mtpp_payment(r, perm[r], ca_score_matrix(delta_matrix(r, perm[r], num_labels)), seed=seed, penalty=mode)
    assert permuted == truth


def test_kfca_strict_truthfulness_by_enumeration():
    # Proposition 3.3: under the categorical world, E(id, id) is the maximum over all deterministic
    # strategy pairs, attained only by shared bijections
    delta = signal_delta(np.array([0.5, 0.3, 0.2]), noisy_identity(3, 0.25), noisy_identity(3, 0.25))
    assert categorical_world(delta)
    s = kfca_score_matrix(3)
    best = expected_reward(delta, np.arange(3), np.arange(3), s)
    maps = [np.array(f) for f in itertools.product(range(3), repeat=3)]
    for f1, f2 in itertools.product(maps, repeat=2):
        e = expected_reward(delta, f1, f2, s)
        if np.array_equal(f1, f2) and np.unique(f1).size == 3:
            assert e == pytest.approx(best, abs=1e-15)
        else:
            assert e < best - 1e-6
    # uninformed (constant) reports earn exactly nothing: delta's columns sum to zero
    assert expected_reward(delta, np.zeros(3, dtype=int), np.arange(3), s) == pytest.approx(0.0, abs=1e-15)


# ---------------------------------------------------------------- partition and payments

def test_task_partition_is_the_engine_partition():
    part = task_partition(1000, seed=11, bonus_fraction=0.4)
    classes = partition_classes(np.arange(1000), 11, 0.4)
    for idx, c in ((part.bonus, 0), (part.penalty_1, 1), (part.penalty_2, 2)):
        assert idx.dtype == np.int64
        np.testing.assert_array_equal(idx, np.flatnonzero(classes == c))
    everything = np.concatenate([part.bonus, part.penalty_1, part.penalty_2])
    np.testing.assert_array_equal(np.sort(everything), np.arange(1000))
    # roughly the requested fraction of bonus tasks (binomial, 5 standard deviations)
    assert abs(part.bonus.size - 400) <= 5 * np.sqrt(1000 * 0.4 * 0.6)
    assert not np.array_equal(task_partition(1000, seed=12, bonus_fraction=0.4).bonus, part.bonus)


def test_payment_by_hand():
    # score by definition on a small case, with the partition read back from task_partition
    rng = np.random.default_rng(3)
    r1, r2 = rng.integers(0, 3, 50), rng.integers(0, 3, 50)
    s = rng.normal(size=(3, 3))
    part = task_partition(50, seed=5)
    bonus = np.mean([s[r1[k], r2[k]] for k in part.bonus])
    pen = np.mean([s[r1[p], r2[q]] for p in part.penalty_1 for q in part.penalty_2])
    assert mtpp_payment(r1, r2, s, seed=5) == pytest.approx(bonus - pen, abs=1e-12)


def test_sampled_and_expected_penalty_same_mean_lower_variance():
    rng = np.random.default_rng(20240601)
    y = rng.integers(0, 3, 2000)
    c = noisy_identity(3, 0.4)
    r1 = np.array([rng.choice(3, p=c[k]) for k in y])
    r2 = np.array([rng.choice(3, p=c[k]) for k in y])
    s = kfca_score_matrix(3)
    seeds = range(200)
    expected = np.array([mtpp_payment(r1, r2, s, seed=t) for t in seeds])
    sampled = np.array([mtpp_payment(r1, r2, s, seed=t, penalty="sampled") for t in seeds])
    # given the partition, the sampled penalty is an unbiased draw of the expected one: the paired
    # differences have mean zero; tolerance is 5 standard errors of that mean
    diff = sampled - expected
    assert abs(diff.mean()) <= 5 * diff.std(ddof=1) / np.sqrt(diff.size)
    assert diff.std() > 0
    # Rao-Blackwell: Var(sampled) = Var(expected) + E[Var(sampled | partition)]
    assert expected.var(ddof=1) < sampled.var(ddof=1)


def test_sampled_penalty_depends_on_the_pair():
    rng = np.random.default_rng(8)
    r1, r2 = rng.integers(0, 2, 3000), rng.integers(0, 2, 3000)
    s = kfca_score_matrix(2)
    a = mtpp_payment(r1, r2, s, seed=1, penalty="sampled", pair=(0, 1))
    b = mtpp_payment(r1, r2, s, seed=1, penalty="sampled", pair=(1, 0))
    assert a != b
    # the expected penalty does not draw, so the pair is irrelevant there
    assert mtpp_payment(r1, r2, s, seed=1, pair=(0, 1)) == mtpp_payment(r1, r2, s, seed=1, pair=(3, 2))


def test_determinism():
    rng = np.random.default_rng(99)
    r1, r2 = rng.integers(0, 4, 500), rng.integers(0, 4, 500)
    s = kfca_score_matrix(4)
    for mode in ("expected", "sampled"):
        first = mtpp_payment(r1, r2, s, seed=42, penalty=mode)
        assert first == mtpp_payment(r1.copy(), r2.copy(), s, seed=42, penalty=mode)
        assert mtpp_payment(r1, r2, s, seed=42, penalty=mode) != mtpp_payment(r1, r2, s, seed=43, penalty=mode)
    np.testing.assert_array_equal(task_partition(500, seed=42).penalty_2, task_partition(500, seed=42).penalty_2)


# ---------------------------------------------------------------- cross-check with the packed engine

@FAST
@given(d=st.integers(40, 400), seed=st.integers(0, 2**32 - 1), bonus_fraction=st.floats(0.2, 0.8),
       data_seed=st.integers(0, 2**32 - 1))
def test_matches_packed_engine_exactly(d, seed, bonus_fraction, data_seed):
    rng = np.random.default_rng(data_seed)
    # non-zero everywhere, so every coordinate is a task and task k = coordinate k
    x = [rng.choice([-1.0, 1.0], d) * (rng.random(d) + 0.1) for _ in range(2)]
    part = task_partition(d, seed=seed, bonus_fraction=bonus_fraction)
    assume(min(part.bonus.size, part.penalty_1.size, part.penalty_2.size) > 0)

    packed = [pack_signs(v) for v in x]
    sign_words = np.stack([neg for neg, _ in packed])
    task_words = packed[0][1] | packed[1][1]
    counts = RoundCounts(*binary_gram(sign_words, task_words, seed, bonus_fraction))
    matches = sampled_matches(sign_words, task_words, seed, bonus_fraction, np.array([[0, 1]]))

    neg1, neg2 = ((v < 0).astype(np.int64) for v in x)
    s = kfca_score_matrix(2)
    assert mtpp_payment(neg1, neg2, s, seed=seed, bonus_fraction=bonus_fraction) == pair_payment(counts, 0, 1).payment
    assert (mtpp_payment(neg1, neg2, s, seed=seed, bonus_fraction=bonus_fraction, penalty="sampled", pair=(0, 1))
            == pair_payment(counts, 0, 1, int(matches[0])).payment)
    # the engine's joint table gives the same delta matrix (its label 0 is "negative")
    np.testing.assert_array_equal(delta_matrix(1 - neg1, 1 - neg2, 2), delta_from_joint(counts.joint_counts(0, 1)))


# ---------------------------------------------------------------- bad input

@pytest.mark.parametrize("call", [
    lambda: delta_matrix([0, 1], [0], 2),                      # different lengths
    lambda: delta_matrix([], [], 2),                           # no task
    lambda: delta_matrix([0, 2], [0, 1], 2),                   # label out of range
    lambda: delta_matrix([0, -1], [0, 1], 2),                  # negative label
    lambda: delta_matrix([0.0, 1.0], [0, 1], 2),               # non-integer labels
    lambda: delta_matrix(np.array([True, False]), [0, 1], 2),  # booleans are not labels
    lambda: delta_matrix([[0, 1]], [[0, 1]], 2),               # not 1-D
    lambda: delta_matrix([0, 1], [0, 1], 1),                   # fewer than two labels
    lambda: categorical_world(np.zeros((2, 3))),
    lambda: categorical_world([[np.nan, 0], [0, 0]]),
    lambda: kfca_score_matrix(0),
    lambda: task_partition(-1),
    lambda: task_partition(10, seed=-1),
    lambda: task_partition(10, bonus_fraction=1.0),
    lambda: mtpp_payment([0, 1], [1, 1], np.eye(2)),           # two tasks cannot fill three sets
    lambda: mtpp_payment(np.zeros(100, int), np.zeros(100, int), np.eye(2), penalty="mean"),
    lambda: mtpp_payment(np.zeros(100, int), np.zeros(100, int), np.eye(2), pair=(0,)),
    lambda: mtpp_payment(np.zeros(100, int), np.zeros(100, int), np.eye(2), pair=(0, 1 << 16), penalty="sampled"),
    lambda: mtpp_payment(np.full(100, 2), np.zeros(100, int), np.eye(2)),
    lambda: expected_reward(np.zeros((2, 2)), [0, 1], [0, 2], np.eye(2)),
    lambda: expected_reward(np.zeros((2, 2)), [0, 1], [0, 1], np.eye(3)),
])
def test_bad_input_raises(call):
    with pytest.raises(InputError):
        call()


def test_empty_set_message_is_clear():
    with pytest.raises(InputError, match="too few to form non-empty bonus and penalty sets"):
        mtpp_payment([0, 1], [1, 1], np.eye(2))
