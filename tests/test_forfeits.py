"""Pool rule 8 at two clients a round of 20 (as test_charge_back.py): client 4, honest in rounds 3 and 13, flips in
round 23 (a sleeper's turn) and resubmits its round-13 update in round 33. Its turn forfeits what rounds 3 and 13
paid it, once: the resubmission of a forfeited update charges nothing more, and a resumed pool knows it."""

from pool_updates import honest, round_updates
from test_pool_settle import pair

from kfca_llm.api import pack_updates
from kfca_llm.engine.duplicates import DuplicateRule
from kfca_llm.fl.peer_pool import PeerPool, score_with_pool
from kfca_llm.fl.pool_close import ClosingRound, close_round

SLEEPER = 4
WHO = f"c{SLEEPER:02d}"


def sleeper(t: int) -> dict:
    if t == 23:
        return {"w": -honest(SLEEPER, t)["w"]}
    return honest(SLEEPER, 13 if t == 33 else t)


def run(rounds: int):
    pool, scored, paid = PeerPool(), {}, {}
    for t in range(1, rounds + 1):
        packer = pack_updates(round_updates(t, pair(t), {SLEEPER: sleeper}))
        scored[t] = score_with_pool(packer, pool, t, seed=t)
        paid[t] = dict(scored[t].report.rewards)
        for s in close_round(pool, ClosingRound.scored(
                packer, t, scored[t], words=packer.words(), participants=packer.clients, seed=t, penalty="expected",
                bonus_fraction=0.5, duplicates="zero", duplicate_rule=DuplicateRule())):
            paid[s.round][s.participant] = s.reward
    return pool, scored, paid


def test_a_turn_forfeits_the_honest_pay_once_and_a_resubmission_of_a_forfeited_update_charges_nothing_more():
    pool, scored, paid = run(33)
    assert [t for t in paid if WHO in paid[t]] == [3, 13, 23, 33]
    earned = paid[3][WHO] + paid[13][WHO]
    assert paid[3][WHO] > 0 and paid[13][WHO] > 0
    turn = scored[23]
    assert turn.forfeited == {WHO: (f"{WHO}@13", f"{WHO}@3")} and turn.forfeit == {WHO: earned}
    assert WHO not in turn.undetermined and paid[23][WHO] == min(turn.report.unadjusted_rewards[WHO], 0.0) - earned
    assert pool.charged(f"{WHO}@13") and pool.charged(f"{WHO}@3") and pool.charge_of([f"{WHO}@13"]) == 0.0
    # round 33 resubmits the forfeited round-13 update: a copy, paid at most 0, nothing more charged
    assert scored[33].resubmitted == {WHO: (f"{WHO}@13",)} and scored[33].charged_back == {WHO: 0.0}
    assert scored[33].forfeited == {}
    # no honest client forfeits anything; the sleeper's balance is below 0, every honest one's above
    assert all(set(s.forfeited) <= {WHO} for s in scored.values())
    totals = {}
    for p in paid.values():
        for c, v in p.items():
            totals[c] = totals.get(c, 0.0) + v
    assert totals.pop(WHO) < 0 < min(totals.values())
    # a resumed pool knows what was forfeited
    again = PeerPool.from_arrays(pool.settings, *pool.to_arrays())
    assert again.charged(f"{WHO}@3") and again.charge_of([f"{WHO}@3", f"{WHO}@13"]) == 0.0
