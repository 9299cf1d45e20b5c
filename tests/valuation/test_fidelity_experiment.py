"""The fidelity experiment: stacked coalition training, client cases, CA baselines, a CI-sized run."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

pytest.importorskip("sklearn", reason="the bundled digits data set ships with scikit-learn (test extra)")

from kfca_llm.api import score_labels  # noqa: E402
from kfca_llm.cli import main  # noqa: E402
from kfca_llm.mechanism import ca_score_matrix, delta_matrix, mtpp_payment  # noqa: E402
from kfca_llm.valuation.cases import load_images, make_clients  # noqa: E402
from kfca_llm.valuation.cnn_federation import (FederationConfig, StackedCNN, accuracy, model_for,  # noqa: E402
                                               run_federation, train_coalitions)
from kfca_llm.valuation.fidelity import FidelityConfig, run_fidelity, tables  # noqa: E402
from kfca_llm.valuation.methods import ca_rewards  # noqa: E402


@pytest.fixture(autouse=True)
def one_torch_thread():
    """The stacked models' many small matmuls run best (and steadiest on shared cores) on one thread."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def images():
    return load_images(seed=0, max_examples=600)


def test_stacked_training_equals_separate_runs(images):
    """Each coalition's model is exactly what FedAvg on that coalition alone gives."""
    clients = make_clients(images, "size_skew", 3, seed=0)  # unequal sizes: FedAvg weights matter
    assert len({c.y.numel() for c in clients}) > 1
    cfg = FederationConfig(rounds=2, seed=1)
    model = StackedCNN((8, 8), 10, cfg.channels)
    init = model.init(1)
    together = train_coalitions(model, clients, init, np.arange(1, 8), cfg)
    for k, mask in enumerate(range(1, 8)):
        alone = train_coalitions(model, clients, init, np.array([mask]), cfg)
        torch.testing.assert_close(together[k], alone[0], atol=2e-5, rtol=1e-4)
    assert not torch.allclose(together[0], together[1])  # different coalitions, different models
    record = run_federation(model, clients, init, cfg)
    torch.testing.assert_close(together[-1], record.final, atol=2e-5, rtol=1e-4)
    # the record reconstructs the global model: theta_{t+1} = theta_t + sum_i |D_i|/|D| update_i
    w = torch.tensor(record.num_examples / record.num_examples.sum(), dtype=torch.float32)
    torch.testing.assert_close(record.globals[1], record.globals[0] + w @ record.updates[0])
    acc = accuracy(model, together, torch.from_numpy(images.test_x[:, None]), torch.from_numpy(images.test_y))
    assert acc[-1] > 0.3  # the grand coalition learns the digits (chance: 0.1) in two rounds


