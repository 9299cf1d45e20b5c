"""Free riders at FlowerTune's scale (20 nodes, two per round, ``KFCAStrategy``'s defaults): nodes that train
nothing and replay the global's change since they last received one (Lin et al. 2019; Fraboni et al. 2021), rescaled
to an honest update's norm. The public strata (``engine.public``, every pair of a round, pool pairs included) pay them
about nothing; without them (``public_steps=0``) the pool pays them like honest nodes.

The honest updates are pooled_strategy_run's: a persistent direction (what the global's trajectory shows), a
direction of the round (what only this round's trainers share) and each node's noise.
"""

import random

import numpy as np
import pytest

pytest.importorskip("flwr", reason="Flower is the optional extra kfca-llm[flower] (make install installs it)")

from flwr.app import Array, ArrayRecord  # noqa: E402
from flwr.serverapp.strategy import FedAvg  # noqa: E402
from flower_local import LocalGrid, initial_arrays, pid, reply_with  # noqa: E402
from pooled_strategy_run import NODES, update  # noqa: E402

from kfca_llm.flower import KFCAStrategy, verify_ledger  # noqa: E402

ROUNDS, FREE_RIDERS = 40, (4, 9, 15)


def run(ledger, **options) -> KFCAStrategy:
    received: dict[int, dict[str, np.ndarray]] = {}

    def node(message):
        n, t = message.metadata.dst_node_id, int(message.content["config"]["server-round"])
        sent = {k: a.numpy() for k, a in message.content["arrays"].items()}
        honest = update(n, t)
        if n in FREE_RIDERS:  # the change since it last received a global (none the first time), at the honest norm
            last = received.get(n, sent)
            received[n] = sent
            change = {k: sent[k] - last[k] for k in sent}
            honest = {k: c * (np.linalg.norm(honest[k]) / np.linalg.norm(c)) if np.linalg.norm(c) > 0 else c
                      for k, c in change.items()}
        return reply_with(message, ArrayRecord({k: Array(sent[k] + u) for k, u in honest.items()}))

    random.seed(11)  # FedAvg samples its nodes with the random module
    strategy = KFCAStrategy(FedAvg(fraction_train=0.1, fraction_evaluate=0.0), ledger=ledger, keep_signs=True,
                            **options)
    strategy.start(grid=LocalGrid({n: node for n in range(1, NODES + 1)}), initial_arrays=initial_arrays(),
                   num_rounds=ROUNDS)
    return strategy


def paid(strategy: KFCAStrategy) -> dict[int, dict[str, float]]:
    """Round -> participant -> what it was paid for that round: in the round, or by the later round that settled it
    (an undetermined round, or a disagreeing pair that waited for the round after it: pool rule 15)."""
    out = {t: dict(r) for t, r in strategy.rewards.items()}
    for settlements in strategy.settlements.values():
        for settled in settlements:
            out[settled.round][settled.participant] = settled.reward
    return out


def means(strategy: KFCAStrategy) -> tuple[float, float, int]:
    """(the free riders' mean reward over their replays, the honest nodes' mean reward, the replays paid)."""
    riders, rewards = {pid(n) for n in FREE_RIDERS}, paid(strategy)
    replays = [v for who in riders for v in [r[who] for t, r in sorted(rewards.items()) if who in r][1:]]
    honest = [v for r in rewards.values() for who, v in r.items() if who not in riders]
    return float(np.mean(replays)), float(np.mean(honest)), len(replays)  # a first reply replays nothing (zero)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("free-rider")
    return run(folder / "on.sqlite"), run(folder / "off.sqlite", public_steps=0), folder / "on.sqlite"


def test_the_public_strata_pay_a_replay_of_the_globals_change_about_nothing(runs):
    conditioned, unconditioned, _ = runs
    rider, honest, replays = means(conditioned)
    assert replays >= 6 and honest > 0
    assert abs(rider) <= 0.1 * honest, (rider, honest)
    # Without the strata the same replays are paid like honest work: what the conditioning removes.
    rider_off, honest_off, _ = means(unconditioned)
    assert rider_off > 0.5 * honest_off > 0, (rider_off, honest_off)


def test_the_conditioned_pool_rounds_verify(runs):
    """Pool pairs are scored within the round's strata too: verify rebuilds the pool and recomputes every round."""
    check = verify_ledger(runs[2])
    assert check.ok and {r.status for r in check.rounds} == {"match"}


