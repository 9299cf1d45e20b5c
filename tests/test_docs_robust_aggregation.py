"""docs/robust-aggregation.md and benchmarks/ROBUSTNESS.md show what the code prints: the aggregation benchmark's
tables and verdict lines (recomputed from the committed cells, benchmarks/aggregation.json and, for the rerun
after issue 27, aggregation_pool.json), and run commands that Flower and kfca-llm accept."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "robust-aggregation.md"
ROBUSTNESS = ROOT / "benchmarks" / "ROBUSTNESS.md"


def _bench():
    spec = importlib.util.spec_from_file_location("bench_aggregation", ROOT / "benchmarks" / "bench_aggregation.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _tables(text: str) -> list[str]:
    """Every markdown table of a page (consecutive lines starting with '|')."""
    tables, current = [], []
    for line in text.splitlines() + [""]:
        if line.startswith("|"):
            current.append(line)
        elif current:
            tables.append("\n".join(current))
            current = []
    return tables


@pytest.mark.parametrize("page", [DOC, ROBUSTNESS], ids=["docs", "ROBUSTNESS"])
def test_the_aggregation_table_and_verdicts_are_what_the_benchmark_prints(page):
    bench = _bench()
    cells = json.loads((ROOT / "benchmarks" / "aggregation.json").read_text())["cells"]
    text = page.read_text()
    printed = bench.table(cells)
    if page == DOC:
        assert _tables(text) == [printed]  # the page's only table
    else:
        assert printed in _tables(text)
    for line in bench.verdict(cells):
        assert f"- {line}" in text, line


def test_the_few_peers_rerun_table_and_verdicts_are_what_the_benchmark_prints():
    """ROBUSTNESS.md's rerun after issue 27 (benchmarks/aggregation_pool.json)."""
    bench = _bench()
    cells = json.loads((ROOT / "benchmarks" / "aggregation_pool.json").read_text())["cells"]
    text = ROBUSTNESS.read_text()
    assert bench.table(cells) in _tables(text)
    for line in bench.verdict(cells):
        assert f"- {line}" in text, line


def test_the_pages_flwr_run_commands_pass_flowers_key_check():
    import tomllib

    pytest.importorskip("flwr", reason="Flower is the optional extra kfca-llm[flower] (make install installs it)")
    from flwr.common.config import flatten_dict, fuse_dicts, parse_config_args

    declared = flatten_dict(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"])
    commands = re.findall(r"flwr run \. .*?--run-config \"([^\"]+)\"", DOC.read_text())
    assert len(commands) >= 2
    for overrides in commands:
        fuse_dicts(declared, parse_config_args([overrides]), check_keys=True)


def test_the_pages_simulate_command_is_a_valid_run(capsys):
    """The page's simulate command, planned (``--dry-run`` loads the recipe with its overrides and checks them)."""
    import shlex

    from kfca_llm.cli import main

    (command,) = re.findall(r"^kfca-llm simulate .*$", DOC.read_text(), flags=re.M)
    assert main([*shlex.split(command)[1:], "--dry-run"]) in (0, None)
    assert "aggregate exclude-negative" in capsys.readouterr().out
