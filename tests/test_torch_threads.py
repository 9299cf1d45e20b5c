"""torch's intra-op threads during a federation (``train.torch-threads``): one for the built-in tiny models.

With torch's default, a thread per core, the demo's training took 9.5-18.3 s of a round on a busy machine instead
of 0.7 s with one thread; a 0.36M-parameter model gains nothing from more."""

from __future__ import annotations

import torch
from helpers import RECIPES, short_recipe

from kfca_llm.fl.rounds import FederationOptions, federation_threads, run_federation
from kfca_llm.recipe import load_recipe


def test_the_tiny_recipe_runs_on_one_thread_unless_a_setting_or_omp_num_threads_says_otherwise(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    tiny = short_recipe()
    assert federation_threads(tiny, None) == 1
    assert federation_threads(short_recipe("train.torch-threads=3"), None) == 3  # --set train.torch-threads=3
    assert federation_threads(tiny, RECIPES) is None  # a model from --model-dir: torch's own default
    assert federation_threads(load_recipe(RECIPES / "medical.toml"), None) is None
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert federation_threads(tiny, None) is None  # the user's own setting stands


def test_the_setting_holds_while_the_rounds_run_and_the_callers_comes_back(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    before = torch.get_num_threads()
    seen = []
    recipe = short_recipe("num-server-rounds=1", "train.training-arguments.max-steps=1", "train.torch-threads=2",
                          'kfca.attacks=["honest", "flip"]')
    torch.set_num_threads(1)
    try:
        run_federation(recipe, FederationOptions(progress=False, evaluate=False,
                                                 on_round=lambda context: seen.append(torch.get_num_threads())))
        assert seen == [2] and torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
