"""``benchmarks/flower_round_after.py``: on a capture of known updates, which pairs it measures against which rounds,
and what it counts."""

import json
import sys
from collections import Counter
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from flower_round_after import agreeing_pairs, judged_by_one, main, measure  # noqa: E402

COORDS = 2048


def words(update: np.ndarray) -> np.ndarray:
    return np.packbits(update < 0, bitorder="little").view(np.int32).copy()


def capture(path: Path, rounds: list[dict[int, np.ndarray]], attacks: dict[int, str]) -> Path:
    """A capture as ``flower_capture.Capture.save`` writes it, of rounds of partition -> float update (every
    coordinate a task; client names ``c<partition>``)."""
    arrays, meta = {}, {"rounds": [], "settings": {}, "attacks": {str(p): a for p, a in attacks.items()},
                        "partition_of": {}}
    for k, updates in enumerate(rounds):
        arrays[f"{k}.task"] = np.full(COORDS // 32, -1, dtype=np.int32)
        for p, u in updates.items():
            arrays[f"{k}.signs.c{p}"] = words(u)
        meta["rounds"].append({"round": k + 1, "clients": [f"c{p}" for p in updates]})
        meta["partition_of"][str(k + 1)] = {f"c{p}": p for p in updates}
    np.savez(path, __meta__=np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8), **arrays)
    return path


def test_a_flipping_pair_is_measured_against_the_rounds_around_it(tmp_path, capsys):
    """Round 2: honest 1 and flipping 3. Round 3: honest 4 and 5 (coherent), round 4: honest 6 and the zero node 7 (one
    usable participant), round 1: honest 8 and 9. Only pairs of one honest and one deviating node count."""
    rng = np.random.default_rng(0)
    d = rng.standard_normal(COORDS)

    def honest():
        return d + 0.8 * rng.standard_normal(COORDS)

    rounds = [{8: honest(), 9: honest()}, {1: honest(), 3: -honest()}, {4: honest(), 5: honest()},
              {6: honest(), 7: np.zeros(COORDS)}]
    path = capture(tmp_path / "run.npz", rounds, {3: "flip", 7: "zero"})
    coherent, single = Counter(), Counter()
    measure(path, [-1, 1, 2], True, coherent)
    measure(path, [-1, 1, 2], False, single)
    assert coherent == Counter({(-1, "flipping", "pairs"): 1, (-1, "flipping", "honest agrees more"): 1,
                                (1, "flipping", "pairs"): 1, (1, "flipping", "honest agrees more"): 1})
    assert single == Counter({(2, "flipping", "pairs"): 1, (2, "flipping", "honest agrees more"): 1})
    assert main([str(path), "--lags", "1"]) == 0
    assert "| +1 | flipping | 1 | 1 (100%) |" in capsys.readouterr().out


def test_a_resubmission_and_an_agreeing_pair_are_left_out(tmp_path):
    """Round 3's node 4 resubmits its round-1 update: round 3 has one usable participant left. Node 3 (on-off) flips
    in round 2 only, and round 4's pair is honest. Round 5's free rider 10 agrees with its honest partner: not measured,
    though round 6 is coherent."""
    rng = np.random.default_rng(1)
    d = rng.standard_normal(COORDS)

    def honest():
        return d + 0.8 * rng.standard_normal(COORDS)

    first = honest()
    rounds = [{4: first, 3: honest()}, {1: honest(), 3: -honest()}, {4: first, 5: honest()}, {6: honest(), 3: honest()},
              {2: honest(), 10: honest()}, {11: honest(), 12: honest()}]
    path = capture(tmp_path / "run.npz", rounds, {3: "on-off", 10: "free-ride:1"})
    coherent, single = Counter(), Counter()
    measure(path, [1], True, coherent)
    measure(path, [1], False, single)
    assert coherent == Counter()
    assert single == Counter({(1, "flipping", "pairs"): 1, (1, "flipping", "honest agrees more"): 1})


