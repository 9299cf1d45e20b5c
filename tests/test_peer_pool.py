"""Peers beyond the round (``kfca_llm.fl.peer_pool``): two participants per round, one of them a deviator
(the updates: ``pool_updates``)."""

import numpy as np
import pytest

from kfca_llm import InputError, score_updates
from kfca_llm.api import pack_updates
from kfca_llm.fl.peer_pool import OWN_RESUBMISSION, PeerPool, PoolSettings, parse_pool_name, pool_name, score_with_pool
from kfca_llm.fl.reference import reference_signs
from kfca_llm.recipe import KfcaConfig

from pool_updates import PERSISTENT, SCHEDULE, SHAPE, honest, round_updates


IN_ROUND = PoolSettings(next_round=False)
"""The ranking a disagreeing pair gets in its round (pool rule 14's; under rule 15 a pair nothing else settles waits
for the round after it, and gets this ranking where that round cannot settle it): ``tests/test_pool_next.py``."""


def run_rounds(schedule, settings=PoolSettings(), deviations=None):
    """Score ``schedule`` (round -> clients) in order, keeping the pool; round -> PooledRound."""
    pool, out = PeerPool(settings), {}
    for t, clients in schedule.items():
        packer = pack_updates(round_updates(t, clients, deviations))
        out[t] = score_with_pool(packer, pool, t, seed=t)
        copies = {c for g in out[t].report.duplicates for c in g.clients}
        signs, _ = packer.words()
        pool.add_round(t, {c: signs[k] for k, c in enumerate(packer.clients) if c not in copies},
                       out[t].report.unadjusted_rewards)
    return out


def test_without_the_pool_the_honest_partner_of_a_flipper_is_paid_what_the_flipper_is():
    rewards = score_updates(round_updates(8, (1, 3), {3: "flip"}), seed=8).rewards
    assert rewards["c01"] == pytest.approx(rewards["c03"], abs=0.002) and rewards["c01"] < -0.1


def test_with_the_pool_the_honest_partner_is_paid_more_than_zero_and_more_than_the_flipper():
    scored = run_rounds(SCHEDULE, IN_ROUND, deviations={3: "flip"})
    for t, partner in ((8, "c01"), (11, "c06"), (14, "c09")):
        rewards = scored[t].report.rewards
        assert rewards[partner] > 0 > rewards["c03"], (t, rewards)
        assert scored[t].pool_peers[partner] and not scored[t].undetermined


def test_a_round_with_enough_in_round_peers_gives_todays_rewards_bit_for_bit():
    pool = PeerPool(PoolSettings(min_peers=2))
    for t in range(1, 4):
        pool.add_round(t, {f"c{c:02d}": w for c, w in zip((t, t + 10), pack_updates(round_updates(t, (t, t + 10))).words()[0])})
    assert pool.entries(4)
    for clients in ((0, 1, 2), (0, 1, 2, 3)):  # exactly min_peers in-round peers each, and more
        updates = round_updates(4, clients, {2: "flip"})
        pooled = score_with_pool(pack_updates(updates), pool, 4, seed=123)
        today = score_updates(updates, seed=123)
        assert pooled.report.rewards == today.rewards and pooled.report.pairwise == today.pairwise
        assert not pooled.used_pool and pooled.undetermined == ()


def test_min_peers_zero_turns_the_pool_off():
    scored = run_rounds(SCHEDULE, PoolSettings(min_peers=0), deviations={3: "flip"})
    assert scored[8].report.rewards == score_updates(round_updates(8, (1, 3), {3: "flip"}), seed=8).rewards
    assert not any(s.used_pool or s.undetermined for s in scored.values())


def test_a_participant_never_gets_its_own_earlier_update_nor_a_participant_of_the_round_as_a_pool_peer():
    scored = run_rounds(SCHEDULE)
    for t, s in scored.items():
        for client, names in s.pool_peers.items():
            owners = [parse_pool_name(n)[0] for n in names]
            assert client not in owners and not set(owners) & set(s.report.rewards)
            assert len(set(owners)) == len(owners)  # one entry per other participant
            assert all(t - PoolSettings().window <= parse_pool_name(n)[1] < t for n in names)


