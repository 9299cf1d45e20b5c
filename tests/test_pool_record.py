"""A participant's record (``fl.pool_policy.record``), which settles who deviated in a disagreeing pair beside the
round's verdicts: a Beta reputation of how often its run's submissions were scored > 0 (pool rule 12); or its
reputation (``fl.pool_policy.reputation``, ``rank_by="reputation"``), built from the pool's verdicts alone."""

import numpy as np
import pytest
from test_peer_pool import SCHEDULE, round_updates, run_rounds

from kfca_llm.api import pack_updates
from kfca_llm.errors import InputError
from kfca_llm.fl.peer_pool import PeerPool, PoolSettings, recorded_pool_settings, score_with_pool
from kfca_llm.fl.pool_policy import record, reputation


def forgery(scored: dict) -> dict[str, float]:
    """Forged scores of a round's ``scored`` participants: the flipper c03 paid +1 (a sleeper honest so far) and the
    honest c01 -1 (unlucky so far), so that their records outvote the verdicts of round 8, where the two meet."""
    return {c: score for c, score in (("c03", 1.0), ("c01", -1.0)) if c in scored}


def test_a_participants_record_settles_who_deviated_in_a_disagreeing_pair():
    """The rank is the round's verdict plus the participant's record. The flipper c03's entries of rounds 1 and 6
    scored < 0; recorded as +1 instead, and c01's as -1 (``forgery``), c03 outranks its honest partner c01 in round 8,
    and the disagreement is read back for c03 and fined on c01. Ranked in its round (``next_round=False``: under pool
    rule 15 such a pair waits for the round after it, and is ranked so where that round cannot settle it)."""
    def pool_before_8(forged: bool) -> PeerPool:
        pool = PeerPool(PoolSettings(next_round=False))
        for t in range(1, 8):
            scored = run_rounds({t: SCHEDULE[t]}, deviations={3: "flip"})[t]
            packer = pack_updates(round_updates(t, SCHEDULE[t], {3: "flip"}))
            scores = dict(scored.report.unadjusted_rewards) | (forgery(scored.report.rewards) if forged else {})
            pool.add_round(t, dict(zip(packer.clients, packer.words()[0])), scores)
        return pool

    honest_record, forged = pool_before_8(False), pool_before_8(True)
    assert record(honest_record, "c03", 8) < 0 < record(honest_record, "c01", 8)
    assert record(forged, "c03", 8) == 0.25  # two good submissions: (2 + 1) / (2 + 2) - 1/2
    assert record(honest_record, "c11", 8) is None  # never trained
    packer = pack_updates(round_updates(8, (1, 3), {3: "flip"}))
    right = score_with_pool(packer, honest_record, 8, seed=8).report.rewards
    wrong = score_with_pool(packer, forged, 8, seed=8).report.rewards
    assert right["c01"] > 0 > right["c03"] and wrong["c03"] > 0 > wrong["c01"]


def test_a_record_counts_how_often_a_participant_was_paid_not_how_much():
    """Pool rule 12. An on-off attacker paid well early in training (+0.5, when rounds pay five to ten times late ones)
    and fined a little late (-0.05 twice) has a mean score above an honest participant's paid a little late (+0.01
    three times), and the mean would rank it above; its record, counting submissions, ranks it below. A submission
    scored <= 0 weighs twice one scored > 0: one of each is a record below 0. Every submission of the run counts,
    however old (the window does not bound it), never the round ranked itself, and a resumed run keeps them."""
    pool, words = PeerPool(PoolSettings(window=3)), np.zeros(4, np.int32)
    scores = {"on-off": {1: 0.5, 12: -0.05, 14: -0.05}, "honest": {11: 0.01, 13: 0.01, 15: 0.01},
              "even": {2: 0.2, 14: -0.2}, "flipper": {1: -0.2, 2: -0.1}}
    for t in range(1, 16):
        pool.add_round(t, {who: words for who, s in scores.items() if t in s} | {"other": words},
                       {who: s[t] for who, s in scores.items() if t in s})
    assert sum(scores["on-off"].values()) / 3 > sum(scores["honest"].values()) / 3
    assert record(pool, "on-off", 16) == pytest.approx(2 / 7 - 0.5) and record(pool, "honest", 16) == pytest.approx(0.3)
    assert record(pool, "even", 16) == pytest.approx(2 / 5 - 0.5)  # one of each: below 0
    assert record(pool, "flipper", 16) == pytest.approx(1 / 6 - 0.5)  # nothing in the window: its run's all the same
    assert record(pool, "flipper", 2) == pytest.approx(1 / 4 - 0.5)  # never its own round
    assert record(pool, "flipper", 2, horizon=15) == record(pool, "flipper", 2)
    assert record(pool, "honest", 13) == pytest.approx(2 / 3 - 0.5)  # round 11's alone
    assert record(pool, "honest", 13, horizon=15) == pytest.approx(3 / 4 - 0.5)  # settling: rounds 11 and 15
    assert record(pool, "other", 16) is None  # never recorded
    again = PeerPool.from_arrays(pool.settings, *pool.to_arrays())
    assert record(again, "on-off", 16) == record(pool, "on-off", 16)  # a resumed run keeps the run's scores