def test_agreeing_pairs_are_measured_by_kind_against_a_coherent_round_after(tmp_path, capsys):
    """Round 1: honest 1 and 2; round 2: honest 4 and 5; round 3: flippers 3 and 6 (their flips agree); round 4: honest
    7 and 8; round 5: honest 9 and the zero node 10 (one usable participant: no coherent round after round 4). A pair's
    share is its higher member's mean agreement with the round after's others, less one half."""
    rng = np.random.default_rng(2)
    d = rng.standard_normal(COORDS)

    def honest():
        return d + 0.8 * rng.standard_normal(COORDS)

    rounds = [{1: honest(), 2: honest()}, {4: honest(), 5: honest()}, {3: -honest(), 6: -honest()},
              {7: honest(), 8: honest()}, {9: honest(), 10: np.zeros(COORDS)}]
    path = capture(tmp_path / "run.npz", rounds, {3: "flip", 6: "flip", 10: "zero"})
    shares: dict = {}
    agreeing_pairs(path, [1], shares)
    assert sorted(shares) == [(1, "flipping"), (1, "honest")]
    (flipped,) = shares[(1, "flipping")]
    first, second = shares[(1, "honest")]  # rounds 1 and 2: before the flips, and before a round of them
    assert first > 0.2 and second < -0.2 and flipped < -0.2
    # Its higher member: each of round 2's members agrees less with the flipped round 3 than the better one.
    means = [np.mean([np.mean((rounds[1][p] < 0) == (rounds[2][o] < 0)) for o in (3, 6)]) for p in (4, 5)]
    assert second == max(means) - 0.5
    assert main([str(path), "--agreeing", "--lags", "1", "--thresholds=-0.2,0.5"]) == 0
    out = capsys.readouterr().out
    assert "| +1 | flipping | 1 |" in out and out.rstrip().endswith("| 1 | 2 |")


def test_each_participant_of_a_round_after_judges_alone_counted_by_its_kind(tmp_path, capsys):
    """Round 1: honest 1 and flipping 3. Round 2: honest 4 and flipping 5 (a pair too, and a round after round 1 that
    disagrees with itself); round 3: the on-off node 6 between flips, the zero node 7 and node 1 again. Each usable
    participant of t + k judges a pair alone: the honest ones and the on-off node rank the honest update higher, the
    flipping one lower; a pair's own participants (node 1 for round 1's) and the zero node are no judges."""
    rng = np.random.default_rng(4)
    d = rng.standard_normal(COORDS)

    def honest():
        return d + 0.8 * rng.standard_normal(COORDS)

    rounds = [{1: honest(), 3: -honest()}, {4: honest(), 5: -honest()}, {6: honest(), 7: np.zeros(COORDS), 1: honest()}]
    path = capture(tmp_path / "run.npz", rounds, {3: "flip", 5: "flip", 6: "on-off", 7: "zero"})
    counts = Counter()
    judged_by_one(path, [1, 2], counts)
    assert +counts == Counter({(1, "honest", "pairs"): 2, (1, "honest", "honest agrees more"): 2,  # 4; 1
                               (1, "flipping", "pairs"): 1,  # 5 judging round 1
                               (1, "on-off", "pairs"): 1, (1, "on-off", "honest agrees more"): 1,  # round 2's
                               (2, "on-off", "pairs"): 1, (2, "on-off", "honest agrees more"): 1})  # round 1's
    assert main([str(path), "--judges", "--lags", "1"]) == 0
    out = capsys.readouterr().out
    assert "| +1 | flipping | 1 | 0 (0%) |" in out and "| +1 | honest | 2 | 2 (100%) |" in out


def test_agreeing_pairs_against_the_judges_pool_rule_18_gives_them(tmp_path, capsys):
    """Round 1: flippers 3 and 6 agree; round 2: honest 4 and flipping 5 disagree (no coherent round after round 1);
    round 3: honest 7 and 8 agree. Through round 3, which ranks 4 above 5, node 4 alone judges round 1's pair; round 2's
    pair disagrees and is not measured; round 3's has no round after."""
    rng = np.random.default_rng(6)
    d = rng.standard_normal(COORDS)

    def honest():
        return d + 0.8 * rng.standard_normal(COORDS)

    rounds = [{3: -honest(), 6: -honest()}, {4: honest(), 5: -honest()}, {7: honest(), 8: honest()}]
    path = capture(tmp_path / "run.npz", rounds, {3: "flip", 5: "flip", 6: "flip"})
    coherent, chained = {}, {}
    agreeing_pairs(path, [1], coherent)
    agreeing_pairs(path, [1], chained, chained=True)
    assert coherent == {}
    (flipped,) = chained[("judges", "flipping")]
    assert sorted(chained) == [("judges", "flipping")]
    judge = rounds[1][4] < 0
    assert flipped == max(np.mean((rounds[0][p] < 0) == judge) for p in (3, 6)) - 0.5 < -0.15
    assert main([str(path), "--agreeing", "--chained", "--thresholds=-0.15"]) == 0
    assert "| judges | flipping | 1 |" in capsys.readouterr().out
