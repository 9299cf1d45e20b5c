"""docs/robust-aggregation.md's run commands are ones Flower and kfca-llm accept (its tables are generated blocks:
tests/test_doc_tables.py checks them against benchmarks/aggregation.json)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "robust-aggregation.md"


def test_the_pages_flwr_run_commands_pass_flowers_key_check():
    import tomllib

    pytest.importorskip("flwr", reason="Flower is the optional extra kfca-llm[flower] (make install installs it)")
    from flwr.common.config import flatten_dict, fuse_dicts, parse_config_args

    declared = flatten_dict(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"])
    commands = re.findall(r"flwr run \. .*?--run-config \"([^\"]+)\"", DOC.read_text())
    assert len(commands) >= 2
    for overrides in commands:
        fuse_dicts(declared, parse_config_args([overrides]), check_keys=True)


def test_the_pages_simulate_commands_are_valid_runs(capsys):
    """The page's simulate commands (the guarded run, the pool alone), planned (``--dry-run`` loads the recipe with its overrides and checks them)."""
    import shlex

    from kfca_llm.cli import main

    guarded, pool_alone = re.findall(r"^kfca-llm simulate .*$", DOC.read_text(), flags=re.M)
    assert main([*shlex.split(guarded)[1:], "--dry-run"]) in (0, None)
    assert "aggregate exclude-negative (weak verdicts confirm-warm-up)" in capsys.readouterr().out
    assert main([*shlex.split(pool_alone)[1:], "--dry-run"]) in (0, None)
    assert "aggregate exclude-negative (weak verdicts trust-pool)" in capsys.readouterr().out