def test_the_first_two_rounds_of_two_participants_are_undetermined_and_later_rounds_are_not():
    scored = run_rounds(SCHEDULE)
    assert scored[1].undetermined == ("c02", "c03") and not scored[1].used_pool
    # Round 2 borrows round 1's entries, but the pool needs two rounds to weigh a lag: no weight, no peer yet.
    assert scored[2].undetermined == ("c04", "c05") and scored[2].lag_weights == {}
    assert all(not scored[t].undetermined for t in range(3, 15))
    narrow = run_rounds({1: (1, 2), 2: (3, 4)}, PoolSettings(min_peers=4))
    assert narrow[2].undetermined == ("c03", "c04")  # 1 in-round + 2 pool peers < 4


def test_pool_peers_are_the_most_recent_distinct_participants_and_the_window_drops_old_rounds():
    pool = PeerPool(PoolSettings(window=3, pool_peers=2))
    words = np.zeros(4, np.int32)
    for t, members in {1: ("a", "b"), 2: ("c", "a"), 3: ("d", "e"), 4: ("a", "f")}.items():
        pool.add_round(t, {m: words for m in members})
    assert [e.name for e in pool.entries(5)] == ["a@4", "f@4", "d@3", "e@3", "a@2", "c@2"]
    assert [e.name for e in pool.candidates(5, "x", exclude=["f"])] == ["a@4", "d@3"]
    assert [e.name for e in pool.candidates(5, "a", exclude=[])] == ["f@4", "d@3"]


def pool_verdict(pooled, t, client):
    """A short client's pool verdict, by hand: the weighted mean of its pool payments (signed lag weights)."""
    terms = [(pooled.lag_weights.get(t - parse_pool_name(p)[1], 0.0), v)
             for (c, p), v in pooled.report.pairwise.items() if c == client and parse_pool_name(p)]
    return sum(w * v for w, v in terms) / sum(abs(w) for w, _ in terms)


def test_an_own_resubmission_is_a_copy_scored_on_its_rounds_agreement_beside_a_pool_of_weight_zero_paid_at_most_0():
    first = honest(3, 1)
    scored = run_rounds({1: (3, 4), 2: (5, 6), 3: (3, 7)}, deviations={3: lambda t: first})  # c03 resubmits round 1's
    r3 = scored[3]
    assert [g.clients for g in r3.pool_copies] == [("c03", "c03@1")] and r3.own_resubmissions == ("c03",)
    assert r3.pool_copies[0].note == OWN_RESUBMISSION and r3.pool_copies[0] in r3.report.duplicates
    assert r3.pool_copies[0].to_dict()["note"] == "own resubmission: scored without the pool"
    # Its round's agreement (an earlier honest update agrees: > 0), beside the pool's weight at 0: what an honest
    # participant's in-round peer earns it, never the pool's support.
    alone = score_updates(round_updates(3, (3, 7), {3: lambda t: first}), seed=3)
    weight = PoolSettings().weight
    assert r3.report.unadjusted_rewards["c03"] == pytest.approx(alone.rewards["c03"] / (1 + weight), rel=1e-12)
    # A copy: paid at most 0 (its round's agreement is > 0), and the copied entry's payment charged back (this pool
    # recorded none: nothing to charge).
    assert alone.rewards["c03"] > 0.0 and r3.report.rewards["c03"] == 0.0
    assert r3.resubmitted == {"c03": ("c03@1",)} and r3.charged_back == {"c03": 0.0}
    assert r3.pool_peers["c03"] == [] and r3.report.peers["c03"] == ["c07"]
    # Its partner borrows the pool, and the resubmission counts for nothing in its reward: the pool's verdict alone.
    assert r3.pool_peers["c07"] and r3.report.rewards["c07"] == r3.report.unadjusted_rewards["c07"]
    assert r3.report.rewards["c07"] == pytest.approx(pool_verdict(r3, 3, "c07"), rel=1e-12)
    assert r3.undetermined == ()


