"""Settling undetermined rounds later (``kfca_llm.fl.pool_settle``): a round-1 pair of an honest client and a flipper
(nothing tells them apart then) is scored again once the rounds after it exist, on the pool on both sides of it.

Two clients a round of 20; updates as in test_peer_pool.py (a persistent direction, a per-round one, own noise).
"""

import numpy as np
import pytest
from test_peer_pool import SHAPE, round_updates

from kfca_llm.api import pack_updates
from kfca_llm.engine.duplicates import DuplicateRule
from kfca_llm.errors import InputError
from kfca_llm.fl.peer_pool import PeerPool, PoolSettings, score_with_pool
from kfca_llm.fl.pool_close import ClosingRound, close_round
from kfca_llm.fl.pool_policy import record
from kfca_llm.fl.pool_settle import pending_from_arrays, pending_to_arrays
from kfca_llm.packer import SignPacker

# Round t trains clients (2t - 2) % 20 and (2t - 1) % 20; client 1 flips. Round 1: clients 0 and 1.
FLIPPER = 1


def pair(t: int) -> tuple[int, int]:
    return (2 * t - 2) % 20, (2 * t - 1) % 20


def close(pool, packer, t, scored, *, participants, owners=None):
    """``close_round`` with the default scoring settings (seed t, as each round here is scored)."""
    return close_round(pool, ClosingRound.scored(packer, t, scored, words=packer.words(), participants=participants,
                                                 seed=t, penalty="expected", bonus_fraction=0.5, duplicates="zero",
                                                 duplicate_rule=DuplicateRule(), owners=owners))


def run(rounds: int, settings: PoolSettings = PoolSettings()):
    """Each round scored with the pool, added, kept pending where undetermined, then settled where due."""
    pool, paid, settled, candidates = PeerPool(settings), {}, [], {}
    for t in range(1, rounds + 1):
        packer = pack_updates(round_updates(t, pair(t), {FLIPPER: "flip"}))
        scored = score_with_pool(packer, pool, t, seed=t)
        paid[t] = dict(scored.report.rewards)
        done = close(pool, packer, t, scored, participants=packer.clients)
        settled += done
        for s in done:
            paid[s.round][s.participant] = s.reward
        candidates[t] = ([e.name for e in pool.candidates(t + 1, "c19", [])],
                         {c: record(pool, c, t + 1) for c in ("c00", "c01")})
    return pool, paid, settled, candidates


@pytest.fixture(scope="module")
def settled_run():
    return run(14)


def test_round_one_is_settled_later_the_honest_client_paid_more_than_zero_and_the_flipper(settled_run):
    pool, paid, settled, _ = settled_run
    first = {s.participant: s for s in settled if s.round == 1}
    assert sorted(first) == ["c00", "c01"]
    assert first["c00"].reward > 0 > first["c01"].reward
    assert paid[1] == {"c00": first["c00"].reward, "c01": first["c01"].reward}
    # Its pool peers lie on both sides of round 1 (only later rounds exist), nearest first, never its own round.
    rounds = [int(p.rpartition("@")[2]) for p in first["c00"].peers if "@" in p]
    assert rounds == sorted(rounds) and min(rounds) == 2 and first["c00"].peers[0] == "c01"
    assert not pool.pending


def test_settlement_waits_for_the_warm_pool_and_the_window_ends_the_wait(settled_run):
    _, _, settled, _ = settled_run
    # pool_peers = 8 distinct pool participants, two new ones a round, the round-1 pair excluded: round 5 at the
    # earliest (rounds 2-5 hold 8 other participants).
    assert min(s.settled_in for s in settled if s.round == 1) >= 5
    # A pool that never warms up (pool_peers above the federation's size) settles at the window's last round.
    _, _, late, _ = run(12, PoolSettings(window=6, pool_peers=30))
    assert {s.settled_in - s.round for s in late} == {6}


