import csv
import json

import pytest
from helpers import TINY

from kfca_llm.cli import main

FAST = ["--no-progress", "--set", "train.training-arguments.max-steps=2"]
RUN = ["--rounds", "2", "--attacks", "honest,zero,flip,sparse:0.5", *FAST]


@pytest.fixture(scope="module")
def simulated(tmp_path_factory):
    out = tmp_path_factory.mktemp("sim") / "run"
    return out, main(["simulate", *RUN, "--seed", "3", "--out", str(out)])


@pytest.fixture(scope="module")
def seeds_run(tmp_path_factory):
    """Seeds 2 and 3 in one process (seed 3 as in ``simulated``)."""
    out = tmp_path_factory.mktemp("seeds") / "run"
    return out, main(["simulate", *RUN, "--seeds", "2,3", "--out", str(out)])


def test_simulate_writes_every_output(simulated):
    out, code = simulated
    assert code == 0
    for name in ("report.json", "rewards.csv", "rewards.png", "delta.png"):
        assert (out / name).is_file() and (out / name).stat().st_size > 0
    assert (out / "adapters" / "round-002" / "adapter_model.safetensors").is_file()
    report = json.loads((out / "report.json").read_text())
    assert report["domain"] == "general-nlp" and report["seed"] == 3 and report["rounds"] == 2
    assert set(report["strategies"]) == {"honest", "zero", "flip", "sparse:0.5"}
    assert all(len(v["per_round"]) == 2 for v in report["strategies"].values())
    assert len(report["categorical_world"]) == 2
    rows = list(csv.DictReader((out / "rewards.csv").open()))
    strategy_rows = [r for r in rows if r["kind"] == "strategy"]
    assert len(strategy_rows) == 8
    for r in strategy_rows:
        assert float(r["reward"]) == report["strategies"][r["name"]]["per_round"][int(r["round"]) - 1]
    assert any(r["kind"] == "honest-client" for r in rows)
    assert not list(out.glob(".*"))  # atomic writes leave no temporary files


def test_flagged_copies_show_in_the_table_and_csv(simulated):
    out, _ = simulated
    from kfca_llm.simulate import reward_table, rewards_csv

    report = json.loads((out / "report.json").read_text())
    assert report["duplicates"] == {"policy": "zero", "flagged": {}}  # honest clients: no false positive
    assert "copies:" not in reward_table(report)
    first = report["round_records"][0]
    a, b = first["clients"][:2]
    first["duplicates"] = [{"clients": [a, b], "pairs": [], "unadjusted_rewards": {a: 0.25, b: 0.5}}]
    report["duplicates"]["flagged"] = {a: [1], b: [1]}
    assert f"copies: {a} flagged in round(s) 1 (kfca.duplicates = zero" in reward_table(report)
    rows = [r for r in csv.DictReader(rewards_csv(report).splitlines()) if r["kind"] == "copy-unadjusted"]
    assert [(r["round"], r["name"], float(r["reward"])) for r in rows] == [("1", a, 0.25), ("1", b, 0.5)]


def test_simulate_saves_each_clients_round_update_for_kfca_llm_score(simulated, capsys):
    out, _ = simulated
    report = json.loads((out / "report.json").read_text())
    first = report["round_records"][0]
    folder = out / "updates" / "round-001"
    clients = [str(folder / c) for c in first["clients"]]
    assert main(["score", *clients, "--reference", str(folder / "global"), "--seed", str(first["kfca_seed"]),
                 "--json", str(out / "scored.json")]) == 0
    scored = json.loads((out / "scored.json").read_text())
    for c in first["clients"]:  # the honest clients' rewards of the run, up to float32 rounding
        assert scored["rewards"][c] == pytest.approx(first["honest_rewards"][c], abs=0.02)


