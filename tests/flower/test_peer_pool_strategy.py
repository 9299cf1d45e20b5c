"""KFCAStrategy at FlowerTune's scale: 20 nodes, ``FedAvg(fraction_train=0.1)`` (two per round), one flipper
(``pooled_strategy_run``): what the pool pays, which rounds are undetermined and settled later, what a resumed run
rebuilds, an own resubmission charged back. The ledger's side (verify, settlements, receipts): ``test_peer_pool_ledger``.
"""

import logging
import random
import re
import sys

import numpy as np
import pytest

pytest.importorskip("flwr", reason="Flower is the optional extra kfca-llm[flower] (make install installs it)")

from flwr.app import Array, ArrayRecord  # noqa: E402
from flwr.serverapp.strategy import FedAvg  # noqa: E402
from flower_local import SHAPES, LocalGrid, initial_arrays, pid, reply_with  # noqa: E402
from pooled_strategy_run import FLIPPER, NODES, ROUNDS, node, run, update  # noqa: E402

sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[1]))
from doc_pages import one_block  # noqa: E402

from kfca_llm.cli import main  # noqa: E402
from kfca_llm.flower import KFCAStrategy, read_ledger  # noqa: E402
from kfca_llm.fl.peer_pool import PoolSettings  # noqa: E402
from kfca_llm.fl.pool_policy import record  # noqa: E402
from kfca_llm.flower.ledger_rows import ledger_summary  # noqa: E402


def test_two_per_round_and_the_flippers_honest_partners_are_paid_more_than_zero_and_the_flipper(pooled):
    strategy, _, _ = pooled
    flipper, met = pid(FLIPPER), 0
    for t, rewards in strategy.rewards.items():
        assert len(rewards) == 2
        if flipper in rewards and t > 2:
            (partner,) = set(rewards) - {flipper}
            assert rewards[partner] > 0 and rewards[partner] > rewards[flipper], (t, rewards)
            met += 1
    assert met >= 3


def test_round_peers_only_pay_the_partner_what_the_flipper_is_paid(tmp_path):
    # Unconditioned: on this 436-coordinate layout the 64 public strata hold a task or two of each penalty set, and
    # their penalty estimates, not the pair, would decide the difference.
    strategy, _ = run(tmp_path / "off.sqlite", min_peers=0, public_steps=0)
    met = [r for t, r in strategy.rewards.items() if pid(FLIPPER) in r]
    # Symmetric up to the partition's noise: the honest partner is fined about what the flipper is.
    assert len(met) >= 3 and all(max(r.values()) < -0.05 and max(r.values()) - min(r.values()) < 0.02 for r in met)
    assert strategy.undetermined == {t: () for t in strategy.rewards}


def test_the_first_rounds_are_undetermined_in_the_ledger_and_the_metrics_and_later_rounds_are_not(pooled):
    # Round 2 borrows round 1's entries, but a lag's weight needs pool entries of two rounds: none yet; round 3's pool
    # holds round 2's, where the flipper trained, and round 1's, too few vetted participants to outvote it.
    strategy, result, ledger = pooled
    rounds = read_ledger(ledger).rounds
    assert [r.undetermined for r in rounds[:3]] == [tuple(sorted(strategy.rewards[t])) for t in (1, 2, 3)]
    assert all(r.undetermined == () for r in rounds[3:])
    metrics = result.train_metrics_clientapp
    assert metrics[1]["kfca.undetermined"] == 2 and metrics[1]["kfca.pool-peers"] == 0
    assert metrics[2]["kfca.undetermined"] == 2 and metrics[3]["kfca.undetermined"] == 2
    assert all(metrics[t]["kfca.undetermined"] == 0 and metrics[t]["kfca.pool-peers"] > 0 for t in range(4, ROUNDS + 1))
    assert sum(metrics[t]["kfca.settled"] for t in range(1, ROUNDS + 1)) == 6
    summary = {s["participant"]: s for s in ledger_summary(read_ledger(ledger))}
    assert sum(s["undetermined_rounds"] for s in summary.values()) == 6