def test_an_own_resubmission_with_many_in_round_peers_is_scored_on_its_rounds_agreement_beside_the_pools_weight():
    # 16 in-round peers, fewer than min_peers=20: short, so the pool is consulted.
    first = honest(3, 1)
    pool = PeerPool(PoolSettings(min_peers=20))
    for t, clients in {1: (3, 20), 2: (21, 22), 3: (23, 24), 4: (25, 26)}.items():
        updates = round_updates(t, clients, {3: lambda t: first})
        pool.add_round(t, dict(zip(sorted(updates), pack_updates(updates).words()[0])))
    updates = round_updates(5, (3, *range(30, 46)), {3: lambda t: first})
    pooled, alone = score_with_pool(pack_updates(updates), pool, 5, seed=5), score_updates(updates, seed=5)
    assert pooled.own_resubmissions == ("c03",) and pooled.pool_peers["c30"]
    in_round = sum(v for (c, _), v in alone.pairwise.items() if c == "c03")
    assert pooled.report.unadjusted_rewards["c03"] == pytest.approx(in_round / (16 + PoolSettings().weight), rel=1e-12)
    # 16 in-round peers and the pool's term are 17 distinct peers, fewer than min_peers, yet a copy's payment is known:
    # at most 0, never undetermined
    assert pooled.undetermined == () and pooled.report.rewards["c03"] == min(pooled.report.unadjusted_rewards["c03"], 0.0)


def test_with_a_reference_an_own_resubmission_gets_what_the_round_without_a_pool_and_with_the_reference_pays():
    first = honest(3, 1)
    updates = {t: round_updates(t, c, {3: lambda t: first}) for t, c in {1: (3, 4), 2: (5, 6), 3: (3, 7)}.items()}
    pool = PeerPool()
    for t in (1, 2):
        pool.add_round(t, dict(zip(sorted(updates[t]), pack_updates(updates[t]).words()[0])))
    packer = pack_updates(updates[3])
    reference = reference_signs(packer, honest(11, 3))
    pooled = score_with_pool(packer, pool, 3, seed=3, reference=reference, reference_weight=4.0)
    no_pool = score_with_pool(packer, None, 3, seed=3, reference=reference, reference_weight=4.0)
    assert pooled.own_resubmissions == ("c03",) and pooled.undetermined == ()
    # The round's peer (1), the reference (4) and the pool's term, 0 at the pool's weight: never the pool's support.
    pays = pooled.report.pairwise
    expected = (pays[("c03", "c07")] + 4.0 * pays[("c03", "(reference)")]) / (1 + 4.0 + PoolSettings().weight)
    assert pooled.report.unadjusted_rewards["c03"] == pytest.approx(expected, rel=1e-12)
    assert no_pool.report.rewards["c03"] != pooled.report.unadjusted_rewards["c03"]
    # and, a copy of its own entry, paid at most 0
    assert expected > 0 and pooled.report.rewards["c03"] == 0.0
    assert pooled.report.peers["c03"] == ["c07", "(reference)"] and pooled.pool_peers["c07"]


def test_a_copy_of_another_participants_pool_entry_is_paid_nothing():
    copier = {8: lambda t: honest(5, 2)}  # client 8 submits client 5's round-2 update
    scored = run_rounds({1: (3, 4), 2: (5, 6), 3: (8, 7)}, deviations=copier)
    assert [g.clients for g in scored[3].pool_copies] == [("c05@2", "c08")]
    assert scored[3].pool_copies[0].note is None and scored[3].own_resubmissions == ()
    assert scored[3].report.rewards["c08"] == 0.0 < scored[3].report.unadjusted_rewards["c08"]
    assert scored[3].pool_peers["c08"]


