"""A participant resubmitting an update of its own (``stale``, a ``lagged:K`` replay of its first update) is a copy:
paid at most 0, and what the resubmitted update was paid is charged back, once (``fl.peer_pool``, ``fl.pool_settle``).

Two clients a round of 20, as in test_pool_settle.py: client 4 trains in rounds 3, 13 and 23.
"""

import numpy as np
import pytest
from test_peer_pool import honest, round_updates
from test_pool_settle import pair

from kfca_llm.api import pack_updates
from kfca_llm.engine.duplicates import DuplicateRule
from kfca_llm.errors import InputError
from kfca_llm.fl.peer_pool import PeerPool, PoolSettings, score_with_pool
from kfca_llm.fl.pool_close import ClosingRound, close_round

STALE = 4


def run(rounds: int, schedule=pair, pool: PeerPool | None = None, duplicates: str = "zero", changed: int = 0):
    """Client 4 resubmits its first update whenever it trains, the signs of its first ``changed`` coordinates turned;
    (pool, round -> PooledRound, round -> paid, settled)."""
    first: dict[str, dict[str, np.ndarray]] = {}

    def resubmit(t: int) -> dict[str, np.ndarray]:
        if not first:
            first["w"] = honest(STALE, t)
            return first["w"]
        again = first["w"]["w"].copy()
        again.flat[:changed] *= -1
        return {"w": again}

    stale = {STALE: resubmit}
    pool = pool or PeerPool()
    scored, paid, settled = {}, {}, []
    for t in range(1, rounds + 1):
        packer = pack_updates(round_updates(t, schedule(t), stale))
        scored[t] = score_with_pool(packer, pool, t, seed=t, duplicates=duplicates)
        paid[t] = dict(scored[t].report.rewards)
        done = close_round(pool, ClosingRound.scored(
            packer, t, scored[t], words=packer.words(), participants=packer.clients, seed=t, penalty="expected",
            bonus_fraction=0.5, duplicates=duplicates, duplicate_rule=DuplicateRule()))
        settled += done
        for s in done:
            paid[s.round][s.participant] = s.reward
    return pool, scored, paid, settled


def test_the_first_resubmission_is_charged_what_the_update_was_paid_the_next_nothing_more():
    _, scored, paid, settled = run(23)
    who = f"c{STALE:02d}"
    assert [t for t in paid if who in paid[t]] == [3, 13, 23]
    honest_paid = paid[3][who]
    # round 3 was paid (on time or settled) before round 13 resubmitted it
    assert honest_paid > 0 and all(s.settled_in < 13 for s in settled if s.round == 3)
    for t, charged in ((13, honest_paid), (23, 0.0)):
        pooled = scored[t]
        assert pooled.resubmitted == {who: (f"{who}@3",)} and pooled.charged_back == {who: charged}
        assert who not in pooled.undetermined
        assert pooled.report.rewards[who] == min(pooled.report.unadjusted_rewards[who], 0.0) - charged
    # its balance: at most 0; every honest client that trained is paid more
    total = sum(paid[t][who] for t in (3, 13, 23))
    honest_totals = {c: sum(p.get(c, 0.0) for p in paid.values()) for p in paid.values() for c in p if c != who}
    assert total <= 0 < min(honest_totals.values())


def test_an_update_resubmitted_while_its_round_waits_is_settled_at_most_0():
    """Client 4 trains in round 2 (undetermined: nothing to weigh yet) and resubmits it in round 4, before round 2 is
    settled: nothing was paid to charge back then, so the settlement pays it at most 0."""
    schedule = {1: (0, 1), 2: (4, 5), 3: (2, 3), 4: (4, 7)}
    _, scored, paid, settled = run(12, lambda t: schedule.get(t, pair(t + 2)))
    assert scored[2].undetermined == ("c04", "c05")
    assert scored[4].resubmitted == {"c04": ("c04@2",)} and scored[4].charged_back == {"c04": 0.0}
    (late,) = [s for s in settled if (s.round, s.participant) == (2, "c04")]
    assert late.settled_in > 4 and late.reward == min(late.unadjusted_reward, 0.0)
    partner = next(s for s in settled if (s.round, s.participant) == (2, "c05"))
    assert partner.reward == partner.unadjusted_reward  # its partner is settled as it would be


