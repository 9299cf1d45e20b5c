"""A participant's record (``PeerPool.record``), which settles who deviated in a disagreeing pair beside the round's
verdicts: the lower of its window's and its run's."""

import numpy as np
import pytest
from test_peer_pool import SCHEDULE, round_updates, run_rounds

from kfca_llm.api import pack_updates
from kfca_llm.errors import InputError
from kfca_llm.fl.peer_pool import PeerPool, PoolSettings, score_with_pool


def test_a_participants_recent_record_settles_who_deviated_in_a_disagreeing_pair():
    """The rank is the round's verdict plus the participant's record (the mean score of its entries in the window).
    The flipper c03's entries of rounds 1 and 6 scored < 0; recorded as +1 instead (a forged record), c03 outranks its
    honest partner c01 in round 8, and the disagreement is read back for c03 and fined on c01."""
    def pool_before_8(forged: bool) -> PeerPool:
        pool = PeerPool()
        for t in range(1, 8):
            scored = run_rounds({t: SCHEDULE[t]}, deviations={3: "flip"})[t]
            packer = pack_updates(round_updates(t, SCHEDULE[t], {3: "flip"}))
            scores = dict(scored.report.unadjusted_rewards) | ({"c03": 1.0} if forged and "c03" in scored.report.rewards else {})
            pool.add_round(t, dict(zip(packer.clients, packer.words()[0])), scores)
        return pool

    honest_record, forged = pool_before_8(False), pool_before_8(True)
    assert honest_record.record("c03", 8) < 0 < honest_record.record("c01", 8) and forged.record("c03", 8) == 1.0
    assert honest_record.record("c11", 8) is None  # never trained
    packer = pack_updates(round_updates(8, (1, 3), {3: "flip"}))
    right = score_with_pool(packer, honest_record, 8, seed=8).report.rewards
    wrong = score_with_pool(packer, forged, 8, seed=8).report.rewards
    assert right["c01"] > 0 > right["c03"] and wrong["c03"] > 0 > wrong["c01"]


def test_a_record_is_the_lower_of_the_windows_and_the_runs():
    """A flipper back after the window (late in training, when a round's verdicts fade) is still ranked by its run, and
    so is one whose window holds a read-back it was paid by mistake; one that turned deviator is ranked by its recent
    record while its run's is still good; an honest participant with one noisy round in the window keeps its run's
    weight only as far as the window allows (the lower of the two)."""
    pool, words = PeerPool(PoolSettings(window=3)), np.zeros(4, np.int32)
    scores = {"flipper": {1: -0.2, 2: -0.1}, "turncoat": {1: 0.3, 2: 0.3, 3: 0.3, 14: -0.1},
              "honest": {1: 0.2, 14: -0.01}, "misranked": {1: -0.2, 2: -0.2, 3: -0.2, 14: 0.1}}
    for t in range(1, 16):
        pool.add_round(t, {who: words for who, s in scores.items() if t in s} | {"other": words},
                       {who: s[t] for who, s in scores.items() if t in s})
    assert pool.record("flipper", 16) == pytest.approx(-0.15)  # nothing in the window: its run's
    assert pool.record("turncoat", 16) == pytest.approx(-0.1)  # its window's, below its run's +0.2
    assert pool.record("honest", 16) == pytest.approx(-0.01)
    # a flipper paid the read-back once by mistake (recent +0.1) is ranked by its run: the mistake does not repeat
    assert pool.record("misranked", 16) == pytest.approx(-0.125)
    assert pool.record("flipper", 2) == -0.2 and pool.record("flipper", 2, horizon=15) == -0.2  # never its own round
    assert pool.record("other", 16) is None  # never recorded
    again = PeerPool.from_arrays(pool.settings, *pool.to_arrays())
    assert again.record("flipper", 16) == pool.record("flipper", 16)  # a resumed run keeps the run's scores


@pytest.mark.parametrize("rank_by", ["record", "verdict-first"])
def test_a_record_cannot_outvote_a_clear_verdict_when_verdicts_come_first(rank_by):
    """The flipper c03 of round 8 with a record of +1 (honest so far: a sleeper that just turned). Ranked by verdict
    plus record, its record outvotes the round's verdicts and its honest partner c01 is fined; with
    ``rank_by="verdict-first"`` the two verdicts, far apart against their standard errors, settle the pair alone."""
    from kfca_llm.fl.pool_store import VERDICT_GATE
    from kfca_llm.fl.pool_weights import verdict_settles

    pool = PeerPool(PoolSettings(rank_by=rank_by))
    for t in range(1, 8):
        scored = run_rounds({t: SCHEDULE[t]}, deviations={3: "flip"})[t]
        packer = pack_updates(round_updates(t, SCHEDULE[t], {3: "flip"}))
        scores = dict(scored.report.unadjusted_rewards) | ({"c03": 1.0} if "c03" in scored.report.rewards else {})
        pool.add_round(t, dict(zip(packer.clients, packer.words()[0])), scores)
    rewards = score_with_pool(pack_updates(round_updates(8, (1, 3), {3: "flip"})), pool, 8, seed=8).report.rewards
    if rank_by == "record":
        assert rewards["c03"] > 0 > rewards["c01"]
    else:
        assert rewards["c01"] > 0 > rewards["c03"]
    assert verdict_settles((0.1, 0.01), (-0.1, 0.01), VERDICT_GATE) and not verdict_settles((0.1, 0.1), (-0.1, 0.1), 2.0)
    with pytest.raises(InputError, match="rank_by"):
        PoolSettings(rank_by="reputation")