# Two free riders, nodes 4 and 9, each sampled with an honest node in between (rounds 3 and 5, 15 and 13, 23 and 25)
# and meeting each other in rounds 10, 20 and 30 with reception gaps 7 and 5 (no doubling span, and a round too long
# neither); every other round two honest nodes drawn at random. A free rider replays the global's change since its
# previous reception (its first reply is zeros): node 4 rescaled, node 9 its signs with magnitudes of its own.
MEETINGS, ALONE = (10, 20, 30), {3: 4, 5: 9, 13: 9, 15: 4, 23: 4, 25: 9}
HONEST_NODES = [n for n in range(1, NODES + 1) if n not in (4, 9)]


def schedule(t: int, meetings=MEETINGS, alone=ALONE) -> list[int]:
    if t in meetings:
        return [4, 9]
    honest = np.random.default_rng(t).choice(HONEST_NODES, 2, replace=False).tolist()
    return sorted([alone[t], honest[0]] if t in alone else honest)


BIG = {"a.lora_A": (64, 128), "b.lora_B": (128, 64)}  # 16k coordinates: tasks of both sets in most of 64 strata
BIG_PERSISTENT = {k: np.random.default_rng(5).standard_normal(s) for k, s in BIG.items()}


def big_update(node: int, t: int) -> dict[str, np.ndarray]:
    """pooled_strategy_run's honest update over ``BIG``."""
    this_round, own = np.random.default_rng(1000 + t), np.random.default_rng(7919 * node + t)
    return {k: (0.6 * BIG_PERSISTENT[k] + 0.6 * this_round.standard_normal(s) + own.standard_normal(s)).astype(
        np.float32) * 0.01 for k, s in BIG.items()}


def run_planted(meetings=MEETINGS, alone=ALONE, **options) -> KFCAStrategy:
    from flwr.app import MessageType, RecordDict

    class Scheduled(FedAvg):
        def configure_train(self, server_round, arrays, config, grid):
            config["server-round"] = server_round
            record = RecordDict({self.arrayrecord_key: arrays, self.configrecord_key: config})
            return self._construct_messages(record, schedule(server_round, meetings, alone), MessageType.TRAIN)

    received: dict[int, dict[str, np.ndarray]] = {}

    def node(message):
        n, t = message.metadata.dst_node_id, int(message.content["config"]["server-round"])
        sent = {k: a.numpy() for k, a in message.content["arrays"].items()}
        honest = big_update(n, t)
        if n in (4, 9):
            last = received.get(n, sent)
            received[n] = sent
            change = {k: sent[k] - last[k] for k in sent}
            if n == 4:  # free-ride:1
                honest = {k: c * (np.linalg.norm(honest[k]) / max(np.linalg.norm(c), 1e-30)) for k, c in change.items()}
            else:  # free-ride-signs:1
                noise = np.random.default_rng(t)
                honest = {k: np.sign(c) * np.abs(noise.standard_normal(c.shape)).astype(np.float32) * 0.01
                          for k, c in change.items()}
        return reply_with(message, ArrayRecord({k: Array(sent[k] + u) for k, u in honest.items()}))

    strategy = KFCAStrategy(Scheduled(fraction_train=0.1, fraction_evaluate=0.0), ledger=None, **options)
    start = ArrayRecord({k: Array(np.zeros(s, dtype=np.float32)) for k, s in BIG.items()})
    strategy.start(grid=LocalGrid({n: node for n in range(1, NODES + 1)}), initial_arrays=start,
                   num_rounds=max(meetings))
    return strategy


def meeting_pay(strategy: KFCAStrategy, meetings=MEETINGS) -> list[float]:
    return [strategy.rewards[t][pid(n)] for t in meetings for n in (4, 9)]


def honest_mean(strategy: KFCAStrategy) -> float:
    return float(np.mean([v for r in strategy.rewards.values() for who, v in r.items() if who not in (pid(4), pid(9))]))