def test_a_resumed_pool_knows_what_was_paid_and_charged():
    pool, *_ = run(13)
    again = PeerPool.from_arrays(pool.settings, *pool.to_arrays())
    assert again.charge_of(["c04@3"]) == pool.charge_of(["c04@3"]) == 0.0  # charged in round 13
    assert again.charged("c04@3") and not again.charged("c05@3")
    assert again.charge_of(["c05@3"]) == pool.charge_of(["c05@3"]) > 0


def test_an_update_settled_before_it_is_resubmitted_is_charged_its_settled_reward():
    """Client 4 trains in round 2 (undetermined), is settled later (paid > 0), and resubmits it in round 11."""
    schedule = {1: (0, 1), 2: (4, 5), 3: (2, 3)}
    _, scored, paid, settled = run(11, lambda t: schedule.get(t, pair(t + 2)))
    assert [t for t in paid if "c04" in paid[t]] == [2, 11]
    (first,) = [s for s in settled if (s.round, s.participant) == (2, "c04")]
    assert first.settled_in < 11 and first.reward > 0
    assert scored[11].charged_back == {"c04": first.reward}
    assert paid[11]["c04"] == min(scored[11].report.unadjusted_rewards["c04"], 0.0) - first.reward


def test_under_flag_a_resubmission_is_listed_never_charged():
    _, scored, paid, _ = run(13, duplicates="flag")
    assert scored[13].own_resubmissions == ("c04",) and scored[13].resubmitted == {} == scored[13].charged_back
    assert paid[13]["c04"] == scored[13].report.unadjusted_rewards["c04"] > 0


@pytest.mark.parametrize("changed", [1, 31])
def test_an_update_close_to_its_own_earlier_one_is_a_retrain_not_a_resubmission(changed):
    """FlowerTune's static data order: a client retrained on the same samples lands within a few signs of its earlier
    update (3 of 32,768 in benchmarks/honest_repeats.py). Only an update equal to the earlier one on every sign is a
    replay: 1 sign of 3,072 turned, or 31 (1%, within the 2% that makes a copy of another's), is scored as any
    submission, never charged back, and joins the pool."""
    pool, scored, paid, _ = run(13, changed=changed)
    who = f"c{STALE:02d}"
    assert scored[13].resubmitted == {} == scored[13].charged_back and scored[13].own_resubmissions == ()
    assert paid[13][who] == scored[13].report.unadjusted_rewards[who]
    assert not pool.charged(f"{who}@3") and pool.charge_of([f"{who}@3"]) == paid[3][who] > 0
    assert any(e.name == f"{who}@13" for e in pool.entries(14))


def test_where_clients_never_train_the_same_samples_again_a_replay_within_2_percent_is_charged_back():
    """``own_replay_limit`` follows the data order: a recipe with ``train.dynamic-data-seed = true`` (the tiny one) keeps
    rule 3's 2%, FlowerTune's static order (the real recipes) none; the pool refuses a limit that is no fraction."""
    from kfca_llm.fl.scoring import own_replay_limit
    from kfca_llm.recipe import load_recipe

    _, scored, paid, _ = run(13, changed=31, pool=PeerPool(PoolSettings(own_replay_limit=0.02)))
    assert scored[13].resubmitted == {"c04": ("c04@3",)} and scored[13].charged_back["c04"] == paid[3]["c04"] > 0
    assert own_replay_limit(load_recipe("tiny")) == 0.02 and own_replay_limit(load_recipe("general-nlp")) == 0.0
    with pytest.raises(InputError, match="own_replay_limit"):
        PoolSettings(own_replay_limit=0.5)
