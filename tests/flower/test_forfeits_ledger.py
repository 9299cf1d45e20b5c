"""Pool rule 8 in a Flower run: a sleeper (honest in its first two participations, flipping from its third) forfeits
at its turn what its honest updates were paid; the ledger records the charge in the turn's reward, and ``verify``
rebuilds the forfeits from the ledger (``fl.pool_close``) and matches every round."""

import random

import numpy as np
import pytest

pytest.importorskip("flwr", reason="Flower is the optional extra kfca-llm[flower] (make install installs it)")

from flower_local import LocalGrid, initial_arrays, pid, reply_with  # noqa: E402
from flwr.app import Array, ArrayRecord  # noqa: E402
from flwr.serverapp.strategy import FedAvg  # noqa: E402
from pooled_strategy_run import FLIPPER, NODES, ROUNDS, update  # noqa: E402

from kfca_llm.flower import KFCAStrategy, read_ledger  # noqa: E402
from kfca_llm.flower.audit import verify_ledger  # noqa: E402

SLEEPER, TURN = FLIPPER, 7  # the pooled run's node 2 trains in rounds 2 (undetermined), 5, 7, 11, 14, 16, 17


def own_direction(n: int) -> dict[str, np.ndarray]:
    """Node ``n``'s own data direction: a client trains on its own data, so its updates correlate with each other more
    than with other nodes'. (Without it, in the pooled run's 436 coordinates, the sleeper's turn correlates with its
    honest update only -2.4 standard errors: pool rule 20 asks a reversal to run against the previous update by 3.)"""
    rng = np.random.default_rng(31 * n + 3)
    return {k: (0.8 * rng.standard_normal(u.shape)).astype(np.float32) * 0.01 for k, u in update(n, 1).items()}


def node(message):
    n, t = message.metadata.dst_node_id, int(message.content["config"]["server-round"])
    sent = {k: a.numpy() for k, a in message.content["arrays"].items()}
    sign = -1.0 if n == SLEEPER and t >= TURN else 1.0
    own = own_direction(n)
    return reply_with(message, ArrayRecord({k: Array(sent[k] + sign * (u + own[k])) for k, u in update(n, t).items()}))


def test_a_sleeper_forfeits_its_honest_pay_at_its_turn_and_verify_rebuilds_it(tmp_path):
    ledger = tmp_path / "rewards.sqlite"
    random.seed(7)  # FedAvg samples its nodes with the random module: the pooled run's draws
    strategy = KFCAStrategy(FedAvg(fraction_train=0.1, fraction_evaluate=0.0), ledger=ledger, keep_signs=True)
    result = strategy.start(grid=LocalGrid({n: node for n in range(1, NODES + 1)}), initial_arrays=initial_arrays(),
                            num_rounds=ROUNDS)
    contents = read_ledger(ledger)
    sleeper = pid(SLEEPER)
    rounds = sorted(r.round for r in contents.rewards if r.participant == sleeper)
    assert rounds[:3] == [2, 5, TURN]
    paid = {r.round: r.reward for r in contents.rewards if r.participant == sleeper}
    paid |= {s.round: s.reward for s in contents.settlements if s.participant == sleeper}
    honest_pay = sum(max(paid[t], 0.0) for t in rounds[:2])
    assert honest_pay > 0
    # the turn is paid at most 0, less its honest rounds' pay (the strategy's metric says what it forfeited)
    turn = next(r for r in contents.rewards if r.participant == sleeper and r.round == TURN)
    forfeited = result.train_metrics_clientapp[TURN]["kfca.forfeited"]
    assert forfeited == pytest.approx(honest_pay) and turn.reward == min(turn.unadjusted_reward, 0.0) - forfeited
    # so the sleeper ends the run below every node that trained
    totals = {}
    for row in [*contents.rewards, *contents.settlements]:
        totals[row.participant] = totals.get(row.participant, 0.0) + row.reward
    assert sum(paid.values()) < 0 and totals[sleeper] < min(v for p, v in totals.items() if p != sleeper)
    # verify rebuilds the pool from the ledger, forfeits and their marks included: every round matches
    check = verify_ledger(ledger)
    assert check.chain_errors == [] and len(check.rounds) == ROUNDS
    assert all(r.status == "match" for r in check.rounds), [(r.round, r.status, r.detail) for r in check.rounds]