def test_a_record_leaves_out_what_was_charged_back():
    """Pool rule 10: a sleeper's honest submissions forfeited at its turn (charged back, ``mark_charged``) vouch for
    nothing after it, and a rebuilt pool says the same; a participant with
    nothing left but charged submissions has no record, and another's record is untouched."""
    pool, words = PeerPool(PoolSettings(window=3)), np.zeros(4, np.int32)
    scores = {"sleeper": {1: 0.3, 5: 0.2, 7: 0.1, 8: -0.07}, "stale": {2: 0.25}, "honest": {3: 0.2, 7: 0.1}}
    for t in range(1, 9):
        pool.add_round(t, {who: words for who, s in scores.items() if t in s} | {"other": words},
                       {who: s[t] for who, s in scores.items() if t in s})
    assert record(pool, "sleeper", 9) == pytest.approx(4 / 7 - 0.5)  # three good, its turn bad
    assert record(pool, "stale", 9) == pytest.approx(2 / 3 - 0.5)
    pool.mark_charged(["sleeper@1", "sleeper@5", "sleeper@7", "stale@2"])
    assert record(pool, "sleeper", 9) == pytest.approx(1 / 4 - 0.5)  # the turned submission's alone
    assert record(pool, "sleeper", 7) is None  # before its turn: all of it charged since
    assert record(pool, "stale", 9) is None
    assert record(pool, "honest", 9) == pytest.approx(0.25) and record(pool, "honest", 4) == pytest.approx(2 / 3 - 0.5)
    again = PeerPool.from_arrays(pool.settings, *pool.to_arrays())
    assert record(again, "sleeper", 9) == pytest.approx(-0.25) and record(again, "stale", 9) is None


@pytest.mark.parametrize("rank_by", ["record", "verdict-first", "reputation"])
def test_a_record_cannot_outvote_a_clear_verdict_when_verdicts_come_first(rank_by):
    """The flipper c03 of round 8 with a forged record (``forgery``: a sleeper that just turned). Ranked by verdict
    plus record, its record outvotes the round's verdicts and its honest partner c01 is fined; with
    ``rank_by="verdict-first"`` the two verdicts, far apart against their standard errors, settle the pair alone; with
    ``"reputation"`` the scores recorded count for nothing (a reputation is built from verdicts only, none recorded
    here), and the round's verdicts rank the pair. Ranked in its round (``next_round=False``), as in the test above."""
    from kfca_llm.fl.pool_store import VERDICT_GATE
    from kfca_llm.fl.pool_weights import verdict_settles

    pool = PeerPool(PoolSettings(rank_by=rank_by, next_round=False))
    for t in range(1, 8):
        scored = run_rounds({t: SCHEDULE[t]}, deviations={3: "flip"})[t]
        packer = pack_updates(round_updates(t, SCHEDULE[t], {3: "flip"}))
        scores = dict(scored.report.unadjusted_rewards) | forgery(scored.report.rewards)
        pool.add_round(t, dict(zip(packer.clients, packer.words()[0])), scores)
    rewards = score_with_pool(pack_updates(round_updates(8, (1, 3), {3: "flip"})), pool, 8, seed=8).report.rewards
    if rank_by == "record":
        assert rewards["c03"] > 0 > rewards["c01"]
    else:
        assert rewards["c01"] > 0 > rewards["c03"]
    assert verdict_settles((0.1, 0.01), (-0.1, 0.01), VERDICT_GATE) and not verdict_settles((0.1, 0.1), (-0.1, 0.1), 2.0)
    with pytest.raises(InputError, match="rank_by"):
        PoolSettings(rank_by="beta")