def test_simulate_table_is_sorted_by_mean_reward(simulated, capsys):
    out, _ = simulated
    from kfca_llm.simulate import reward_table

    text = reward_table(json.loads((out / "report.json").read_text()))
    positions = [text.index(f" {s} ") for s in ("honest", "sparse:0.5", "zero", "flip")]
    assert positions == sorted(positions)


def test_simulate_resume_of_a_finished_run_changes_nothing(simulated, capsys):
    out, _ = simulated
    before = json.loads((out / "report.json").read_text())
    assert main(["simulate", "--rounds", "2", "--attacks", "honest,zero,flip,sparse:0.5", "--seed", "3",
                 "--out", str(out), "--resume", *FAST]) == 0
    after = json.loads((out / "report.json").read_text())
    assert after["strategies"] == before["strategies"]


def test_bad_attack_spec_is_a_clean_error(tmp_path, capsys):
    assert main(["simulate", "--attacks", "honest,lagged:0", "--out", str(tmp_path / "x"), *FAST]) == 2
    err = capsys.readouterr().err
    assert "lagged:0" in err and "valid specs" in err
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("dry_run", [[], ["--dry-run"]])
def test_negative_seed_is_refused_by_run_and_dry_run(tmp_path, capsys, dry_run):
    assert main(["simulate", "--seed", "-1", "--out", str(tmp_path / "x"), *dry_run, *FAST]) == 2
    assert "kfca.seed" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_simulate_help_is_plain_text(capsys):
    with pytest.raises(SystemExit):
        main(["simulate", "--help"])
    text = capsys.readouterr().out
    assert "updates/round-XXX" in text and "`" not in text
    dry_run_help = " ".join(text.split("--dry-run", 1)[1].split("--", 1)[0].split())
    assert "time" not in dry_run_help  # the plan estimates memory and bytes, not time


def test_default_output_folder_is_named_after_the_recipe():
    from kfca_llm.recipe import load_recipe
    from kfca_llm.simulate import default_out

    recipe = load_recipe(TINY)
    assert str(default_out(recipe)) == "runs/tiny-seed0"
    assert str(default_out(recipe, "finance")) == "runs/tiny-finance-seed0"


def test_overrides_on_the_command_line_get_their_own_default_folder(tmp_path, monkeypatch):
    """The few-peers command (20 clients, 30 rounds) once wrote into the demo's runs/tiny-seed0."""
    import kfca_llm.simulate

    folders = []
    monkeypatch.setattr(kfca_llm.simulate, "run_one", lambda recipe, out, **options: folders.append(str(out)))
    monkeypatch.chdir(tmp_path)
    few_peers = ["--set", "num-clients=20", "--set", "strategy.fraction-train=0.1", "--rounds", "30"]
    for args in ([], few_peers, few_peers, ["--rounds", "30"], ["--seed", "1"], ["--attacks", "honest,flip"]):
        assert main(["simulate", *args]) == 0
    demo, few, again, rounds, seed, attacks = folders
    assert demo == "runs/tiny-seed0" and seed == "runs/tiny-seed1"
    assert few == again and few.startswith("runs/tiny-") and few.endswith("-seed0")  # the same run finds its folder
    assert len({demo, few, rounds, attacks}) == 4 and rounds == "runs/tiny-fb86131d-seed0"  # docs/simulate.md's example


def test_dry_run_prints_the_plan_without_training(tmp_path, capsys):
    assert main(["simulate", "--dry-run", "--domain", "finance", "--out", str(tmp_path / "x")]) == 0
    text = capsys.readouterr().out
    assert "finance" in text and "10 rounds" in text
    assert not (tmp_path / "x").exists()


def test_domain_all_runs_four_domains_and_combines_figures(tmp_path, capsys):
    out = tmp_path / "all"
    assert main(["simulate", "--domain", "all", "--rounds", "1", "--attacks", "honest,flip", "--out", str(out),
                 "--no-progress", "--set", "train.training-arguments.max-steps=1"]) == 0
    for domain in ("general-nlp", "finance", "medical", "code"):
        assert json.loads((out / domain / "report.json").read_text())["domain"] == domain
    assert (out / "rewards.png").is_file() and (out / "delta.png").is_file()