def test_a_near_copy_of_another_participants_entry_is_a_copy_where_one_of_its_own_would_be_a_retrain():
    """1% of the signs turned (31 of 3,072): within the 2% of a copy of another's; an own earlier update must match on
    every sign to be a replay (``fl.pool_copies.OWN_REPLAY_MAX_DISAGREEMENT``)."""
    near = honest(5, 2)["w"].copy()
    near.flat[:31] *= -1
    scored = run_rounds({1: (3, 4), 2: (5, 6), 3: (8, 7)}, deviations={8: lambda t: {"w": near}})
    assert [g.clients for g in scored[3].pool_copies] == [("c05@2", "c08")]
    assert scored[3].report.rewards["c08"] == 0.0 < scored[3].report.unadjusted_rewards["c08"]
    own = run_rounds({1: (3, 4), 2: (5, 6), 3: (5, 7)}, deviations={5: lambda t: {"w": near} if t == 3 else honest(5, t)})
    assert own[3].pool_copies == () and own[3].report.rewards["c05"] == own[3].report.unadjusted_rewards["c05"]


def test_a_copy_of_its_own_entry_and_another_participants_is_paid_nothing():
    first = honest(3, 1)
    stale = {3: lambda t: first}

    def pooled_round(settings, schedule, source_round):
        # c05's entry holds c03's round-1 words (two colluders' entries, put in the pool by hand).
        pool = PeerPool(settings)
        for t, clients in schedule.items():
            updates = round_updates(t, clients, stale | ({5: lambda t: first} if t == source_round else {}))
            pool.add_round(t, dict(zip(sorted(updates), pack_updates(updates).words()[0])))
        t = max(schedule) + 1
        return score_with_pool(pack_updates(round_updates(t, (3, 7), stale)), pool, t, seed=t)

    one_group = pooled_round(PoolSettings(), {1: (3, 4), 2: (5, 6)}, 2)
    assert [g.clients for g in one_group.pool_copies] == [("c03", "c03@1", "c05@2")]
    # Its own round-1 entry found on the sketch (outside the window of 2), c05's in the window: two groups.
    two_groups = pooled_round(PoolSettings(window=2), {1: (3, 4), 2: (1, 2), 3: (5, 6), 4: (8, 9)}, 3)
    assert sorted(g.clients for g in two_groups.pool_copies) == [("c03", "c03@1"), ("c03", "c05@3")]
    for pooled in (one_group, two_groups):
        assert pooled.own_resubmissions == () and all(g.note is None for g in pooled.pool_copies)
        assert pooled.report.rewards["c03"] == 0.0 < pooled.report.unadjusted_rewards["c03"]


def test_the_pool_verdict_weighs_pool_weight_and_a_disagreeing_peer_the_pool_ranks_lower_is_read_back():
    """Round 8: c01 beside the flipper c03. Lags weigh m_k / max |m_j| (the strongest 1); the pool's verdict z (the
    weighted mean of pool payments) weighs ``weight`` against the in-round peer's 1. The pair disagrees and the pool
    ranks c03 lower: c03 is fined the disagreement, c01 is paid it read back (as if c03 had reported the opposite)."""
    for weight in (0.25, 2.0):
        pooled = run_rounds(SCHEDULE, PoolSettings(weight=weight, next_round=False), deviations={3: "flip"})[8]
        report, pays = pooled.report, pooled.report.pairwise
        assert max(abs(w) for w in pooled.lag_weights.values()) == 1.0 and pooled.lag_weights[1] > 0
        mine, theirs = pool_verdict(pooled, 8, "c01"), pool_verdict(pooled, 8, "c03")
        assert pays[("c01", "c03")] < 0 and theirs < mine
        assert report.rewards["c01"] == pytest.approx((weight * mine - pays[("c01", "c03")]) / (weight + 1), rel=1e-12)
        assert report.rewards["c03"] == pytest.approx((weight * theirs + pays[("c03", "c01")]) / (weight + 1), rel=1e-12)


