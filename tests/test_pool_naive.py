"""The peer pool at two participants per round equals its naive reference (``fl.pool_naive``) on random federations:
honest clients, a flipper, a zero-submitter, a stale node (its first update, resubmitted byte for byte), a copier of
another client's earlier update (1% of its signs turned) and a retrainer close to its own earlier update (one sign
turned: no replay). What the naive reference leaves out is in its module's docstring."""

import numpy as np
import pytest

from kfca_llm.api import pack_updates
from kfca_llm.engine.duplicates import DuplicateRule
from kfca_llm.fl.peer_pool import PeerPool, PoolSettings, score_with_pool
from kfca_llm.fl.pool_settle import close_round
from kfca_llm.fl.pool_naive import naive_run

COORDS = 256
CLIENTS = 8
FLIP, ZERO, STALE, COPIER, RETRAINER = 1, 2, 3, 4, 5


def federation(seed: int, rounds: int) -> list[dict[str, list[float]]]:
    """Each round: two clients drawn at random, each submitting what its role says."""
    rng = np.random.default_rng(seed)
    persistent = rng.standard_normal(COORDS)
    direction = rng.standard_normal(COORDS)
    earlier: list[tuple[int, np.ndarray]] = []  # (client, submission) of every round so far
    mine: dict[int, np.ndarray] = {}  # each client's first submission
    out = []
    for _ in range(rounds):
        direction = -0.5 * direction + rng.standard_normal(COORDS)
        round_ = {}
        for c in sorted(rng.choice(CLIENTS, size=2, replace=False).tolist()):
            update = 0.4 * persistent + direction + rng.standard_normal(COORDS)
            if c == FLIP:
                update = -update
            elif c == ZERO:
                update = np.zeros(COORDS)
            elif c == STALE and c in mine:
                update = mine[c]
            elif c == COPIER and any(who not in (c, ZERO) for who, _ in earlier):
                update = next(u for who, u in reversed(earlier) if who not in (c, ZERO)).copy()
                update[:COORDS // 100] *= -1
            elif c == RETRAINER and c in mine:
                update = mine[c].copy()
                update[rng.integers(COORDS)] *= -1
            mine.setdefault(c, update)
            round_[f"c{c}"] = update
        earlier += [(int(name[1:]), u) for name, u in round_.items()]
        out.append({name: u.astype(np.float32).tolist() for name, u in round_.items()})
    return out


def real_run(rounds: list[dict[str, list[float]]], seeds: list[int], settings: PoolSettings) -> list[dict[str, float]]:
    """``score_with_pool`` and ``close_round`` round after round; a settled participant is paid its settlement."""
    pool, out = PeerPool(settings), []
    for t, (submissions, seed) in enumerate(zip(rounds, seeds), start=1):
        packer = pack_updates({c: {"w": np.array(u, dtype=np.float32)} for c, u in submissions.items()})
        scored = score_with_pool(packer, pool, t, seed=seed)
        out.append(dict(scored.report.rewards))
        for settled in close_round(pool, packer, t, scored, words=packer.words(), participants=packer.clients,
                                   seed=seed, penalty="expected", bonus_fraction=0.5, duplicates="zero",
                                   duplicate_rule=DuplicateRule()):
            out[settled.round - 1][settled.participant] = settled.reward
    return out


@pytest.mark.parametrize("rank_by", ["record", "verdict-first"])
@pytest.mark.parametrize("seed", range(12))
def test_the_pool_pays_what_the_naive_reference_pays(seed, rank_by):
    rounds = federation(seed, 18)
    seeds = [1000 * seed + t for t in range(1, 19)]
    window = 4 if seed % 2 else 10  # a short window: entries leave it, the run's record and sketch still count
    expected = naive_run(rounds, seeds, window=window, verdict_first=rank_by == "verdict-first")
    paid = real_run(rounds, seeds, PoolSettings(window=window, rank_by=rank_by))
    assert [sorted(r) for r in paid] == [sorted(r) for r in expected]
    for t, (got, want) in enumerate(zip(paid, expected), start=1):
        assert got == pytest.approx(want, abs=1e-12), f"round {t}"


def test_the_federations_meet_every_rule():
    """The random federations above reach each rule the naive reference covers, so the equality tests them all."""
    from kfca_llm.fl import pool_naive

    seen = set()
    original = pool_naive.score

    def spy(t, negative, *args, horizon=None, **kwargs):
        result = original(t, negative, *args, horizon=horizon, **kwargs)
        seen.update(f"{c} left out" for c in result.copies)
        seen.update("undetermined" for c in result.unsure if horizon is None)
        seen.update("settled" for c in negative if horizon is not None and c not in result.unsure)
        seen.update("charged back" for c in negative if result.paid[c] < min(result.scores[c], 0.0))
        seen.update("fined" for c in negative if c not in result.copies and result.paid[c] < 0)
        return result

    pool_naive.score = spy
    try:
        for seed in range(12):
            naive_run(federation(seed, 18), [1000 * seed + t for t in range(1, 19)], window=4 if seed % 2 else 10)
    finally:
        pool_naive.score = original
    assert {f"c{STALE} left out", f"c{ZERO} left out", f"c{COPIER} left out", "undetermined", "settled",
            "charged back", "fined"} <= seen
    assert f"c{RETRAINER} left out" not in seen
    # and the verdicts settle some disagreeing pairs otherwise than verdict plus record do
    differing = 0
    for seed in range(12):
        rounds, seeds = federation(seed, 18), [1000 * seed + t for t in range(1, 19)]
        record, first = (naive_run(rounds, seeds, window=4 if seed % 2 else 10, verdict_first=v) for v in (False, True))
        differing += sum(record[t][c] != first[t][c] for t in range(18) for c in record[t])
    assert differing > 0