def test_a_resumed_run_rebuilds_the_pool_from_the_ledger_with_its_scores_and_records(pooled):
    """What a resumed KFCAStrategy (and `kfca-llm verify`) rebuilds from the ledger is the pool the run had: the same
    entries, the same round scores (which entries are peers, each participant's record), so the same rewards."""
    from kfca_llm.flower.round_scoring import resumed_pool

    strategy, _, ledger = pooled
    rebuilt = resumed_pool(ledger, strategy.settings, strategy.run_id, ROUNDS, strategy.pool.settings)
    live_arrays, live_meta = strategy.pool.to_arrays()
    arrays, meta = rebuilt.to_arrays()
    assert meta == live_meta and live_arrays.keys() == arrays.keys()
    assert all(np.array_equal(live_arrays[k], arrays[k]) for k in arrays)
    participants = {p for r in strategy.rewards.values() for p in r}
    assert any(record(rebuilt, p, ROUNDS + 1) is not None for p in participants)
    for p in participants:
        assert record(rebuilt, p, ROUNDS + 1) == record(strategy.pool, p, ROUNDS + 1)
        assert ([e.name for e in rebuilt.candidates(ROUNDS + 1, p, [])]
                == [e.name for e in strategy.pool.candidates(ROUNDS + 1, p, [])])


def test_the_pools_scores_survive_its_saved_state():
    from kfca_llm.fl.peer_pool import PeerPool

    pool = PeerPool()
    words = {f"c{k}": np.full(4, k, np.int32) for k in range(4)}
    pool.add_round(1, dict(list(words.items())[:2]), {"c0": 0.2, "c1": -0.1})
    pool.add_round(2, dict(list(words.items())[2:]), {"c2": 0.05})
    back = PeerPool.from_arrays(pool.settings, *pool.to_arrays())
    assert [e.name for e in back.candidates(3, "x", [])] == [e.name for e in pool.candidates(3, "x", [])] == [
        "c2@2", "c3@2", "c0@1"]  # c1's entry scored < 0: no one's peer; c3's was not scored: a peer
    assert record(back, "c0", 3) == record(pool, "c0", 3) == pytest.approx(2 / 3 - 0.5)  # one good submission
    assert record(back, "c3", 3) is None


def paid(strategy) -> dict[int, dict[str, float]]:
    """Each round's rewards with the later settlements of its undetermined participants."""
    out = {t: dict(r) for t, r in strategy.rewards.items()}
    for settlements in strategy.settlements.values():
        for s in settlements:
            out[s.round][s.participant] = s.reward
    return out


def test_undetermined_rewards_are_not_paid_in_their_round_and_settled_by_a_later_one(pooled):
    strategy, _, ledger = pooled
    contents = read_ledger(ledger)
    rows = [r for r in contents.rewards if r.round in (1, 2, 3)]
    assert len(rows) == 6 and all(r.reward == 0.0 for r in rows) and all(r.unadjusted_reward != 0.0 for r in rows)
    # Every undetermined participant is settled within the window, by a later round, as the ledger records it.
    settled = [s for ss in strategy.settlements.values() for s in ss]
    assert sorted((s.round, s.participant) for s in settled) == sorted((r.round, r.participant) for r in rows)
    assert all(s.round < s.settled_in <= s.round + strategy.pool.settings.window for s in settled)
    assert sorted((s.round, s.participant, s.settled_in, s.reward) for s in contents.settlements) == sorted(
        (s.round, s.participant, s.settled_in, s.reward) for s in settled)
    assert strategy.pool.pending == {}
    # The flipper's honest partners are paid more than zero and more than the flipper, in every round, settled ones too.
    flipper, met = pid(FLIPPER), 0
    for t, rewards in paid(strategy).items():
        if flipper in rewards:
            (partner,) = set(rewards) - {flipper}
            assert rewards[partner] > 0 and rewards[partner] > rewards[flipper], (t, rewards)
            met += t == 2
    assert met == 1  # the flipper trained in an undetermined round (random.seed(7)'s draw)
    summary = ledger_summary(contents)
    assert sum(s["total"] for s in summary) == pytest.approx(sum(r for rs in paid(strategy).values() for r in rs.values()))
    assert sum(s["settled_rounds"] for s in summary) == 6


