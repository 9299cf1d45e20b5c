"""A trusted reference (``kfca_llm.fl.reference``): the server's own update as a peer of every participant.

Two participants per round, one of them a sign flipper, no pool yet: round peers alone pay both the same; a
reference (an honest update of the round, as the server's training on clean rows gives) tells them apart.
"""

import numpy as np
import pytest

from kfca_llm import InputError
from kfca_llm.api import pack_updates
from kfca_llm.fl.peer_pool import PeerPool, PoolSettings, score_with_pool
from kfca_llm.fl.reference import REFERENCE, reference_signs

from pool_updates import SCHEDULE, honest, round_updates

SERVER = 99  # the reference's own noise: an honest update no participant sent


def scored(t, clients, deviations=None, *, reference_weight=4.0, pool=None, reference=None):
    packer = pack_updates(round_updates(t, clients, deviations))
    signs = reference_signs(packer, honest(SERVER, t) if reference is None else reference)
    return score_with_pool(packer, pool, t, seed=t, reference=signs, reference_weight=reference_weight)


def test_with_a_reference_the_honest_partner_of_a_flipper_is_paid_and_the_flipper_fined():
    for t in (3, 8, 11):
        rewards = scored(t, (1, 3), {3: "flip"}).report.rewards
        assert rewards["c01"] > 0 > rewards["c03"], (t, rewards)


def test_a_round_with_a_reference_is_not_undetermined_and_the_pool_alone_leaves_it_so():
    # min_peers 3: the partner and the reference alone are two distinct peers, still not undetermined.
    pool = PeerPool(PoolSettings(min_peers=3))
    assert score_with_pool(pack_updates(round_updates(1, (1, 3), {3: "flip"})), pool, 1, seed=1).undetermined
    assert scored(1, (1, 3), {3: "flip"}, pool=PeerPool(PoolSettings(min_peers=3))).undetermined == ()


def test_reference_weight_zero_gives_the_reference_free_rewards_bit_for_bit():
    for t, clients in SCHEDULE.items():
        packer = pack_updates(round_updates(t, clients, {3: "flip"}))
        without = score_with_pool(packer, None, t, seed=t).report.rewards
        assert scored(t, clients, {3: "flip"}, reference_weight=0).report.rewards == without
    # ... and a weightless reference decides nothing: round 1 with an empty pool stays undetermined.
    assert scored(1, (1, 3), {3: "flip"}, reference_weight=0, pool=PeerPool(PoolSettings())).undetermined


def test_the_reference_is_a_weighted_peer_never_paid_and_never_pooled():
    pool = PeerPool(PoolSettings(min_peers=0))
    round_ = scored(8, (1, 3, 5), {3: "flip"}, reference_weight=2.0, pool=pool)
    report = round_.report
    assert REFERENCE not in report.rewards and all(REFERENCE in report.peers[c] for c in report.rewards)
    for client in ("c01", "c03", "c05"):
        payments = {p: report.pairwise[(client, p)] for p in report.peers[client]}
        in_round = [pay for p, pay in payments.items() if p != REFERENCE]
        expected = (sum(in_round) + 2.0 * payments[REFERENCE]) / (len(in_round) + 2.0)
        assert report.rewards[client] == pytest.approx(expected, abs=1e-12)


def test_a_misshapen_or_non_finite_reference_is_a_clear_input_error():
    packer = pack_updates(round_updates(1, (1, 3)))
    with pytest.raises(InputError, match=r"shape.*differs.*\(reference\)|\(reference\).*shape"):
        reference_signs(packer, {"w": np.zeros((3, 3), np.float32)})
    bad = honest(SERVER, 1)["w"].copy()
    bad[0, 0] = np.nan
    with pytest.raises(InputError, match="NaN") as error:
        reference_signs(packer, {"w": bad})
    assert REFERENCE in str(error.value)
    with pytest.raises(InputError, match="missing"):
        reference_signs(packer, {})
    with pytest.raises(InputError, match="reference"):
        score_with_pool(packer, None, 1, seed=1, reference=np.zeros(3, np.int32))
    with pytest.raises(InputError, match="reference weight"):
        score_with_pool(packer, None, 1, seed=1, reference=reference_signs(packer, honest(SERVER, 1)),
                        reference_weight=-1.0)


def test_simulate_reference_rows_pays_the_flippers_partner_in_a_round_with_no_pool():
    from helpers import short_recipe

    from kfca_llm.fl.rounds import FederationOptions, run_federation

    base = ["num-clients=20", "strategy.fraction-train=0.1", "dataset.num-rows=200", 'kfca.attackers=["3=flip"]',
            "kfca.min-peers=0", "num-server-rounds=6", 'kfca.attacks=["honest"]']
    with_reference = run_federation(short_recipe(*base, "kfca.reference-rows=16"), FederationOptions(progress=False))
    met = [r for r in with_reference.rounds if "client-003" in r.fixed_attacker_rewards]
    assert met, "client 3 never trained: pick another seed"
    for r in met:
        (partner,) = r.honest_rewards.values()
        assert partner > 0 > r.fixed_attacker_rewards["client-003"], r.round
        assert r.undetermined == [] and not r.pool_peers
    weightless = run_federation(short_recipe(*base, "kfca.reference-rows=16", "kfca.reference-weight=0"),
                                FederationOptions(progress=False))
    without = run_federation(short_recipe(*base), FederationOptions(progress=False))
    assert [r.honest_rewards for r in weightless.rounds] == [r.honest_rewards for r in without.rounds]
    assert [r.fixed_attacker_rewards for r in weightless.rounds] == [r.fixed_attacker_rewards for r in without.rounds]