def test_cases_follow_the_paper(images):
    n = 10
    iid = make_clients(images, "iid", n, seed=0)
    assert len({c.y.numel() for c in iid}) == 1
    skew = make_clients(images, "label_skew", n, seed=0)
    for c, data in enumerate(skew):
        favourite = {(2 * (c // 2) + 1) % 10, (2 * (c // 2) + 2) % 10}
        share = np.isin(data.y.numpy(), list(favourite)).mean()
        assert share == pytest.approx(0.8, abs=0.02), c
    sizes = np.array([c.y.numel() for c in make_clients(images, "size_skew", n, seed=0)])
    pair_share = sizes.reshape(5, 2).sum(1) / sizes.sum()
    np.testing.assert_allclose(pair_share, [0.10, 0.15, 0.20, 0.25, 0.30], atol=0.01)
    noisy = make_clients(images, "label_noise", n, seed=0)
    flipped = [(a.y != b.y).float().mean().item() for a, b in zip(iid, noisy)]
    np.testing.assert_allclose(flipped, np.repeat([0, 0.05, 0.10, 0.15, 0.20], 2), atol=0.01)
    blurred = make_clients(images, "feature_noise", n, seed=0)
    changed = [(a.x != b.x).flatten(1).any(1).float().mean().item() for a, b in zip(iid, blurred)]
    np.testing.assert_allclose(changed, np.repeat([0, 0.05, 0.10, 0.15, 0.20], 2), atol=0.01)
    assert all(torch.equal(a.y, b.y) for a, b in zip(iid, blurred))


def test_ca_rewards_match_mechanism():
    rng = np.random.default_rng(0)
    truth = rng.integers(0, 3, 400)
    # clients 2 and 3 report a relabelled signal: pooled delta is not the identity pattern
    reports = [np.where(rng.random(400) < 0.8, truth, rng.integers(0, 3, 400)) for _ in range(4)]
    reports[2], reports[3] = (reports[2] + 1) % 3, (reports[3] + 1) % 3
    pairs = [(i, j) for i in range(4) for j in range(4) if i != j]
    pooled = delta_matrix(np.concatenate([reports[i] for i, _ in pairs]),
                          np.concatenate([reports[j] for _, j in pairs]), 3)
    score = ca_score_matrix(pooled)
    expected = [np.mean([mtpp_payment(reports[i], reports[j], score, seed=5, pair=(i, j)) for j in range(4) if j != i])
                for i in range(4)]
    np.testing.assert_allclose(ca_rewards(reports, 3, seed=5), expected, atol=1e-12)
    # with truthful, positively correlated reports CA's score is the identity, i.e. KFCA (score_labels)
    honest = reports[:2] + [np.where(rng.random(400) < 0.7, truth, rng.integers(0, 3, 400))]
    kfca = score_labels({str(i): r for i, r in enumerate(honest)}, num_labels=3, seed=5)
    np.testing.assert_allclose(ca_rewards(honest, 3, seed=5), [kfca.rewards[str(i)] for i in range(3)], atol=1e-12)


def test_ci_sized_fidelity_run(tmp_path, capsys):
    out = tmp_path / "fid"
    code = main(["fidelity", "--case", "iid,label_noise", "--clients", "3", "--rounds", "2", "--jobs", "1",
                 "--out", str(out)])
    assert code == 0
    printed = capsys.readouterr().out
    assert "distance to exact SV" in printed and "total wall time" in printed
    for name in ("fidelity_distance_vs_time.png", "fidelity_variance.png", "fidelity_rewards.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    result = json.loads((out / "fidelity.json").read_text())
    assert set(result["cases"]) == {"iid", "label_noise"}
    csv_rows = (out / "fidelity.csv").read_text().strip().splitlines()
    assert len(csv_rows) == 1 + 2 * 13  # header + cases x (exact SV + 12 methods)
    for case in result["cases"].values():
        exact = case["exact_sv"]
        assert sum(exact["values"]) == pytest.approx(exact["v_grand"] - exact["v_empty"], abs=1e-9)  # efficiency
        ref = np.array(case["methods"]["exact-sv"]["normalised"])
        for key, m in case["methods"].items():
            q = np.array(m["normalised"])
            assert q.sum() == pytest.approx(1.0) or m["normalisation"] == "abs-sum"
            cos = 1 - ref @ q / np.linalg.norm(ref) / np.linalg.norm(q)
            assert m["distance"]["cosine"] == pytest.approx(cos, abs=1e-12)
            assert m["distance"]["max_diff"] == pytest.approx(np.max(np.abs(ref - q)))
            assert m["variance"] == pytest.approx(np.var(q))
            assert m["seconds"] >= 0
        assert case["methods"]["exact-sv"]["distance"]["euclidean"] == 0
        assert case["methods"]["exact-sv"]["coalitions"] == 8
        assert case["methods"]["mr"]["coalitions"] == 2 * 8
        assert case["methods"]["tmc-shapley"]["coalitions"] <= 8
        assert case["methods"]["group-testing"]["coalitions"] <= 8  # retrains: exact SV's game
        assert case["methods"]["group-testing"]["extra"]["tests"] > 0
        assert case["methods"]["fed-sv"]["coalitions"] <= 2 * 8  # per-round reconstructions
        assert case["methods"]["tmr"]["coalitions"] == 2 * 8  # 0.9^1 >= 0.5: both rounds reconstructed
        assert case["methods"]["tmr"]["extra"]["rounds_computed"] == 2
        assert case["methods"]["uniform"]["normalised"] == [pytest.approx(1 / 3)] * 3
        assert case["methods"]["uniform"]["spearman"] is None
    assert [r["method"] for r in result["summary"]][0] == "exact-sv"
    assert "KFCA-QP" in tables(result)


def test_fidelity_rejects_bad_options(tmp_path, capsys):
    assert main(["fidelity", "--case", "nope", "--out", str(tmp_path)]) == 2
    assert "unknown case" in capsys.readouterr().err
    with pytest.raises(Exception, match="unknown method"):
        run_fidelity(FidelityConfig(cases=("iid",), clients=2, rounds=1, methods=("bogus",)), tmp_path)


def test_cases_in_parallel_processes_give_the_same_results(tmp_path):
    cfg = dict(cases=("iid", "size_skew"), clients=3, rounds=1, methods=("tmc-shapley", "kfca-qp"))
    serial = run_fidelity(FidelityConfig(**cfg), tmp_path / "serial", log=lambda *a: None)
    parallel = run_fidelity(FidelityConfig(**cfg, jobs=2), tmp_path / "parallel", log=lambda *a: None)
    assert parallel["jobs"] == 2
    for case in cfg["cases"]:
        for key, m in serial["cases"][case]["methods"].items():
            assert parallel["cases"][case]["methods"][key]["raw"] == m["raw"], (case, key)


def test_clients_of_one_silo_are_not_paid_as_copies():
    """The label-skew case pairs clients on the same two digits: their updates agree on 83-92% of about 1,350
    tasks, and the third parties' copy fit of such a pair is 0.0-0.45 with a standard error of about 0.2. A copy
    rule that asked the fit only to come within three standard errors of a copy's flagged every pair in the
    first round and paid honest clients nothing; the fit must stay clear of honest twins to flag."""
    from kfca_llm import score_updates

    digits = load_images(seed=0)  # the whole bundled set, as the experiment uses it
    clients = make_clients(digits, "label_skew", 10, seed=0)
    model = model_for(digits.train_x.shape[1:], digits.num_classes, FederationConfig().channels)
    record = run_federation(model, clients, model.init(0), FederationConfig(rounds=4, seed=0))
    names = [f"client-{i}" for i in range(10)]
    for t, updates in enumerate(record.updates):
        report = score_updates(dict(zip(names, updates)), seed=t, duplicates="flag")
        assert report.duplicates == (), (t, [g.clients for g in report.duplicates])