def test_the_log_says_why_a_round_is_undetermined_and_what_to_change(caplog):
    random.seed(3)
    strategy = KFCAStrategy(FedAvg(fraction_train=0.1, fraction_evaluate=0.0), ledger=None)
    with caplog.at_level(logging.WARNING, logger="flwr"):
        strategy.start(grid=LocalGrid({n: node for n in range(1, NODES + 1)}), initial_arrays=initial_arrays(),
                       num_rounds=1)
    text = "\n".join(r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)
    assert "round 1 is undetermined" in text and "min_peers=2" in text and "fraction_train" in text


def resending(resender: int, scale=lambda t: 1.0):
    """The pooled run's nodes, but ``resender`` sends the update of the first round it was sampled in again, times
    ``scale(round)``, on top of the global it is sent (as a Flower client returns ``global + update``)."""
    first = {}

    def nodes(message):
        n, t = message.metadata.dst_node_id, int(message.content["config"]["server-round"])
        if n != resender:
            return node(message)
        sent = {k: a.numpy() for k, a in message.content["arrays"].items()}
        delta = first.setdefault(n, update(n, t))
        return reply_with(message, ArrayRecord({k: Array(sent[k] + (u * scale(t)).astype(np.float32))
                                                for k, u in delta.items()}))

    return nodes


def test_a_stale_node_is_an_own_resubmission_charged_back_verified_and_logged(tmp_path, caplog):
    """Node 4 resubmits the update it trained the first time it was sampled (round 4, paid > 0): from then on a copy of
    its own pool entry, scored without the pool (its one in-round peer, the pool's term at 0) and paid at most 0; its
    first resubmission is charged what round 4 paid, once. Never a pool entry, reported in the ledger, the metrics and
    the log, and `kfca-llm verify` recomputes it (the rebuilt pool must know what round 4 paid)."""
    stale = 4
    nodes = resending(stale)
    random.seed(7)
    ledger = tmp_path / "stale.sqlite"
    strategy = KFCAStrategy(FedAvg(fraction_train=0.1, fraction_evaluate=0.0), ledger=ledger, keep_signs=True)
    with caplog.at_level(logging.WARNING, logger="flwr"):
        result = strategy.start(grid=LocalGrid({n: nodes for n in range(1, NODES + 1)}),
                                initial_arrays=initial_arrays(), num_rounds=ROUNDS)
    rounds = sorted(t for t, r in strategy.rewards.items() if pid(stale) in r)
    assert rounds == [4, 12, 20, 23]
    rows = {r.round: r for r in read_ledger(ledger).rewards if r.participant == pid(stale)}
    honest_first = rows[4].reward
    assert honest_first > 0 and rows[4].duplicate_group is None
    for t in rounds[1:]:
        report, row = strategy.reports[t], rows[t]
        assert report.peers[pid(stale)] == list(set(report.rewards) - {pid(stale)})  # no pool peer
        assert row.duplicate_group == (pid(stale), f"{pid(stale)}@4")
        # scored on its one peer beside the pool's term (0 at the pool's weight), determined; a copy: paid at most
        # that and 0, and the first resubmission charged what round 4 paid
        assert pid(stale) not in strategy.undetermined.get(t, ())
        peer = next(p for p in report.peers[pid(stale)])
        assert row.unadjusted_reward == pytest.approx(report.pairwise[(pid(stale), peer)] / (1 + PoolSettings().weight),
                                                      rel=1e-12)
        charged = honest_first if t == 12 else 0.0
        assert row.reward == min(row.unadjusted_reward, 0.0) - charged
        assert result.train_metrics_clientapp[t]["kfca.own-resubmissions"] == 1
        assert result.train_metrics_clientapp[t]["kfca.charged-back"] == charged
        assert f"round {t}: {pid(stale)} resubmitted an earlier update of their own" in caplog.text
    assert all(result.train_metrics_clientapp[t]["kfca.own-resubmissions"] == 0 for t in strategy.rewards
               if t not in rounds[1:])
    # The stale node's balance: its one honest update paid, then charged back: at most 0, below every honest node's.
    totals = read_ledger(ledger).totals()
    assert totals[pid(stale)] <= 0 < min(v for who, v in totals.items() if who not in (pid(stale), pid(FLIPPER)))
    # docs/few-peers.md shows the line of the first resubmission (round 12)
    shown = one_block("docs/few-peers.md", "text", "resubmitted an earlier update").strip()
    assert re.sub(r"\bA\b", pid(stale), shown) in caplog.text
    assert main(["verify", str(ledger)]) == 0


