"""The integer contract: every float of a reward computed from the counts, the same way for one pair or many."""

from __future__ import annotations

import numpy as np
from helpers import counter_words

from kfca_llm.engine.stats import (RoundCounts, delta_from_joint, deltas_from_joints, joint_tables, pair_payment,
                                   pair_payments)
from kfca_llm.kernels.pair_counts.reference import binary_gram
from kfca_llm.kernels.sampled_penalty.reference import sampled_matches


def test_vectorised_payments_and_deltas_equal_the_per_pair_ones():
    signs, task = counter_words(6, 900)
    pairs = np.array([(i, j) for i in range(6) for j in range(6) if i != j])
    counts = RoundCounts(*binary_gram(signs, task, 9, 0.4))
    matches = sampled_matches(signs, task, 9, 0.4, pairs)
    for sampled in (None, matches):
        payment, bonus, penalty = pair_payments(counts, pairs, sampled)
        for k, (i, j) in enumerate(pairs):
            one = pair_payment(counts, i, j, None if sampled is None else int(sampled[k]))
            assert (payment[k], bonus[k], penalty[k]) == (one.payment, one.bonus_agreement, one.penalty_agreement)
    joints = joint_tables(counts, pairs)
    rng = np.random.default_rng(0)
    tables = np.concatenate([joints, rng.integers(0, 1000, size=(5, 2, 2))])
    for k, (i, j) in enumerate(pairs):
        np.testing.assert_array_equal(joints[k], counts.joint_counts(i, j))
    labelled = rng.integers(0, 50, size=(7, 10, 10))  # KFCA-D's L x L tables too
    for stack in (tables, labelled):
        batch = deltas_from_joints(stack)
        for table, delta in zip(stack, batch):
            assert delta.tobytes() == delta_from_joint(table).tobytes()
            p = table / table.sum()  # the definition: P(a, b) - P(a) P(b), rows a, columns b
            np.testing.assert_allclose(delta, p - np.outer(p.sum(axis=1), p.sum(axis=0)), rtol=0, atol=1e-15)
