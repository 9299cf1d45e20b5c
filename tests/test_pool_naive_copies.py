"""Copies and own replays in the naive reference (``fl.pool_naive``), on the random federations and real run of
``naive_federations``: an honest retrain is no replay under the default limit, an own replay is a replay at exactly
``own_replay_limit`` and must be a copy first, and no copy is found while the window holds no entry; where the pool
runs too, it pays what the naive reference pays."""

import numpy as np
import pytest
from naive_federations import RETRAINER, Federation, case, federation_of, naive_of, real_run

from kfca_llm.fl.peer_pool import PoolSettings
from kfca_llm.fl.pool_naive import naive_run


def test_an_honest_retrain_is_no_replay_under_the_default_limit():
    """Under ``own_replay_limit`` 0 the retrainer (1 to 3% of its first update's signs turned) is never a copy within
    the window, where every sign is compared."""
    from kfca_llm.fl import pool_naive

    original, found = pool_naive.score, []

    def spy(t, negative, owners, tasks, seed, reference, strata, history, *args, window, **kwargs):
        result = original(t, negative, owners, tasks, seed, reference, strata, history, *args, window=window, **kwargs)
        found.extend(e for e in result.matches.get(f"c{RETRAINER}", []) if e.round >= t - window)
        return result

    pool_naive.score = spy
    try:
        for seed in range(0, 12, 3):
            settings = case(seed)
            naive_of(federation_of(seed, settings), settings)
    finally:
        pool_naive.score = original
    assert not found


def copies_found(rounds: list[dict[str, np.ndarray]], **rules) -> tuple[set[tuple[int, str]], Federation]:
    """(round, scorer) of the copies the naive reference finds in their rounds in a run of ``rounds`` (and the run as a
    federation)."""
    from kfca_llm.fl import pool_naive

    fed = Federation([{c: u.astype(np.float32).tolist() for c, u in r.items()} for r in rounds], [{}] * len(rounds),
                     [None] * len(rounds), [11 + t for t in range(len(rounds))])
    original, copies = pool_naive.score, set()

    def spy(t, *args, horizon, **kwargs):
        result = original(t, *args, horizon=horizon, **kwargs)
        copies.update((t, c) for c in result.copies if horizon is None)
        return result

    pool_naive.score = spy
    try:
        naive_run(fed.rounds, fed.seeds, **rules)
    finally:
        pool_naive.score = original
    return copies, fed


def assert_pays_as_naive(fed: Federation, **rules) -> None:
    expected = naive_run(fed.rounds, fed.seeds, **rules)
    paid, _ = real_run(fed, PoolSettings(window=rules.get("window", 10), own_replay_limit=rules["own_replay_limit"]), 0.0)
    assert paid == [pytest.approx(want, abs=1e-12) for want in expected]


def replayed_with_flips(seed: int, flipped: int, own_replay_limit: float):
    """(copies found, federation) of three rounds in which participant "a" resubmits its round-1 update in round 3
    with ``flipped`` of its 250 signs flipped."""
    rng = np.random.default_rng(seed)
    first = rng.standard_normal(250)
    again = first.copy()
    again[:flipped] *= -1
    return copies_found([{"a": first, "b": rng.standard_normal(250)},
                         {"c": rng.standard_normal(250), "d": rng.standard_normal(250)},
                         {"a": again, "e": rng.standard_normal(250)}], own_replay_limit=own_replay_limit)


def test_an_own_replay_at_exactly_the_limit_is_a_replay():
    """A resubmission differing from its participant's earlier update in exactly ``own_replay_limit`` of the tasks (5 of
    250 at 2%) is a replay, as one of another's exactly 2% away is a copy: "within" the limit includes it."""
    copies, fed = replayed_with_flips(7, 5, 0.02)
    assert (3, "a") in copies
    assert_pays_as_naive(fed, own_replay_limit=0.02)


def test_an_own_replay_is_a_copy_first():
    """An own replay must be within the copy rule's 2% as well as within ``own_replay_limit``: at a limit of 5% a
    resubmission 3.2% away (8 of 250 signs) is scored as a fresh submission."""
    copies, fed = replayed_with_flips(8, 8, 0.05)
    assert not copies
    assert_pays_as_naive(fed, own_replay_limit=0.05)


def test_no_copy_is_found_while_the_window_holds_no_entry():
    """Copies of earlier submissions are looked for only while the window (and the round before it) holds a pool entry:
    after window + 1 rounds that added none (here in-round copies), a byte-identical resubmission of round 1's update
    is scored as a fresh submission (undetermined, settled later), the sketch notwithstanding."""
    rng = np.random.default_rng(9)
    first = rng.standard_normal(256)
    rounds = [{"a": first, "b": rng.standard_normal(256)}]
    for t in range(2, 7):
        twin = rng.standard_normal(256)
        rounds.append({f"x{t}": twin, f"y{t}": twin})
    shared = rng.standard_normal(256)  # the later rounds' clients agree: the pool can settle round 7
    rounds.append({"a": first, "c": shared + rng.standard_normal(256)})
    rounds += [{f"p{t}": shared + rng.standard_normal(256), f"q{t}": shared + rng.standard_normal(256)}
               for t in range(8)]
    copies, fed = copies_found(rounds, window=4, own_replay_limit=0.0)
    assert (7, "a") not in copies and {(t, c) for t in range(2, 7) for c in (f"x{t}", f"y{t}")} <= copies
    assert_pays_as_naive(fed, window=4, own_replay_limit=0.0)
    assert any(naive_run(fed.rounds, fed.seeds, window=4)[6].values())
