"""The issue's done-when run replayed on captured honest updates (``bench_few_peers.py --done-when``): 20 nodes, two
drawn a round as Flower draws them, nodes 3, 7, 11, 15 deviating (flip, zero, random, stale, or ``--attackers``), the
default pool scoring each round; counts the meetings of an honest node with a node that flipped that round."""

from __future__ import annotations

import numpy as np
import torch

from kfca_llm.api import pack_updates
from kfca_llm.attacks import resolve_attack
from kfca_llm.engine.duplicates import DuplicateRule
from kfca_llm.fl.peer_pool import PeerPool, PoolSettings, score_with_pool
from kfca_llm.fl.pool_close import ClosingRound, close_round
from kfca_llm.fl.reference import REFERENCE
from kfca_llm.fl.rounds import attack_context
from kfca_llm.fl.seeds import KFCA, client_id, derive_seed


def close_defaults(pool: PeerPool, packer, t: int, scored, seed: int) -> list:
    """``close_round`` with the default scoring settings every setting here scores with: the round joins the pool, is
    kept pending where undetermined, and what the pool can settle is returned."""
    return close_round(pool, ClosingRound.scored(packer, t, scored, words=packer.words(), participants=packer.clients,
                                                 seed=seed, penalty="expected", bonus_fraction=0.5, duplicates="zero",
                                                 duplicate_rule=DuplicateRule()))


DONE_WHEN = {3: "flip", 7: "zero", 11: "random", 15: "stale"}
"""The issue's done-when run: four deviating nodes of 20 (flower_few_peers.py's default attackers)."""


NEXT_ROUND = False
"""Pool rule 15 reads the round after a disagreeing pair, which FedAvg moved with the pair's updates. Here every
round after a deviation is the honest federation's, which never aggregated it, so the replays run with that rule off
(``PoolSettings.next_round``); the Flower benchmarks, whose FedAvg aggregates the deviations, measure it
(benchmarks/ROBUSTNESS.md, pool rule 15)."""


def done_when_replay(updates, seed: int, start: int, length: int, own_replay_limit: float = 0.0,
                     attackers: dict[int, str] = DONE_WHEN, rank_by: str = "record") -> dict:
    """One replay of the done-when run on captured honest updates: each round's updates go to two nodes drawn
    uniformly (as Flower samples; the capture's own sampling keeps its analysis client in every round), nodes 3, 7,
    11, 15 deviate (``attackers``), and the default pool scores the round. Returns the meeting counts of an honest node
    with a node that flipped its update that round, and whether every deviator's mean reward is below every honest
    node's."""
    rng = np.random.default_rng(seed)
    ids = [client_id(i) for i in range(20)]
    deviating = {client_id(i): spec for i, spec in attackers.items()}
    history: dict[str, list] = {c: [] for c in deviating}
    pool = PeerPool(PoolSettings(own_replay_limit=own_replay_limit, rank_by=rank_by, next_round=NEXT_ROUND))
    paid, meetings, unsure, settled = {}, [], {}, set()
    for t in range(1, length + 1):
        cached = [u for c, u in sorted(updates[start + t - 1].items()) if c != REFERENCE]
        clients = {ids[d]: u for d, u in zip(sorted(rng.choice(20, size=len(cached), replace=False).tolist()), cached)}
        honest = {c: {k: torch.from_numpy(v) for k, v in u.items()} for c, u in clients.items()}
        submitted, flipped = {}, set()
        for c, u in sorted(clients.items()):
            if c in deviating:
                context = attack_context(seed, t, c, f"{c}={deviating[c]}", honest, history[c])
                submitted[c] = {k: v.numpy() for k, v in resolve_attack(deviating[c]).submit(context).items()}
                history[c].append(honest[c])
                if all(np.array_equal(submitted[c][k], -u[k]) and u[k].any() for k in u):
                    flipped.add(c)
            else:
                submitted[c] = u
        packer = pack_updates(submitted)
        scored = score_with_pool(packer, pool, t, seed=derive_seed(0, KFCA, t))
        paid[t], unsure[t] = dict(scored.report.rewards), set(scored.undetermined)
        for done in close_defaults(pool, packer, t, scored, derive_seed(0, KFCA, t)):
            paid[done.round][done.participant] = done.reward
            settled.add((done.round, done.participant))
        flipper = next(iter(sorted(flipped)), None)
        meetings += [(t, c, flipper) for c in paid[t] if flipper and c not in deviating]
    # A meeting whose partner was never paid (undetermined, not settled) is counted apart: neither side was paid.
    open_ = [(t, c, f) for t, c, f in meetings if c in unsure[t] and (t, c) not in settled]
    judged = [(t, c, f) for t, c, f in meetings if (t, c, f) not in open_]
    good = sum(paid[t][c] > 0 and paid[t][c] > paid[t][f] for t, c, f in judged)
    totals: dict[str, list[float]] = {}
    for rewards in paid.values():
        for c, r in rewards.items():
            totals.setdefault(c, []).append(r)
    means = {c: float(np.mean(v)) for c, v in totals.items()}
    ordered = max(m for c, m in means.items() if c in deviating) < min(m for c, m in means.items() if c not in deviating)
    return {"met": len(judged), "good": good, "unpaid": len(open_), "ordered": ordered,
            "misranked": [t for t, c, f in judged if not (paid[t][c] > 0 and paid[t][c] > paid[t][f])]}


def done_when_table(updates, seeds: int, length: int = 60, own_replay_limit: float = 0.0,
                    attackers: dict[int, str] = DONE_WHEN, rank_by: str = "record") -> str:
    """``done_when_replay`` over ``seeds`` draws in each window of ``length`` rounds (starts 70 rounds apart)."""
    length = min(length, len(updates))
    lines = ["| window | replays | partners paid > 0 and > flipper (paid rounds) | meetings never settled (neither "
             "paid) | replays: every meeting right | replays: deviators below honest | replays: both |",
             "|---|---|---|---|---|---|---|"]
    for start in range(1, len(updates) - length + 2, 70):
        runs = [done_when_replay(updates, seed, start, length, own_replay_limit, attackers, rank_by)
                for seed in range(seeds)]
        right = [r["good"] == r["met"] for r in runs]
        lines.append(f"| rounds {start}-{start + length - 1} | {seeds} | {sum(r['good'] for r in runs)}/"
                     f"{sum(r['met'] for r in runs)} | {sum(r['unpaid'] for r in runs)} | {sum(right)} | "
                     f"{sum(r['ordered'] for r in runs)} | {sum(a and r['ordered'] for a, r in zip(right, runs))} |")
    return "\n".join(lines)