def test_a_retrain_repeating_every_sign_with_other_values_is_no_resubmission(tmp_path):
    """Node 4 sends, whenever sampled after round 4, its round-4 update with every value scaled by its own factor in
    [0.7, 1.3] (as an honest retrain late in FlowerTune's static data order: every sign repeated, no value): pool
    rule 11 scores it as a fresh submission, never a resubmission charged back; the ledger keeps the round's value
    sketches, `kfca-llm verify` judges on them too, and a resumed run's pool holds them."""
    from kfca_llm.flower.round_scoring import resumed_pool

    retrainer = 4
    nodes = resending(retrainer, lambda t: np.random.default_rng(t).uniform(0.7, 1.3))
    random.seed(7)
    ledger = tmp_path / "retrain.sqlite"
    strategy = KFCAStrategy(FedAvg(fraction_train=0.1, fraction_evaluate=0.0), ledger=ledger, keep_signs=True)
    result = strategy.start(grid=LocalGrid({n: nodes for n in range(1, NODES + 1)}), initial_arrays=initial_arrays(),
                            num_rounds=ROUNDS)
    rows = {r.round: r for r in read_ledger(ledger).rewards if r.participant == pid(retrainer)}
    assert sorted(rows) == [4, 12, 20, 23]
    # every sign as round 4's (what rule 10 took for a replay), and never a resubmission
    assert {r.sign_sha256 for r in rows.values()} == {rows[4].sign_sha256}
    assert all(r.duplicate_group is None for r in rows.values())
    assert all(result.train_metrics_clientapp[t]["kfca.own-resubmissions"] == 0 for t in strategy.rewards)
    assert all(result.train_metrics_clientapp[t]["kfca.charged-back"] == 0 for t in strategy.rewards)
    assert all(strategy.reports[t].peers[pid(retrainer)] != list(set(strategy.reports[t].rewards) - {pid(retrainer)})
               for t in (12, 20, 23))  # pool peers beside its in-round one
    assert main(["verify", str(ledger)]) == 0
    again = resumed_pool(ledger, strategy.settings, strategy.run_id, ROUNDS, strategy.pool.settings)
    names = [name for name, _ in strategy.pool.sketches()]
    assert names == [name for name, _ in again.sketches()]
    assert all(np.array_equal(strategy.pool.values_of(name), again.values_of(name)) for name in names)
    assert strategy.pool.values_of(f"{pid(retrainer)}@4").shape == (2, sum(np.prod(s) for s in SHAPES.values()))


def test_a_resumed_run_keeps_the_undetermined_rounds_waiting_to_be_settled(pooled):
    from kfca_llm.flower.round_scoring import resumed_pool

    strategy, _, ledger = pooled
    rebuilt = resumed_pool(ledger, strategy.settings, strategy.run_id, 3, strategy.pool.settings)
    assert sorted(rebuilt.pending) == [1, 2, 3]
    for t in (1, 2, 3):
        assert rebuilt.pending[t].waiting == tuple(sorted(strategy.rewards[t]))
        assert sorted(rebuilt.pending[t].words) == sorted(strategy.rewards[t])
    # After the round that settled round 2 (and none of round 1 or 3 yet), only those wait.
    first = min(s.settled_in for ss in strategy.settlements.values() for s in ss)
    later = resumed_pool(ledger, strategy.settings, strategy.run_id, first, strategy.pool.settings)
    still = {s.round for ss in strategy.settlements.values() for s in ss if s.settled_in > first}
    assert sorted(later.pending) == sorted(still)