def test_the_cautious_reward_weighs_the_in_round_payment_as_it_is_beside_the_pool():
    """What the aggregation also asks of a short reply: the in-round payment at 1 (never read back), pool payments at
    CAUTIOUS_POOL_WEIGHT x lag weight, one weighted mean. The flipper's honest partner is paid > 0 (its peer read
    back); its cautious reward carries the disagreement."""
    from kfca_llm.fl.pool_weights import CAUTIOUS_POOL_WEIGHT

    pooled = run_rounds(SCHEDULE, IN_ROUND, deviations={3: "flip"})[8]
    pays, weights = pooled.report.pairwise, pooled.lag_weights
    for client, peer in (("c01", "c03"), ("c03", "c01")):
        pool = [(CAUTIOUS_POOL_WEIGHT * weights[8 - parse_pool_name(p)[1]], v) for (c, p), v in pays.items()
                if c == client and parse_pool_name(p)]
        expected = (pays[(client, peer)] + sum(w * v for w, v in pool)) / (1 + sum(abs(w) for w, _ in pool))
        assert pooled.cautious[client] == pytest.approx(expected, rel=1e-12)
    assert pooled.cautious["c03"] < pooled.cautious["c01"] < pooled.report.rewards["c01"]
    assert pooled.verdicts.cautious == pooled.cautious
    # with a trusted reference, the reference is in the cautious mean at its weight
    pool = PeerPool()
    for t in range(1, 8):
        packer = pack_updates(round_updates(t, SCHEDULE[t], {3: "flip"}))
        pool.add_round(t, dict(zip(packer.clients, packer.words()[0])))
    packer = pack_updates(round_updates(8, (1, 3), {3: "flip"}))
    referenced = score_with_pool(packer, pool, 8, seed=8, reference=reference_signs(packer, honest(11, 8)),
                                 reference_weight=4.0)
    pays, weights = referenced.report.pairwise, referenced.lag_weights
    pool_terms = [(CAUTIOUS_POOL_WEIGHT * weights[8 - parse_pool_name(p)[1]], v) for (c, p), v in pays.items()
                  if c == "c01" and parse_pool_name(p)]
    expected = ((pays[("c01", "c03")] + 4.0 * pays[("c01", "(reference)")] + sum(w * v for w, v in pool_terms))
                / (1 + 4.0 + sum(abs(w) for w, _ in pool_terms)))
    assert referenced.cautious["c01"] == pytest.approx(expected, rel=1e-12)


def test_an_agreeing_pair_counts_as_it_is_and_a_peer_without_a_verdict_counts_for_nothing():
    from kfca_llm.fl.pool_weights import orientation

    assert orientation(0.2, -1.0, -5.0) == 1.0 and orientation(0.0, 1.0, -1.0) == 1.0  # agreement: as it is
    assert orientation(-0.2, 0.1, -0.1) == -1.0 and orientation(-0.2, -0.1, 0.1) == 1.0  # who the pool ranks lower
    assert orientation(-0.2, 0.1, None) == 0.0 and orientation(0.2, 0.1, None) == 0.0
    pooled = run_rounds(SCHEDULE)[9]  # two honest participants: the pair agrees
    pays = pooled.report.pairwise
    assert pays[("c00", "c04")] > 0
    w = PoolSettings().weight
    assert pooled.report.rewards["c00"] == pytest.approx((w * pool_verdict(pooled, 9, "c00") + pays[("c00", "c04")]) / (w + 1),
                                                         rel=1e-12)


def test_entries_their_round_scored_at_most_zero_are_no_ones_pool_peers():
    scored = run_rounds(SCHEDULE, deviations={3: "flip"})
    assert all(scored[t].report.unadjusted_rewards["c03"] < 0 for t in (1, 6, 8, 11))  # every round scores it < 0
    used = {parse_pool_name(p)[0] for s in scored.values() for names in s.pool_peers.values() for p in names}
    assert "c03" not in used and {"c01", "c06"} <= used
    # the same schedule without the score: the flipper's entries are peers again
    pool = PeerPool()
    for t in range(1, 11):
        packer = pack_updates(round_updates(t, SCHEDULE[t], {3: "flip"}))
        pool.add_round(t, dict(zip(packer.clients, packer.words()[0])))
    assert "c03" in {e.participant for e in pool.candidates(11, "c00", exclude=[])}