def test_a_settled_entry_is_vetted_by_its_settled_score(settled_run):
    """Round 1 scored both clients < 0 (their one pair disagrees): no one's pool peer, and a record below zero; once
    settled, the honest client's entry carries its settled score (> 0: a peer again), the flipper's still < 0."""
    _, _, settled, seen = settled_run
    at = min(s.settled_in for s in settled if s.round == 1)
    before, after = seen[at - 1][1], seen[at][1]
    assert before["c00"] < 0 and before["c01"] < 0
    assert next(s.unadjusted_reward for s in settled if s.participant == "c00") > 0 > after["c01"]
    assert after["c00"] == pytest.approx(2 / 3 - 0.5)  # one submission scored > 0: Beta(2, 1)'s mean less 1/2
    assert "c00@1" not in seen[at - 1][0]


def test_a_later_submission_matching_a_settled_one_does_not_make_it_a_copy():
    """Copies are judged as they were in the settled round: a later entry matching it copied it, not the reverse."""
    pool = PeerPool()
    first = round_updates(1, (0, 1), {1: "flip"})
    packer = pack_updates(first)
    scored = score_with_pool(packer, pool, 1, seed=1)
    signs, _ = packer.words()
    pool.add_round(1, {c: signs[k] for k, c in enumerate(packer.clients)}, scored.report.unadjusted_rewards)
    for t in range(2, 8):  # round 2 holds c00's round-1 update again, under another name (not caught then)
        updates = round_updates(t, pair(t))
        if t == 2:
            updates["c02"] = first["c00"]
        later = pack_updates(updates)
        words, _ = later.words()
        pool.add_round(t, {c: words[k] for k, c in enumerate(later.clients)}, {c: 0.1 for c in later.clients})
    settled = score_with_pool(packer, pool, 1, seed=1, horizon=7)
    assert "c02@2" in {p for ps in settled.pool_peers.values() for p in ps}
    assert not settled.pool_copies and not settled.report.duplicates


def test_pending_rounds_survive_their_arrays_and_a_misshapen_record_is_refused(settled_run):
    pool = PeerPool()
    updates = round_updates(1, (0, 1), {1: "flip"})
    updates["c00/flip"] = {"w": -updates["c00"]["w"]}  # the attack analysis' side-by-side submission of c00
    packer = pack_updates(updates)
    owners = {"c00/flip": "c00"}
    scored = score_with_pool(packer, pool, 1, seed=1, copy_candidates=["c00", "c01"], owners=owners,
                             pairs=[("c00", "c01"), ("c01", "c00"), ("c00/flip", "c01")])
    assert close(pool, packer, 1, scored, participants=["c00", "c01"], owners=owners) == []
    arrays, records = pending_to_arrays(pool)
    (back,) = pending_from_arrays(arrays, records).values()
    kept = pool.pending[1]
    assert back.metadata() == kept.metadata() and back.waiting == ("c00", "c00/flip", "c01")
    assert back.owners == owners and back.pairs == (("c00", "c01"), ("c00/flip", "c01"), ("c01", "c00"))
    assert all(np.array_equal(back.words[c], kept.words[c]) for c in kept.words)
    assert np.array_equal(back.task, kept.task)
    bad = records.replace('"shapes": [["w", [48, 64]]]', '"shapes": [["w", [48, -64]]]')
    assert bad != records
    with pytest.raises(InputError):
        pending_from_arrays(arrays, bad)


def test_a_packer_from_words_scores_as_the_packer_that_made_them():
    packer = pack_updates(round_updates(3, (4, 5, 6)))
    signs, task = packer.words()
    again = SignPacker.from_words({"w": SHAPE}, {c: signs[k] for k, c in enumerate(packer.clients)}, task)
    assert again.score(seed=3).rewards == packer.score(seed=3).rewards
    with pytest.raises(InputError, match="c04"):
        SignPacker.from_words({"w": SHAPE}, {"c04": signs[0][:-1], "c05": signs[1]}, task)