def test_two_free_riders_meeting_are_paid_about_nothing_within_their_own_reception_gaps(monkeypatch):
    """The round's strata hold the change over each participant's own reception gap (``PublicTrajectory.gaps``):
    two free riders meeting are paid about 0, though the doubling spans 1, 2, 4, 8, 16 hold neither one's change.
    Without the reception planes, or with every gap a round too long, the same meetings pay them."""
    from kfca_llm.flower.round_scoring import PublicTrajectory

    with_gaps = run_planted()
    honest = honest_mean(with_gaps)
    assert honest > 0
    paid = meeting_pay(with_gaps)
    assert max(map(abs, paid)) < 0.1 * honest and np.mean(np.abs(paid)) < 0.03 * honest, (paid, honest)  # 4.5%, 1.2%
    gaps = PublicTrajectory.gaps
    monkeypatch.setattr(PublicTrajectory, "gaps", lambda self, nodes: [])
    without = run_planted()
    monkeypatch.setattr(PublicTrajectory, "gaps", lambda self, nodes: [g + 1 for g in gaps(self, nodes)])
    off_by_one = run_planted()
    assert np.mean(meeting_pay(without)) > 0.25 * honest_mean(without), meeting_pay(without)  # 39%
    assert min(meeting_pay(off_by_one)) > 0, meeting_pay(off_by_one)
    assert np.mean(meeting_pay(off_by_one)) > 0.1 * honest_mean(off_by_one), meeting_pay(off_by_one)  # 15%


# The same two free riders back after more than the 16 steps the strata sum: alone in rounds 2 and 4 and 34 and 38,
# meeting in rounds 30 (gaps 28 and 26) and 58 (gaps 24 and 20), as live F-1's two free riders met in its round 43
# back after 26 and 31 rounds (benchmarks/ROBUSTNESS.md, "Free riders under pool rule 19").
LONG_MEETINGS, LONG_ALONE = (30, 58), {2: 4, 4: 9, 34: 4, 38: 9}


def test_two_free_riders_back_after_more_rounds_than_the_steps_are_paid_about_nothing(monkeypatch):
    """The strategy keeps the global each node was last sent until it returns (``PublicTrajectory.changes``), so a
    gap longer than the 16 steps is a plane of its own: the change since that global, what each replays. Clipped to
    the 16 steps (no such global kept), the older part of both replays stands outside the strata and they agree
    there: paid as F-1's were."""
    from kfca_llm.flower.round_scoring import PublicTrajectory

    def settled_pay(strategy):  # the pool holds both meetings undetermined (a pair of replays); settled later
        return [paid(strategy)[t][pid(n)] for t in LONG_MEETINGS for n in (4, 9)]

    kept = run_planted(LONG_MEETINGS, LONG_ALONE)
    honest, pay = honest_mean(kept), settled_pay(kept)
    assert honest > 0 and max(map(abs, pay)) < 0.1 * honest, (pay, honest)  # at most 4.3%
    monkeypatch.setattr(PublicTrajectory, "changes", lambda self, nodes: {})
    clipped = run_planted(LONG_MEETINGS, LONG_ALONE)
    assert min(settled_pay(clipped)) > 0.5 * honest_mean(clipped), settled_pay(clipped)  # 72% to 123%


def test_the_ledger_records_each_rounds_spans_with_its_participants_reception_gaps(runs, tmp_path):
    """``public_steps`` counts the round's sign planes, ``public_spans`` lists their spans: the participants'
    reception gaps (rounds since each was last sent a global; one longer than the 16 steps kept is the change since
    that global, which the strategy keeps) among them. The chain covers the spans: a ledger whose spans were edited
    does not verify."""
    import shutil
    import sqlite3

    from kfca_llm.flower import read_ledger

    ledger = runs[2]
    contents = read_ledger(ledger)
    last: dict[str, int] = {}
    checked, longer, edited_round = 0, 0, None
    for row in sorted(contents.rounds, key=lambda r: r.round):
        t = row.round
        nodes = [r.node_id for r in contents.rewards if r.round == t]
        if row.public_steps is not None:
            assert len(row.public_spans) == row.public_steps <= 5 and list(row.public_spans) == sorted(row.public_spans)
            gaps = {t - last[n] for n in nodes if n in last}
            assert gaps <= set(row.public_spans), (t, gaps, row.public_spans)
            if gaps - {1, 2, 4, 8, 16}:
                checked, edited_round = checked + 1, t
            longer += max(gaps, default=0) > 16
        last.update(dict.fromkeys(nodes, t))
    assert checked >= 5 and longer >= 2, (checked, longer)  # gaps no doubling span holds; longer than the steps
    edited = tmp_path / "edited.sqlite"
    shutil.copy(ledger, edited)
    shutil.copytree(f"{ledger}.d", f"{edited}.d")
    with sqlite3.connect(edited) as conn:
        conn.execute("UPDATE rounds SET public_spans = '[1,2,4,8,16]' WHERE round = ?", (edited_round,))
    check = verify_ledger(edited)
    assert not check.ok and any(f"round {edited_round}: its rows do not hash" in e for e in check.chain_errors)
