"""The non-IID sweep: Dirichlet partitions, per-pair deltas and rewards, the disjoint-classes failure case."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from kfca_llm.api import score_updates
from kfca_llm.mechanism import delta_matrix
from kfca_llm.valuation.noniid import (RoundSignals, analyse_round, dirichlet_partition, disjoint_partition,
                                       failure_verdict, flipped_signs, sign_reports)


def test_dirichlet_partition_covers_every_example_once_and_skews_with_small_concentration():
    labels = np.repeat(np.arange(10), 60)
    skewed = dirichlet_partition(labels, 5, 0.1, seed=0)
    near_iid = dirichlet_partition(labels, 5, 100.0, seed=0)
    for parts in (skewed, near_iid):
        joined = np.sort(np.concatenate(parts))
        np.testing.assert_array_equal(joined, np.arange(labels.size))  # a partition: every example exactly once
        assert min(p.size for p in parts) >= 10
    top_share = lambda parts: np.mean([np.bincount(labels[p], minlength=10).max() / p.size for p in parts])  # noqa: E731
    assert top_share(skewed) > 0.3 > 0.15 > top_share(near_iid)  # 0.1: a few classes per client; 100: ~uniform
    for a, b in zip(skewed, dirichlet_partition(labels, 5, 0.1, seed=0)):
        np.testing.assert_array_equal(a, b)  # deterministic for a seed


def test_disjoint_partition_gives_each_client_one_class():
    labels = np.repeat(np.arange(6), 4)
    parts = disjoint_partition(labels, 5)
    assert [set(labels[p]) for p in parts] == [{0}, {1}, {2}, {3}, {4}]
    with pytest.raises(ValueError, match="as many classes"):
        disjoint_partition(labels, 7)


def _signals(seed: int = 0):
    """Three clients sharing a sign pattern with 20% noise, a fourth that negates it; coordinate 0 is zero
    everywhere (no task). Predictions: the first three agree with a truth, the fourth is constant."""
    rng = np.random.default_rng(seed)
    truth = rng.choice([-1.0, 1.0], 4000)
    rows = [np.where(rng.random(4000) < 0.8, truth, -truth) * rng.uniform(0.1, 1.0, 4000) for _ in range(3)]
    rows.append(-rows[0] * 0.5 + rng.normal(0, 0.01, 4000) * 0)
    updates = torch.tensor(np.stack(rows), dtype=torch.float32)
    updates[:, 0] = 0.0
    y = rng.integers(0, 3, 300)
    preds = np.stack([np.where(rng.random(300) < 0.9, y, rng.integers(0, 3, 300)) for _ in range(3)]
                     + [np.zeros(300, dtype=np.int64)])
    return RoundSignals(updates, preds)


def test_round_analysis_flags_pairs_and_pays_the_deviator_the_negative():
    s = _signals()
    reports = sign_reports(s.updates)
    assert reports.shape == (4, 3999)  # the all-zero coordinate is no task, as in the engine
    out = analyse_round(s, num_labels=3, seed=2)
    flags = {tuple(p["pair"]): p["categorical"] for p in out["pairs"]}
    assert flags[(0, 1)] and flags[(0, 2)] and flags[(1, 2)]
    assert not flags[(0, 3)] and not flags[(1, 3)]  # the negating client is anti-correlated with everyone
    d01 = next(p["delta"] for p in out["pairs"] if p["pair"] == [0, 1])
    np.testing.assert_allclose(d01, delta_matrix(reports[0], reports[1], 2))
    honest = score_updates({f"client-{i}": u for i, u in enumerate(s.updates)}, seed=2, duplicates="flag").rewards
    assert out["honest_reward"] == [honest[f"client-{i}"] for i in range(4)]
    # flipping every report negates every pair's payment (binary reports, expected penalty)
    np.testing.assert_allclose(out["deviation_reward"], -np.array(out["honest_reward"]), atol=1e-12)
    np.testing.assert_allclose(out["deviation_expected"], -np.array(out["honest_expected"]), atol=1e-12)
    assert out["honest_expected"][1] > 0 > out["honest_expected"][3]  # 3 mirrors 0: paid below zero
    # KFCA-D: the constant predictor shares no information with anyone: delta exactly 0, reward 0 in
    # expectation (bonus agreement and penalty are frequencies on different task samples)
    assert out["labels_reward"][3] == pytest.approx(0.0, abs=0.06) and out["labels_reward"][0] > 0.3
    assert all(p["labels_delta_abs_max"] == 0.0 for p in out["pairs"] if 3 in p["pair"])
    flipped = flipped_signs(s.updates, 1)
    assert flipped[0] == 0 and torch.all((flipped[1:] < 0) == (s.updates[1, 1:] >= 0))


def test_failure_verdict_says_what_the_numbers_say():
    base = {"pair_rounds_hold": 3, "pair_rounds": 10, "honest_reward": 0.01, "deviation_reward": -0.01,
            "own_class_share": 0.98}
    collapsed = failure_verdict({**base, "max_abs_labels_delta": 0.0, "max_abs_labels_reward": 0.001})
    assert "cannot work" in collapsed and "98%" in collapsed
    held = failure_verdict({**base, "max_abs_labels_delta": 0.2, "max_abs_labels_reward": 0.3})
    assert "did not happen" in held


@pytest.mark.filterwarnings("ignore::FutureWarning")
def test_digits_sweep_from_the_command_line(tmp_path, capsys):
    pytest.importorskip("sklearn", reason="the bundled digits data set ships with scikit-learn (test extra)")
    from kfca_llm.cli import main

    assert main(["fidelity", "--case", "noniid", "--rounds", "2", "--out", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    assert "non-IID sweep" in printed and "cannot work" in printed
    assert (tmp_path / "noniid.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    result = json.loads((tmp_path / "noniid.json").read_text())
    assert [lv["concentration"] for lv in result["levels"]] == [0.1, 0.5, 1.0, 5.0, 100.0]
    for level in [*result["levels"], result["disjoint"]]:
        assert len(level["rounds"]) == 2 and all(len(r["pairs"]) == 10 for r in level["rounds"])
        flags = [p["categorical"] for r in level["rounds"] for p in r["pairs"]]
        assert all(isinstance(f, bool) for f in flags)
        s = level["summary"]
        assert s["pair_rounds_hold"] == sum(flags) and s["pair_rounds"] == 20
        assert 0.0 <= level["global_accuracy"] <= 1.0
    assert result["pairs_hold"] == sum(lv["summary"]["pairs_hold_every_round"] for lv in result["levels"])
    near_iid = result["levels"][-1]["summary"]
    assert near_iid["pairs_hold_every_round"] == 10 and near_iid["honest_reward"] > 0 > near_iid["deviation_reward"]
    failure = result["disjoint"]["summary"]
    assert failure["own_class_share"] > 0.9  # local models predict their own class
    assert failure["max_abs_labels_delta"] < 0.01 and failure["max_abs_labels_reward"] < 0.01  # delta, reward -> 0
    assert near_iid["labels_reward"] > 0.1  # while overlapping clients' predictions are paid


@pytest.mark.filterwarnings("ignore::FutureWarning")
def test_llm_sweep_and_its_failure_case(tmp_path):
    from kfca_llm.valuation.noniid import NonIIDConfig, run_noniid
    from kfca_llm.valuation.topic_task import LABELS, label_token_ids, llm_task, make_topic_rows

    rows, labels = make_topic_rows(50, seed=0)
    assert np.bincount(labels).tolist() == [10] * len(LABELS)  # balanced
    assert all(row["output"] == LABELS[k] for row, k in zip(rows, labels))
    # one short round: enough for a client that sees one class to predict only it (the documented run trains
    # 5 rounds of 30 steps, where overlapping clients also learn the topics)
    cfg = NonIIDConfig(concentrations=(100.0,), rounds=1)
    result = run_noniid(cfg, tmp_path, task=llm_task(cfg, rows_per_client=16, local_steps=12), stem="llm")
    assert (tmp_path / "llm.json").is_file()
    level = result["levels"][0]
    assert len(level["rounds"][0]["pairs"]) == 10 and level["summary"]["pairs_hold_every_round"] == 10
    assert level["summary"]["honest_reward"] > 0 > level["summary"]["deviation_reward"]
    failure = result["disjoint"]["summary"]
    assert failure["own_class_share"] > 0.9  # each local model answers its own topic
    assert failure["max_abs_labels_delta"] < 0.01 and failure["max_abs_labels_reward"] < 0.01  # delta, reward -> 0
    assert "cannot work" in result["disjoint"]["verdict"]
    from kfca_llm.modeling import build_byte_tokenizer
    from kfca_llm.recipe import load_recipe

    assert len(set(label_token_ids(build_byte_tokenizer(), load_recipe("tiny")))) == len(LABELS)