def test_a_lag_that_anti_agrees_gets_a_negative_weight_and_still_pays_the_honest_partner():
    # Updates that turn back every round (the global overshoots): round t's honest direction is (-1)^t.
    def turning(client, t):
        return {"w": ((-1) ** t * 0.9 * PERSISTENT + np.random.default_rng(7919 * client + t).standard_normal(SHAPE))
                .astype(np.float32)}
    scored = run_rounds(SCHEDULE, IN_ROUND, deviations={c: (lambda t, c=c: turning(c, t)) for c in range(10) if c != 3}
                        | {3: lambda t: {"w": -turning(3, t)["w"]}})
    assert scored[8].lag_weights[1] < 0 < scored[8].lag_weights[2]
    for t, partner in ((8, "c01"), (11, "c06"), (14, "c09")):
        rewards = scored[t].report.rewards
        assert rewards[partner] > 0 > rewards["c03"], (t, rewards)


def test_pool_names_and_settings_are_checked_and_the_recipe_defaults_are_the_pools():
    assert parse_pool_name(pool_name("key:ab@c", 12)) == ("key:ab@c", 12)
    assert parse_pool_name("c01") is None
    for bad in ({"min_peers": -1}, {"window": 1.5}, {"weight": 0}, {"pool_peers": True}):
        with pytest.raises(InputError):
            PoolSettings(**bad)
    kfca = KfcaConfig()
    assert (kfca.min_peers, kfca.pool_window, kfca.pool_peers, kfca.pool_weight) == (
        PoolSettings().min_peers, PoolSettings().window, PoolSettings().pool_peers, PoolSettings().weight)


def test_a_stale_resubmission_older_than_the_window_is_caught_on_the_sketch():
    first = honest(3, 1)
    scored = run_rounds({1: (3, 4), 2: (5, 6), 3: (1, 2), 4: (8, 9), 5: (3, 7)}, PoolSettings(window=2),
                        deviations={3: lambda t: first})
    r5 = scored[5]
    assert [g.clients for g in r5.pool_copies] == [("c03", "c03@1")]  # round 1 is outside the window of 2
    assert r5.pool_copies[0].pairs[0].agreement == 1.0 and r5.own_resubmissions == ("c03",)
    alone = score_updates(round_updates(5, (3, 7), {3: lambda t: first}), seed=5).rewards["c03"]
    assert r5.report.unadjusted_rewards["c03"] == pytest.approx(alone / (1 + PoolSettings().weight), rel=1e-12)
    assert r5.resubmitted == {"c03": ("c03@1",)} and r5.report.rewards["c03"] == min(alone, 0.0)
    assert r5.report.rewards["c07"] == r5.report.unadjusted_rewards["c07"]


