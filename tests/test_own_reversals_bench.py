"""``benchmarks/own_reversals.py`` and ``benchmarks/done_when_table.py``: the labels and rules a capture's submissions
are judged by, and the done-when read from a run's rounds."""

import sys
from pathlib import Path

import numpy as np

from kfca_llm.api import pack_updates
from kfca_llm.engine.duplicates import DuplicateRule
from kfca_llm.engine.public import PublicConditioning
from kfca_llm.fl.peer_pool import PeerPool, PoolSettings
from kfca_llm.fl.pool_values import value_sketch
from kfca_llm.flower.round_scoring import score_round

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from done_when_table import judge  # noqa: E402
from flower_capture import Capture  # noqa: E402
from own_reversals import flipped, judged, main, submissions  # noqa: E402

ON_OFF, COPIER = 1, 4


def on_off_capture(tmp_path: Path) -> Path:
    """Five nodes at two a round over 16 rounds, each honest update its node's own direction plus noise; node 1 flips
    every other update of its own (on-off), node 4 resends its first update (a copy: never joins the pool)."""
    rng = np.random.default_rng(3)
    own = {c: rng.standard_normal(4096) for c in range(5)}
    capture, pool, seen, first = Capture(score_round), PeerPool(PoolSettings()), {}, None
    for t in range(1, 17):
        pair = sorted(rng.choice(5, size=2, replace=False).tolist())
        updates = {}
        for c in pair:
            u = (own[c] + 0.5 * rng.standard_normal(4096)).astype(np.float32)
            if c == ON_OFF and seen.get(c, 0) % 2 == 1:
                u = -u
            if c == COPIER:
                first = u if first is None else first
                u = first
            seen[c] = seen.get(c, 0) + 1
            updates[f"n{c}"] = {"w": u}
        packer = pack_updates(updates)
        values = {c: value_sketch(u, packer.layout) for c, u in updates.items()}
        capture(packer, pool, t, peers=None, seed=t, penalty="expected", bonus_fraction=0.5, duplicates="zero",
                duplicate_rule=DuplicateRule(), reference=None, reference_weight=1.0, keep_signs=False, public=None,
                conditioning=PublicConditioning(), values=values, closes_run=t == 16)
    path = tmp_path / "run.npz"
    capture.save(path, {t["round"]: {c: int(c[1:]) for c in t["clients"]} for t in capture.rounds}, {"1": "on-off"})
    return path


def test_each_submission_is_labelled_by_its_attack_and_copies_never_judged(tmp_path, capsys):
    path = on_off_capture(tmp_path)
    subs = submissions(path)
    assert [s.flipped for s in subs if s.node == ON_OFF] == [k % 2 == 1 for k in range(sum(s.node == ON_OFF
                                                                                            for s in subs))]
    assert sum(s.node == COPIER for s in subs) == 1  # its resends are own resubmissions: left out of the pool
    rows = judged(subs)
    kinds = {r["kind"] for r in rows if r["node"] == ON_OFF}
    assert kinds == {"turn", "back"}
    # every honest update follows its own previous one (+60 errors or so); the on-off node's turns run against it
    assert all(r["z"] > 10 and not r["rule 20"] for r in rows if r["kind"] == "honest")
    turns = [r for r in rows if r["kind"] == "turn"]
    assert turns and all(r["z"] < -10 for r in turns)
    assert main([str(path)]) == 0
    assert "| turn |" in capsys.readouterr().out


def test_flipped_reads_each_attack():
    assert [flipped("flip-after:2", k) for k in range(4)] == [False, False, True, True]
    assert [flipped("on-off", k) for k in range(4)] == [False, True, False, True]
    assert flipped(None, 0) is False and flipped("flip", 0) is True and flipped("zero", 3) is None


def test_the_done_when_of_a_run_fails_on_each_of_its_parts():
    attacks = {3: "flip", 19: "flip-after:3"}

    def rounds(*paid):
        return [{"round": t, "rewards": {str(p): v for p, v in r.items()}, "settled": {}, "undetermined": [],
                 "resubmitted": [], "forfeited": []} for t, r in enumerate(paid, start=1)]

    good = rounds({1: 0.2, 3: -0.2}, {2: 0.1, 19: 0.12}, {1: 0.1, 2: 0.1})
    found = judge(good, attacks)
    assert found["whole"] and (found["meetings"], found["right"]) == (1, 1) and found["every_deviated"]
    assert found["every_deviator"] is False  # the sleeper (never deviated, sampled once) sits above honest node 2
    assert not judge(rounds({1: -0.2, 3: 0.1}, {2: 0.1, 19: 0.05}), attacks)["whole"]  # the meeting paid wrong
    charged = good[:2] + [{**good[2], "forfeited": [2]}]
    assert judge(charged, attacks)["charged"] == 1 and not judge(charged, attacks)["whole"]
    below = rounds({1: 0.2, 3: -0.2}, *({2: -0.01, 4: 0.1} for _ in range(2)), *({5: 0.1, 6: 0.1} for _ in range(40)))
    assert judge(below, attacks)["below_zero"] == 2 and not judge(below, attacks)["whole"]  # 2 of 85 > 2%
