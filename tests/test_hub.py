"""A real recipe's model and data set when the hub cannot be reached: one line at once, not a minute of retries
and two tracebacks. The hub is simulated: an endpoint nothing listens on, and an empty cache."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from helpers import RECIPES, ROOT

UNREACHABLE = "http://127.0.0.1:9"  # the discard port: refused at once, no network needed


def offline_environment(tmp_path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE",
                                                           "HF_DATASETS_OFFLINE", "HF_HUB_CACHE")}
    return {**env, "HF_ENDPOINT": UNREACHABLE, "HF_HOME": str(tmp_path / "empty-cache")}


@pytest.mark.parametrize("command", [["simulate"], ["check", "--seeds", "0"]])
def test_a_real_recipe_with_the_hub_out_of_reach_is_one_line_and_exit_2(tmp_path, command):
    done = subprocess.run([sys.executable, "-m", "kfca_llm.cli", *command, "--recipe", str(RECIPES / "code.toml"),
                           "--rounds", "1", "--out", str(tmp_path / "run")], cwd=ROOT,
                          env=offline_environment(tmp_path), capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stdout == ""
    (line,) = done.stderr.splitlines()
    assert line == (f"kfca-llm: error: model Qwen/Qwen3-8B and data set flwrlabs/code-alpaca-20k not in the Hugging "
                    f"Face cache and {UNREACHABLE} cannot be reached: pass --model-dir / --data-dir (local copies), "
                    "or fill the cache on a machine with network access")
    assert not (tmp_path / "run").exists()


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
