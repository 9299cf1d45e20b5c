"""Hostile files beyond ledgers: reports and check texts handed to `kfca-llm check`, output paths below a file,
damaged `simulate --resume` state, IDX files whose dimensions overflow.

Every case ends in a clear verdict or one clear error line, never a hang or a traceback, under the time limits of
``helpers.limited`` (they catch hangs; no speed claim).
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import pytest
from helpers import limited, run_main

from kfca_llm import InputError


# ---- kfca-llm check on hostile reports --------------------------------------------------------------------


def write_report(folder: Path, strategies: dict, **extra) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    report = {"seed": 0, "rounds": len(next(iter(strategies.values()))),
              "strategies": {k: {"per_round": v} for k, v in strategies.items()}, **extra}
    (folder / "report.json").write_text(json.dumps(report))
    return folder / "report.json"


def expect_file(tmp_path: Path, check: str) -> Path:
    path = tmp_path / "e.toml"
    path.write_text(f"[[expect]]\ncheck = {json.dumps(check)}\n")
    return path


@pytest.mark.parametrize("text", ["honest" + " " * 65536 + "x", "1" * 65536 + " x honest > 0",
                                  "honest > " + "1" * 65536 + "x", "|" + " " * 65536])
def test_a_64_kb_check_text_is_refused_at_once(tmp_path, capsys, text):
    report = write_report(tmp_path / "r", {"honest": [0.1]})
    code, _, err = run_main(capsys, "check", report, "--expect", expect_file(tmp_path, text))
    assert code == 2 and "more than 4096" in err


@pytest.mark.parametrize("text, message", [("honest" + " " * 4000 + "x > 0", "is not a strategy"),
                                           ("1" * 4000 + " x honest > 0", "the factor is not a finite number"),
                                           ("1" * 4000 + "y > honest", "is not a strategy")])
def test_a_long_check_text_under_the_cap_gets_the_error_of_its_term(tmp_path, capsys, text, message):
    report = write_report(tmp_path / "r", {"honest": [0.1]})
    code, _, err = run_main(capsys, "check", report, "--expect", expect_file(tmp_path, text))
    assert code == 2 and message in err


@pytest.mark.parametrize("term", ["1" * 65536 + "y", "1" * 65536 + " x", "| " + " " * 65536, "a" + "." * 65536 + "!"])
def test_each_terms_regular_expressions_stay_linear_past_the_cap(term):
    from kfca_llm.expectations import _term

    with limited(10), pytest.raises(ValueError, match="is not a strategy"):
        _term(term)


def test_a_newline_in_a_check_text_is_refused(tmp_path, capsys):
    report = write_report(tmp_path / "r", {"honest": [0.1]})
    code, _, err = run_main(capsys, "check", report, "--expect", expect_file(tmp_path, "honest\n> 0"))
    assert code == 2 and "control characters" in err


def test_a_fifo_named_in_summary_json_is_refused_without_waiting(tmp_path, capsys):
    os.mkfifo(tmp_path / "report.fifo")
    (tmp_path / "summary.json").write_text(json.dumps({"runs": {"0": "report.fifo"}}))
    code, _, err = run_main(capsys, "check", tmp_path, "--expect", expect_file(tmp_path, "honest > 0"))
    assert code == 2 and "is not a regular file; not read" in err


def test_a_link_in_summary_json_that_leaves_the_folder_is_refused(tmp_path, capsys):
    outside = write_report(tmp_path / "outside", {"honest": [0.1]})
    run = tmp_path / "run"
    run.mkdir()
    (run / "r.json").symlink_to(outside)
    (run / "summary.json").write_text(json.dumps({"runs": {"0": "r.json"}}))
    code, _, err = run_main(capsys, "check", run, "--expect", expect_file(tmp_path, "honest > 0"))
    assert code == 2 and "must list report paths inside" in err


@pytest.mark.parametrize("body, message", [
    ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
    ('{"seed": 0, "rounds": 1, "strategies": {"honest": {"per_round": [' + "7" * 5000 + "]}}}",
     "cannot be read as JSON"),
    ('{"seed": 0, "rounds": 1, "strategies": {"honest": {"per_round": [' + "7" * 400 + "]}}}",
     "a number too large for a float"),
    ('{"seed": 0, "rounds": 1, "strategies": {"honest": {"per_round": [Infinity]}}}', "an infinite value"),
    ('{"seed": 0, "rounds": 1, "strategies": {"honest": {"per_round": [0.1]}}, "round_records": [{"pairs": ['
     '{"client": "a", "peer": "b", "honest_pair": true, "delta": [[1, 2], [3]]}]}]}', "is not a square matrix"),
    ('{"seed": 0, "rounds": 1, "strategies": {"honest": {"per_round": [0.1]}}, "round_records": [{"pairs": ['
     '{"client": "a", "peer": "b", "honest_pair": true, "delta": [[1, 2], [3, -Infinity]]}]}]}', "an infinite value"),
    ('{"seed": ' + "9" * 30 + ', "rounds": 1, "strategies": {"honest": {"per_round": [0.1]}}}', "not a 64-bit"),
    (b"\xff\xfe{}", "not UTF-8 text"),
])
def test_a_hostile_report_is_one_error_line(tmp_path, capsys, body, message):
    path = tmp_path / "report.json"
    path.write_bytes(body if isinstance(body, bytes) else body.encode())
    code, _, err = run_main(capsys, "check", path, "--expect", expect_file(tmp_path, "honest > 0"))
    assert code == 2 and message in err


def test_a_newline_in_a_strategy_name_cannot_forge_a_ci_log_line(tmp_path, capsys):
    forged = "x\n::error::all checks passed\nFAILED"
    report = write_report(tmp_path / "r", {"honest": [0.1], forged: [0.4]})
    code, out, _ = run_main(capsys, "check", report, "--expect", expect_file(tmp_path, "honest > *"))
    assert code == 1
    assert not any(line.startswith("::error::") for line in out.splitlines())
    assert "x\\n::error::all checks passed\\nFAILED" in out


# ---- output paths below a regular file: refused before the work ----------------------------------------------


def test_junit_below_a_file_is_refused_before_the_check(tmp_path, capsys):
    (tmp_path / "afile").write_text("")
    report = write_report(tmp_path / "r", {"honest": [0.1]})
    code, out, err = run_main(capsys, "check", report, "--expect", expect_file(tmp_path, "honest > 0"),
                              "--junit", tmp_path / "afile" / "sub" / "x.xml")
    assert code == 2 and "afile is not a directory" in err and out == ""


def test_score_json_below_a_file_is_refused_before_scoring(tmp_path, capsys):
    (tmp_path / "afile").write_text("")
    code, out, err = run_main(capsys, "score", tmp_path / "a.safetensors", tmp_path / "b.safetensors",
                              "--json", tmp_path / "afile" / "sub" / "r.json")
    assert code == 2 and "afile is not a directory" in err and out == ""


def test_simulate_out_below_a_file_is_refused_before_the_run(tmp_path, capsys):
    """In the worker: a fresh interpreter imported torch and transformers again (~4 s of CPU) for the same refusal;
    a run that was not refused would train the tiny recipe until ``limited`` stops it."""
    (tmp_path / "afile").write_text("")
    code, out, err = run_main(capsys, "simulate", "--out", tmp_path / "afile" / "sub", "--no-progress")
    assert code == 2 and "afile is not a directory" in err and "round" not in out


# ---- simulate --resume on damaged state ---------------------------------------------------------------------


@pytest.fixture
def saved_state(tmp_path):
    """The files a checkpoint of round 1 leaves (records, histories, the adapter), written as save_checkpoint does."""
    import torch
    from safetensors.torch import save_file

    from kfca_llm.fl.state import resume_settings, round_dir
    from kfca_llm.recipe import load_recipe

    recipe = load_recipe("tiny")
    state = tmp_path / "state" / "round-001"
    state.mkdir(parents=True)
    (state / "records.json").write_text(json.dumps({"seed": 0, "strategies": ["honest"],
                                                    "scoring": resume_settings(recipe), "rounds": []}))
    save_file({"client-001/001/w": torch.zeros(4, 2)}, str(state / "history.safetensors"))
    round_dir(tmp_path, 1).mkdir(parents=True)
    save_file({"w": torch.zeros(4, 2)}, str(round_dir(tmp_path, 1) / "adapter_model.safetensors"))
    (state / "COMPLETE").write_text("1")
    return tmp_path, recipe


@pytest.mark.parametrize("damage, file", [
    ("truncate", "state/round-001/records.json"), ("truncate", "state/round-001/history.safetensors"),
    ("truncate", "adapters/round-001/adapter_model.safetensors"), ("shape", "adapters/round-001/adapter_model.safetensors"),
])
def test_resume_names_the_damaged_file_and_how_to_go_on(saved_state, damage, file):
    import torch
    from safetensors.torch import save_file

    from kfca_llm.fl.state import load_checkpoint

    out, recipe = saved_state
    path = out / file
    if damage == "truncate":
        path.write_bytes(path.read_bytes()[: len(path.read_bytes()) // 2])
    else:
        save_file({"w": torch.zeros(3, 2)}, str(path))
    with limited(), pytest.raises(InputError) as caught:
        load_checkpoint(out, 1, 0, ["honest"], recipe, {"w": (4, 2)})
    message = str(caught.value)
    assert f"{path} is damaged" in message and "delete" in message and "round-001 to resume from the round before" in message
    assert "\n" not in message


def test_the_undamaged_state_of_those_cases_loads(saved_state):
    from kfca_llm.fl.state import load_checkpoint

    out, recipe = saved_state
    adapter, histories, rounds = load_checkpoint(out, 1, 0, ["honest"], recipe, {"w": (4, 2)})
    assert tuple(adapter["w"].shape) == (4, 2) and list(histories) == ["client-001"] and rounds == []


# ---- IDX files whose dimensions overflow ------------------------------------------------------------------


@pytest.mark.parametrize("dims, data", [((65536, 65536, 65536, 65536), b""), ((2 ** 32 - 1,) * 4, b"\x00" * 12),
                                        ((0, 28, 28), b"")])
def test_idx_dimensions_that_overflow_are_one_error(tmp_path, dims, data):
    from kfca_llm.valuation.cases import read_idx

    path = tmp_path / "train-images-idx3-ubyte"
    path.write_bytes(b"\x00\x00\x08" + bytes([len(dims)]) + struct.pack(f">{len(dims)}I", *dims) + data)
    with limited(), pytest.raises(InputError, match="header says"):
        read_idx(path)


def test_an_error_about_a_79000_character_check_quotes_a_prefix_and_the_length(tmp_path, capsys):
    """The check text arrives through the file's validation, whose error once quoted the whole input back."""
    report = write_report(tmp_path / "r", {"honest": [0.1]})
    text = "honest > " + "x" * 78_991
    code, _, err = run_main(capsys, "check", report, "--expect", expect_file(tmp_path, text))
    assert code == 2 and "more than 4096" in err and "(79,000 characters)" in err
    assert "honest > xxx" in err and len(err) < 400


def test_an_error_about_thousands_of_unknown_strategies_names_a_few_and_counts_the_rest(tmp_path, capsys):
    report = write_report(tmp_path / "r", {"honest": [0.1]})
    expect = tmp_path / "e.toml"
    expect.write_text("".join(f'[[expect]]\ncheck = "honest > s{k}"\n' for k in range(10_000)))
    code, _, err = run_main(capsys, "check", report, "--expect", expect)
    assert code == 2 and "has no strategy 's0', 's1'" in err and "and 9,992 more" in err and len(err) < 400