def test_seeds_run_one_after_another_each_as_its_own_run(simulated, seeds_run):
    (single, _), (out, code) = simulated, seeds_run
    assert code == 0
    reports = {s: json.loads((out / f"seed{s}" / "report.json").read_text()) for s in (2, 3)}
    assert [r["seed"] for r in reports.values()] == [2, 3]
    for s in (2, 3):
        assert (out / f"seed{s}" / "rewards.png").is_file()
    # seed 3 after seed 2 in one process earns what seed 3 alone does: nothing leaks between seeds
    assert reports[3]["strategies"] == json.loads((single / "report.json").read_text())["strategies"]
    assert reports[2]["strategies"] != reports[3]["strategies"]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["seeds"] == [2, 3] and summary["rounds"] == 2
    assert summary["runs"] == {"2": "seed2/report.json", "3": "seed3/report.json"}
    honest = summary["strategies"]["honest"]
    per_seed = [reports[s]["strategies"]["honest"]["mean_reward"] for s in (2, 3)]
    assert honest["per_seed"] == {"2": per_seed[0], "3": per_seed[1]}
    assert (honest["mean_reward"], honest["min"], honest["max"]) == (sum(per_seed) / 2, min(per_seed), max(per_seed))
    assert summary["categorical_world_rounds"] == {str(s): sum(reports[s]["categorical_world"]) for s in (2, 3)}
    assert not list(out.glob(".*"))  # summary written atomically


def test_check_reads_a_multi_seed_folder(seeds_run, tmp_path, capsys):
    out, _ = seeds_run
    expect = tmp_path / "e.toml"
    expect.write_text('[[expect]]\ncheck = "honest > *"\n[[expect]]\ncheck = "flip < -0.5 x honest"\n')
    assert main(["check", str(out), "--expect", str(expect)]) == 0
    text = capsys.readouterr().out
    assert "seed 2" in text and "seed 3" in text and "2/2 expectations hold" in text


def test_seeds_table_lists_every_seed(seeds_run):
    out, _ = seeds_run
    from kfca_llm.simulate import seeds_table

    text = seeds_table(json.loads((out / "summary.json").read_text()))
    assert "seed 2" in text and "seed 3" in text
    positions = [text.index(f" {s} ") for s in ("honest", "sparse:0.5", "flip")]
    assert positions == sorted(positions)


@pytest.mark.parametrize("args, message", [
    (["--seeds", "0,x"], "distinct non-negative integers"),
    (["--seeds", "-1"], "distinct non-negative integers"),
    (["--seeds", ","], "distinct non-negative integers"),
    (["--seeds", "1,1"], "repeats a seed"),
    (["--seeds", "0,1", "--seed", "2"], "not both"),
    (["--seeds", "0,1", "--domain", "all"], "one domain"),
])
def test_bad_seeds_are_refused(tmp_path, capsys, monkeypatch, args, message):
    monkeypatch.chdir(tmp_path)
    assert main(["simulate", *args, *FAST]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()


def test_seeds_dry_run_and_default_folder(tmp_path, capsys, monkeypatch):
    from kfca_llm.recipe import load_recipe
    from kfca_llm.simulate import default_seeds_out

    monkeypatch.chdir(tmp_path)
    assert main(["simulate", "--seeds", "0,1,2", "--dry-run"]) == 0
    assert capsys.readouterr().out.count("recipe 'tiny' (general-nlp)") == 1  # one plan: it does not depend on the seed
    assert not (tmp_path / "runs").exists()
    recipe = load_recipe(TINY)
    assert str(default_seeds_out(recipe, [0, 1, 2])) == "runs/tiny-seeds0-1-2"
    assert str(default_seeds_out(recipe, [5], "finance")) == "runs/tiny-finance-seeds5"