def test_a_pooled_round_reports_its_in_round_rewards_and_whether_the_pool_is_still_warming_up():
    """``in_round_rewards`` is the round scored without the pool (bit for bit); a short participant is warming
    up while undetermined or backed by fewer than ``pool_peers`` distinct pool participants of non-zero weight.
    Round 8 of SCHEDULE (c01 beside the flipper c03): the pool has all 8 other clients, so at the default
    ``pool_peers`` (8) c01's verdict is warm and the aggregation keeps c01 on its pooled reward; at 9 the pool
    is still warming up for it, and confirm-warm-up holds it to its in-round reward (< 0: left out)."""
    from kfca_llm.fl.aggregate import aggregation_weights

    for pool_peers, warming_at_8 in ((8, ()), (9, ("c01", "c03"))):
        scored = run_rounds(SCHEDULE, PoolSettings(pool_peers=pool_peers, next_round=False), deviations={3: "flip"})
        for t, s in scored.items():
            alone = score_updates(round_updates(t, SCHEDULE[t], {3: "flip"}), seed=t).rewards
            assert s.in_round_rewards == alone and s.short == tuple(sorted(alone))
            assert set(s.undetermined) <= set(s.warming) <= set(s.short)
        assert all(scored[t].warming == scored[t].short for t in (1, 2))  # undetermined rounds warm up
        assert scored[8].warming == warming_at_8
        verdicts = scored[8].verdicts
        assert verdicts.in_round_rewards["c01"] < 0 < scored[8].report.rewards["c01"]
        weights = {"c01": 1, "c03": 1}
        kept = aggregation_weights("exclude-negative", scored[8].report.rewards, weights, verdicts=verdicts,
                                   weak_verdict="confirm-warm-up")
        assert set(kept) == ({"c01"} if not warming_at_8 else set())
        assert set(aggregation_weights("exclude-negative", scored[8].report.rewards, weights, verdicts=verdicts,
                                       weak_verdict="trust-pool")) == {"c01"}
    # A pool peer of a lag the pool cannot weigh yet does not count: in round 3 the pool has pairs one round apart
    # only, so of 3 pool peers the round-1 one weighs 0 and 2 < 3 back the reward; in round 4 all 3 weigh.
    # (Honest clients only: round 1's pair with the flipper scores both < 0, so neither would be a pool peer.)
    three = run_rounds(SCHEDULE, PoolSettings(pool_peers=3))
    assert set(three[3].lag_weights) == {1} and len(next(iter(three[3].pool_peers.values()))) == 3
    assert not three[3].undetermined and three[3].warming == three[3].short and three[4].warming == ()
    # One pool peer can never give min_peers=3 distinct peers: undetermined in every round, so warming too, though
    # its one pool peer is all pool_peers asks for.
    narrow = run_rounds(SCHEDULE, PoolSettings(min_peers=3, pool_peers=1), deviations={3: "flip"})
    assert all(s.undetermined == s.warming == s.short for s in narrow.values())
    assert any(s.used_pool for s in narrow.values())


def test_a_round_with_enough_in_round_peers_has_no_short_participant_for_the_aggregation_to_judge():
    pool = PeerPool(PoolSettings(min_peers=2))
    for t in range(1, 4):
        pool.add_round(t, {f"c{c:02d}": w for c, w in zip((t, t + 10), pack_updates(round_updates(t, (t, t + 10))).words()[0])})
    updates = round_updates(4, (0, 1, 2), {2: "flip"})
    pooled = score_with_pool(pack_updates(updates), pool, 4, seed=123)
    assert pooled.short == pooled.warming == () and pooled.in_round_rewards == pooled.report.rewards
    assert pooled.verdicts.short == frozenset()


def test_a_reference_without_a_pool_within_public_strata_pays_as_a_pool_that_is_off():
    """``score_with_pool(..., pool=None)`` with a reference and public strata is the public API's odd case: no pool
    to read settings from; it pays what a pool switched off pays (no pool peers, no verdicts), never an error."""
    from kfca_llm.engine.public import PublicConditioning

    steps = [{"w": honest(9, t)["w"]} for t in range(1, 4)]
    updates = round_updates(4, (3, 4), {3: "flip"})
    packer = pack_updates(updates)
    reference = reference_signs(packer, honest(11, 4))
    kwargs = dict(seed=4, reference=reference, reference_weight=4.0, public=steps, conditioning=PublicConditioning())
    alone = score_with_pool(packer, None, 4, **kwargs)
    off = score_with_pool(packer, PeerPool(PoolSettings(min_peers=0)), 4, **kwargs)
    assert alone.planes is not None and alone.report.rewards == off.report.rewards
    assert alone.report.rewards["c04"] > 0 > alone.report.rewards["c03"]  # the reference tells the flipper
