"""A real recipe's model and data set when the hub cannot be reached: one line at once, not a minute of retries
and two tracebacks. The hub is simulated: an endpoint nothing listens on, and an empty cache."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from helpers import RECIPES, ROOT, run_main

UNREACHABLE = "http://127.0.0.1:9"  # the discard port: refused at once, no network needed


def offline_environment(tmp_path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE",
                                                           "HF_DATASETS_OFFLINE", "HF_HUB_CACHE")}
    return {**env, "HF_ENDPOINT": UNREACHABLE, "HF_HOME": str(tmp_path / "empty-cache")}


MISSING = (f"model Qwen/Qwen3-8B and data set flwrlabs/code-alpaca-20k not in the Hugging Face cache and {UNREACHABLE} "
           "cannot be reached: pass --model-dir / --data-dir (local copies), or fill the cache on a machine with network "
           "access")


def test_a_real_recipe_with_the_hub_out_of_reach_is_one_line_and_exit_2(tmp_path):
    """A fresh process, as a user's: the hub client has not been imported before the check."""
    done = subprocess.run([sys.executable, "-m", "kfca_llm.cli", "simulate", "--recipe", str(RECIPES / "code.toml"),
                           "--rounds", "1", "--out", str(tmp_path / "run")], cwd=ROOT,
                          env=offline_environment(tmp_path), capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.splitlines() == [f"kfca-llm: error: {MISSING}"]
    assert not (tmp_path / "run").exists()


def test_check_running_a_real_recipe_with_the_hub_out_of_reach_is_the_same_one_line(tmp_path, capsys, monkeypatch):
    for name, value in offline_environment(tmp_path).items():
        monkeypatch.setenv(name, value)
    for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(name, raising=False)  # and restored after the check has set them
    code, _, err = run_main(capsys, "check", "--recipe", RECIPES / "code.toml", "--seeds", "0", "--out", tmp_path / "r")
    assert code == 2 and err == f"kfca-llm: error: {MISSING}\n"


def test_with_hf_hub_offline_set_only_what_the_cache_lacks_is_named(tmp_path, monkeypatch):
    from kfca_llm import InputError
    from kfca_llm.hub import require_cached_sources

    for name, value in offline_environment(tmp_path).items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    cached = tmp_path / "empty-cache" / "datasets" / "flwrlabs___code-alpaca-20k"
    cached.mkdir(parents=True)  # datasets' own cache holds the data set
    with pytest.raises(InputError, match=r"^model Qwen/Qwen3-8B not in the Hugging Face cache and HF_HUB_OFFLINE is "
                                         r"set: pass --model-dir"):
        require_cached_sources(["Qwen/Qwen3-8B"], ["flwrlabs/code-alpaca-20k"])
    require_cached_sources([], ["flwrlabs/code-alpaca-20k"])
    assert os.environ["HF_DATASETS_OFFLINE"] == "1"  # the libraries read the cache only: no retries
