"""Every table the pages show of a command's output is that output: generated tables (between
``<!-- generated: NAME -->`` markers, written by benchmarks/doc_tables.py) equal what the saved output gives, and
today's code reproduces a cheap piece of each saved output (the full runs take minutes: the script's docstring
says how to regenerate them)."""

from __future__ import annotations

import importlib.util
import json
import re

import numpy as np
import pytest
from doc_pages import ROOT, fenced_blocks, markdown_table, page


def _load_generator():
    spec = importlib.util.spec_from_file_location("doc_tables", ROOT / "benchmarks" / "doc_tables.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


doc_tables = _load_generator()
SAVED = json.loads(doc_tables.SAVED_FIDELITY.read_text())


def test_every_fidelity_table_is_what_the_saved_run_gives():
    expected = doc_tables.fidelity_tables(SAVED)
    blocks = [(p, name, body) for p, name, body in doc_tables.generated_blocks() if name.startswith("fidelity-")]
    assert {name for _, name, _ in blocks} == set(expected)  # every table shown somewhere
    assert {p.name for p, _, _ in blocks} == {"evidence.md", "FIDELITY.md"}
    for path, name, body in blocks:
        assert body == expected[name], f"{path.name}: table {name} is not the saved run's; regenerate it"




@pytest.fixture(scope="module")
def label_skew():
    """Today's recorded federation of the saved run's label-skew case (about a second: no Shapley retraining), with
    the run's one torch thread (its many small matmuls take 30 times longer on two threads of a busy machine)."""
    import torch

    from kfca_llm.valuation.cases import load_images
    from kfca_llm.valuation.fidelity import FidelityConfig, record_case

    cfg = FidelityConfig(clients=SAVED["clients"], rounds=SAVED["rounds"], seed=SAVED["seed"],
                         public_steps=SAVED["public_steps"], public_buckets=SAVED["public_buckets"])
    assert cfg.threads == SAVED["threads"] == 1
    threads = torch.get_num_threads()
    torch.set_num_threads(cfg.threads)
    try:
        problem, _ = record_case("label_skew", cfg, load_images(None, seed=SAVED["seed"]))
        yield problem
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("method", ["kfca-qp", "mc-kfca-qp", "kfca-d", "ca-qp", "ca-d", "uniform"])
def test_todays_code_gives_the_saved_runs_label_skew_row(label_skew, method):
    """The saved run's label-skew cells of the methods that need no retraining (the row whose MC KFCA-QP had gone
    stale: 0.0111 / +0.53 printed against 0.0114 / +0.42), to their last printed digit with one unit of slack;
    exact SV is the saved run's."""
    from kfca_llm.valuation.methods import METHODS
    from kfca_llm.valuation.metrics import distances, normalise, spearman

    saved = SAVED["cases"]["label_skew"]
    exact, _ = normalise(np.array(saved["exact_sv"]["values"]))
    q, _ = normalise(METHODS[method][1](label_skew).rewards)
    assert np.abs(q - saved["methods"][method]["normalised"]).max() <= 1e-4
    for kind, value in distances(exact, q).items():
        assert abs(value - saved["methods"][method]["distance"][kind]) <= 1.5e-4, kind
    if method != "uniform":
        assert abs(spearman(exact, q) - saved["methods"][method]["spearman"]) <= 0.015


@pytest.mark.parametrize("method", ["kfca-qp", "mc-kfca-qp"])
def test_public_steps_0_gives_the_unconditioned_runs_label_skew_rewards(label_skew, method):
    """Off, KFCA-QP is the run before the conditioning (issue 43), saved beside the new one (the same slack as above
    for other CPUs' training; on the machine that made both it is the same floats)."""
    import dataclasses

    from kfca_llm.engine.public import OFF
    from kfca_llm.valuation.methods import METHODS

    before = json.loads(doc_tables.UNCONDITIONED_FIDELITY.read_text())["cases"]["label_skew"]["methods"][method]
    raw = METHODS[method][1](dataclasses.replace(label_skew, conditioning=OFF)).rewards
    assert np.abs(raw - before["raw"]).max() <= 1e-4
    assert np.abs(raw - SAVED["cases"]["label_skew"]["methods"][method]["raw"]).max() > 1e-3  # conditioning moves it


def test_the_check_table_is_the_expectations_file_and_the_default_runs_gaps(tiny_federation, tmp_path):
    """docs/ci-check.md's paper-llm table: its expectation, check and margin columns are the shipped file's, and the
    first seed's gaps are what ``kfca-llm check`` measures on the default run (seed 0; seeds 1 and 2 are two more
    runs: ``python benchmarks/doc_tables.py check ...``)."""
    from kfca_llm.check import check_runs
    from kfca_llm.check_reports import load_runs
    from kfca_llm.expectations import load_expectations
    from kfca_llm.report import write_json

    expectations = load_expectations("paper-llm")
    write_json(tmp_path / "report.json", tiny_federation.to_report())
    outcomes = check_runs(expectations, load_runs([tmp_path])).outcomes
    (block,) = [body for p, name, body in doc_tables.generated_blocks() if name == "check-paper-llm"]
    assert block.splitlines()[0].endswith("| smallest gap (tiny, 10 rounds, seeds 0 / 1 / 2) |")
    rows = markdown_table(block, "| expectation |")
    assert [r[:3] for r in rows] == [[e.title, doc_tables.expectation_check(e), doc_tables.expectation_margin(e)]
                                     for e in expectations.expect]
    for row, outcome in zip(rows, outcomes):
        seeds = row[3].split(" / ")
        assert len(seeds) == 3 and abs(float(seeds[0]) - outcome.runs[0].gap) <= 1.5e-4, row


def test_the_check_table_is_on_its_page():
    assert "<!-- generated: check-paper-llm -->" in page("docs/ci-check.md")


SAVED_SWEEPS = {kind: json.loads(path.read_text()) for kind, path in doc_tables.SAVED_NONIID.items()}


def test_every_noniid_table_is_what_the_saved_sweeps_give():
    expected = doc_tables.noniid_tables(SAVED_SWEEPS["digits"], SAVED_SWEEPS["llm"])
    blocks = [(p, name, body) for p, name, body in doc_tables.generated_blocks() if name.startswith("noniid-")]
    assert sorted(name for _, name, _ in blocks) == sorted(expected)
    for path, name, body in blocks:
        assert body == expected[name], f"{path.name}: table {name} is not the saved sweep's; regenerate it"


def test_the_before_after_tables_are_the_saved_runs():
    """benchmarks/FREE_RIDERS.md's before/after tables: the unconditioned saved runs beside the saved runs."""
    expected = doc_tables.conditioning_tables()
    blocks = [(p, name, body) for p, name, body in doc_tables.generated_blocks() if name.startswith("conditioning-")]
    assert {(p.name, name) for p, name, _ in blocks} == {("FREE_RIDERS.md", name) for name in expected}
    for path, name, body in blocks:
        assert body == expected[name], f"{path.name}: table {name} is not the saved runs'; regenerate it"


SAVED_AGGREGATION = json.loads(doc_tables.SAVED_AGGREGATION.read_text())


def test_every_aggregation_table_is_what_the_saved_grid_gives():
    """benchmarks/ROBUSTNESS.md and docs/robust-aggregation.md show the saved aggregation grid's tables (one per
    fraction) and goal lines, as benchmarks/bench_aggregation.py prints them, and its figure."""
    expected = doc_tables.aggregation_tables(SAVED_AGGREGATION)
    assert set(expected) == {"aggregation-fraction-10", "aggregation-fraction-50", "aggregation-weak-verdicts",
                             "aggregation-goal"}
    blocks = [(p, name, body) for p, name, body in doc_tables.generated_blocks() if name.startswith("aggregation-")]
    assert {(p.name, name) for p, name, _ in blocks} == {(page, name) for page in ("ROBUSTNESS.md", "robust-aggregation.md")
                                                         for name in expected}
    for path, name, body in blocks:
        assert body == expected[name], f"{path.name}: table {name} is not the saved grid's; regenerate it"
    assert doc_tables.AGGREGATION_FIGURE.stat().st_size > 0


def test_every_generated_block_has_a_generator():
    names = {name for _, name, _ in doc_tables.generated_blocks()}
    generated = {*doc_tables.fidelity_tables(SAVED), *doc_tables.noniid_tables(SAVED_SWEEPS["digits"],
                                                                               SAVED_SWEEPS["llm"]),
                 *doc_tables.aggregation_tables(SAVED_AGGREGATION), *doc_tables.conditioning_tables()}
    assert names == generated | {"check-paper-llm"}


def test_todays_code_gives_the_saved_digits_sweeps_first_level_and_failure_case(tmp_path):
    """The digits sweep at concentration 0.1 and the disjoint-classes case (a few seconds of the 15 s sweep); the
    LLM sweep (4-10 minutes) is only regenerated by hand."""
    from kfca_llm.valuation.noniid import NonIIDConfig, digits_task, run_noniid

    saved = SAVED_SWEEPS["digits"]
    cfg = NonIIDConfig(concentrations=(saved["levels"][0]["concentration"],), clients=saved["clients"],
                       rounds=saved["rounds"], seed=saved["seed"], public_steps=saved["public_steps"],
                       public_buckets=saved["public_buckets"])
    fresh = run_noniid(cfg, tmp_path, task=digits_task(cfg), log=lambda *a: None)
    for ours, theirs in ((fresh["levels"][0], saved["levels"][0]), (fresh["disjoint"], saved["disjoint"])):
        assert ours["global_accuracy"] == pytest.approx(theirs["global_accuracy"], abs=1e-3)
        for key, value in theirs["summary"].items():
            assert ours["summary"][key] == pytest.approx(value, abs=1.5e-4), key


NUMBER = re.compile(r"[+-]\d+\.\d{4}")


def test_the_check_failure_example_is_what_the_command_prints(tmp_path, monkeypatch, capsys):
    """docs/ci-check.md's failure: its command run as written (the tiny recipe, seed 1, 4 rounds), the printed tail
    compared line by line, four-digit values with one unit of slack (other CPUs may round a few near-zero
    coordinates of the training differently)."""
    from kfca_llm.cli import main

    (block,) = [b for b in fenced_blocks(page("docs/ci-check.md"), "") if b.startswith("$ kfca-llm simulate")]
    command, dots, *shown = block.splitlines()
    assert dots == "..."
    simulate, check = (part.split() for part in command.removeprefix("$ ").split(" && "))
    monkeypatch.chdir(tmp_path)
    assert main([*simulate[1:], "--no-progress"]) == 0
    capsys.readouterr()
    assert main(check[1:]) == 1  # a failed expectation
    printed = capsys.readouterr().out.splitlines()[-len(shown):]
    for ours, theirs in zip(shown, printed):
        assert NUMBER.sub("#", ours) == NUMBER.sub("#", theirs), (ours, theirs)
        for a, b in zip(NUMBER.findall(ours), NUMBER.findall(theirs)):
            assert abs(float(a) - float(b)) <= 1.5e-4, (ours, theirs)