def test_a_sleepers_reputation_after_its_turn_falls_below_an_honest_partners():
    """A sleeper: three clear honest verdicts early in training (evidence +0.9), then one flip the pool judged weakly
    (-0.5); its partner, honest late in training, has weaker evidence (+0.4 each). In the round they meet, both verdicts
    tell nothing (0). Its turn weighs twice what honest evidence does and is the newest: the sleeper ranks below its
    partner, where equal weights (or no forgetting of old evidence) would rank it above. Its scores (in-round payments,
    here +1 for the flip a misranked pair read back) count for nothing, and a resumed run keeps the evidence."""
    from kfca_llm.fl import pool_policy

    pool, words = PeerPool(PoolSettings(rank_by="reputation")), np.zeros(4, np.int32)
    evidence = {"sleeper": {2: 0.9, 5: 0.9, 9: 0.9, 30: -0.5}, "honest": {25: 0.4, 33: 0.4, 37: 0.4}}
    for t in range(1, 40):
        present = {who: e[t] for who, e in evidence.items() if t in e}
        pool.add_round(t, {who: words for who in present} | {"other": words}, {"sleeper": 1.0, "honest": 0.01},
                       evidence=present)
    sleeper, honest = reputation(pool, "sleeper", 40, 0.0), reputation(pool, "honest", 40, 0.0)
    weights = [1, 0.8 * 2, 0.64, 0.512, 0.4096]  # now, the turn (bad: twice), then the honest ones, older and older
    assert sleeper == pytest.approx(sum(w * v for w, v in zip(weights, [0, -0.5, 0.9, 0.9, 0.9])) / sum(weights))
    assert sleeper < honest == pytest.approx(0.4 * (0.8 + 0.64 + 0.512) / (1 + 0.8 + 0.64 + 0.512))
    assert record(pool, "sleeper", 40) > record(pool, "honest", 40)  # the scores' record: spent to the sleeper's favour
    assert reputation(pool, "other", 40, -0.3) == -0.3  # nothing recorded: the round's evidence alone
    assert reputation(pool, "sleeper", 9, 0.0, horizon=30) < reputation(pool, "sleeper", 9, 0.0)  # settling: both sides
    again = PeerPool.from_arrays(pool.settings, *pool.to_arrays())
    assert reputation(again, "sleeper", 40, 0.0) == sleeper
    with pytest.raises(InputError, match="evidence"):  # a ledger's rows cannot rebuild it: no verifier may try
        recorded_pool_settings(PoolSettings(rank_by="reputation").to_dict())
    assert recorded_pool_settings(PoolSettings(rank_by="verdict-first").to_dict()).rank_by == "verdict-first"
    for forgetting, bad in ((0.8, 1.0), (1.0, 1.0)):  # what the rule's two constants do for it
        original = pool_policy.REPUTATION_FORGETTING, pool_policy.BAD_EVIDENCE_WEIGHT
        pool_policy.REPUTATION_FORGETTING, pool_policy.BAD_EVIDENCE_WEIGHT = forgetting, bad
        try:
            assert reputation(pool, "sleeper", 40, 0.0) > reputation(pool, "honest", 40, 0.0)
        finally:
            pool_policy.REPUTATION_FORGETTING, pool_policy.BAD_EVIDENCE_WEIGHT = original


def test_within_public_strata_the_verdicts_without_them_settle_a_pair_the_record_would_misrank(monkeypatch):
    """Pool rule 6. The sleeper c03 of round 8 (a forged record of +1: honest so far) flips beside the honest c01, both
    scored within the public strata of the global's steps so far. Verdict plus record rank c03 above c01 (the record
    outvotes the verdicts), but their verdicts without the strata settle the pair: c03's is below 0 and far below c01's
    against their standard errors, so c01 is paid > 0 and c03 is fined. Two verdicts above 0 never settle a pair,
    however far apart (a free rider's, which follows the trajectory, cannot win that way)."""
    from kfca_llm.engine.public import PublicConditioning
    from kfca_llm.fl import pool_reward
    from kfca_llm.fl.pool_store import VERDICT_GATE
    from kfca_llm.fl.pool_weights import trajectory_settles

    def round_8(settles_by_trajectory: bool) -> dict[str, float]:
        if not settles_by_trajectory:
            monkeypatch.setattr(pool_reward, "trajectory_settles", lambda *args: False)
        pool, steps = PeerPool(PoolSettings()), []
        for t in range(1, 8):
            updates = round_updates(t, SCHEDULE[t], {3: "flip"})
            packer = pack_updates(updates)
            planes = packer.public_planes(steps, PublicConditioning()) if steps else None
            scored = score_with_pool(packer, pool, t, seed=t, public=planes)
            scores = dict(scored.report.unadjusted_rewards) | ({"c03": 1.0} if "c03" in updates else {})
            pool.add_round(t, dict(zip(packer.clients, packer.words()[0])), scores)
            steps.append({"w": sum(u["w"] for u in updates.values()) / len(updates)})
        packer = pack_updates(round_updates(8, (1, 3), {3: "flip"}))
        rewards = score_with_pool(packer, pool, 8, seed=8, public=packer.public_planes(steps, PublicConditioning()))
        monkeypatch.undo()
        return rewards.report.rewards

    settled, by_record = round_8(True), round_8(False)
    assert settled["c01"] > 0 > settled["c03"]
    assert by_record["c03"] > 0 > by_record["c01"]
    assert trajectory_settles((0.1, 0.01), (-0.1, 0.01), VERDICT_GATE)
    assert not trajectory_settles((0.3, 0.01), (0.05, 0.01), VERDICT_GATE)  # both above 0: never
    assert not trajectory_settles((0.1, 0.1), (-0.1, 0.1), VERDICT_GATE)  # within their errors
