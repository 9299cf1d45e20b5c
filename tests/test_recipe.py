import json
import math
from pathlib import Path

import pytest
from helpers import RECIPES, TINY

from kfca_llm.errors import InputError

from kfca_llm.recipe import (
    Recipe, RecipeError, all_keys, clients_per_round, load_recipe, lr_for_round, recipe_from_dict, recipe_to_dict,
)



def test_tiny_recipe_parses_with_the_documented_shape():
    r = load_recipe(TINY)
    assert isinstance(r, Recipe)
    assert r.name == "tiny" and r.domain == "general-nlp"
    assert r.model.name == "tiny-llama" and r.model.quantization is None
    assert r.dataset.name == "synthetic" and r.dataset.num_rows >= r.num_clients
    assert r.num_server_rounds == 10
    assert clients_per_round(r) >= 2
    assert r.kfca.peers is None
    assert r.kfca.attacks == ("honest", "stale", "lagged:2", "lagged:3", "lagged:4", "lagged:5",
                              "sparse:0.75", "sparse:0.5", "sparse:0.25", "flip", "zero", "random",
                              "free-ride:1", "free-ride:2", "free-ride-flip:1", "free-ride-noise:0.05",
                              "free-ride-signs:1")
    assert (r.kfca.public_steps, r.kfca.public_buckets) == (5, 2)
    assert r.model.lora.target_modules == ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def test_overrides_parse_toml_scalars_into_typed_fields():
    r = load_recipe(TINY, ["train.training-arguments.max-steps=5", "num-server-rounds=3", "kfca.seed=7",
                           "train.learning-rate-max=2e-3", "model.lora.peft-use-dora=true",
                           "model.name=Qwen/Qwen2.5-7B", "kfca.attacks=[\"honest\", \"flip\"]", "kfca.peers=2",
                           "model.quantization=4"])
    assert r.train.training_arguments.max_steps == 5
    assert r.num_server_rounds == 3 and r.kfca.seed == 7
    assert r.train.learning_rate_max == pytest.approx(2e-3)
    assert r.model.lora.peft_use_dora is True
    assert r.model.name == "Qwen/Qwen2.5-7B"  # a bare word that is not TOML stays a string
    assert r.kfca.attacks == ("honest", "flip") and r.kfca.peers == 2
    assert r.model.quantization == 4


@pytest.mark.parametrize("value", ["none", "None"])
def test_quantization_override_to_none(value):
    r = load_recipe(RECIPES / "finance.toml", [f"model.quantization={value}", f"kfca.peers={value}"])
    assert r.model.quantization is None and r.kfca.peers is None


def test_quantization_zero_means_none():
    assert load_recipe(RECIPES / "finance.toml", ["model.quantization=0"]).model.quantization is None


def test_unknown_override_key_names_the_key_and_close_matches():
    with pytest.raises(RecipeError) as err:
        load_recipe(TINY, ["train.training-arguments.max-step=5"])
    msg = str(err.value)
    assert "train.training-arguments.max-step" in msg and "train.training-arguments.max-steps" in msg
    with pytest.raises(RecipeError, match="num-server-rounds"):
        load_recipe(TINY, ["num-server-round=3"])


@pytest.mark.parametrize("short, meant", [("max-steps", "train.training-arguments.max-steps"),
                                          ("max_steps", "train.training-arguments.max-steps"),
                                          ("lora-r", "model.lora.peft-lora-r"), ("seq-len", "train.seq-length")])
def test_a_key_given_by_its_last_part_suggests_the_full_key_not_every_key(short, meant):
    with pytest.raises(RecipeError) as err:
        load_recipe(TINY, [f"{short}=2"])
    msg = str(err.value)
    assert meant in msg.partition("did you mean")[2]
    assert "valid keys" not in msg and msg.count(".") < 10  # a few suggestions, not the 40-odd keys


def test_unknown_key_in_file_fails(tmp_path):
    text = TINY.read_text().replace("[strategy]", "[strategy]\nfraction-fit = 0.5")
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(RecipeError, match=r"strategy\.fraction-fit.*strategy\.fraction-train"):
        load_recipe(path)


@pytest.mark.parametrize("override, key", [
    ("train.training-arguments.max-steps=\"ten\"", "train.training-arguments.max-steps"),
    ("model.lora.peft-use-dora=1", "model.lora.peft-use-dora"),
    ("domain=\"law\"", "domain"),
    ("kfca.attacks=[\"honest\", \"lagged:x\"]", "kfca.attacks"),
    ("kfca.penalty=\"median\"", "kfca.penalty"),
    ("strategy.fraction-train=0", "strategy.fraction-train"),
    ("num-clients=1", "num-clients"),
    ("model.quantization=3", "model.quantization"),
    ("train.learning-rate-min=1.0", "train.learning-rate-min"),
    ("train.training-arguments.lr-scheduler-type=\"polynomial\"", "train.training-arguments.lr-scheduler-type"),
    ("train.training-arguments.optim=\"adafactor\"", "train.training-arguments.optim"),
    ("train.training-arguments.warmup-steps=2", "train.training-arguments.lr-scheduler-type"),
    ("train.training-arguments.max-grad-norm=-1", "train.training-arguments.max-grad-norm"),
    ("kfca.seed=-1", "kfca.seed"),
    ("kfca.peers=0", "kfca.peers"),
])
def test_bad_values_fail_naming_the_key(override, key):
    with pytest.raises(RecipeError, match=key.replace(".", r"\.")):
        load_recipe(TINY, [override])


def test_unknown_scheduler_or_optimizer_lists_the_choices():
    with pytest.raises(RecipeError, match="lr-scheduler-type.*'constant', 'constant_with_warmup', 'linear' or 'cosine', got 'polynomial'"):
        load_recipe(TINY, ["train.training-arguments.lr-scheduler-type=polynomial"])
    with pytest.raises(RecipeError, match="optim.*'adamw_torch', 'sgd'.*'paged_adamw_8bit'.*got 'adafactor'"):
        load_recipe(TINY, ["train.training-arguments.optim=adafactor"])


def test_recipe_errors_are_input_errors_for_the_cli():
    from kfca_llm.errors import InputError

    with pytest.raises(InputError):
        load_recipe(TINY, ["no-such-key=1"])


def test_malformed_override_fails():
    with pytest.raises(RecipeError, match="key=value"):
        load_recipe(TINY, ["num-server-rounds"])


def test_lr_schedule_is_flowertune_cosine():
    r = load_recipe(TINY, ["num-server-rounds=4", "train.learning-rate-max=0.5", "train.learning-rate-min=0.1"])
    got = [lr_for_round(r, t) for t in range(1, 5)]
    # cos(pi t/4) for t = 1..4 is sqrt(2)/2, 0, -sqrt(2)/2, -1
    want = [0.1 + 0.2 * (1 + c) for c in (math.sqrt(0.5), 0.0, -math.sqrt(0.5), -1.0)]
    assert got == pytest.approx(want)
    assert got[-1] == pytest.approx(0.1)
    for bad in (0, 5):
        with pytest.raises(ValueError):
            lr_for_round(r, bad)


def test_recipe_to_dict_is_json_with_dashed_keys_and_round_trips():
    r = load_recipe(TINY, ["kfca.peers=3"])
    d = recipe_to_dict(r)
    text = json.dumps(d)
    assert '"num-server-rounds"' in text and '"per-device-train-batch-size"' in text and "_" not in "".join(
        k for k in d)
    assert d["train"]["training-arguments"]["max-steps"] == r.train.training_arguments.max_steps
    assert recipe_from_dict(json.loads(text)) == r


def test_all_keys_lists_flowertune_names():
    keys = set(all_keys())
    for k in ("model.name", "model.quantization", "model.gradient-checkpointing", "model.lora.peft-lora-r",
              "model.lora.peft-lora-alpha", "train.learning-rate-max", "train.learning-rate-min",
              "train.seq-length", "train.save-every-round", "train.training-arguments.per-device-train-batch-size",
              "train.training-arguments.gradient-accumulation-steps", "train.training-arguments.num-train-epochs",
              "train.training-arguments.max-steps", "train.training-arguments.lr-scheduler-type",
              "strategy.fraction-train", "num-server-rounds", "dataset.name", "kfca.peers", "kfca.bonus-fraction",
              "kfca.penalty", "kfca.seed", "kfca.attacks", "kfca.aggregate"):
        assert k in keys


@pytest.mark.parametrize("n, fraction, want", [(20, 0.1, 2), (10, 0.2, 2), (50, 0.1, 5), (6, 0.5, 3), (5, 0.1, 2),
                                               (3, 1.0, 3)])
def test_clients_per_round_follows_flower(n, fraction, want):
    r = load_recipe(TINY, [f"num-clients={n}", f"strategy.fraction-train={fraction}", f"dataset.num-rows={10 * n}"])
    assert clients_per_round(r) == want


def test_attack_specs_are_validated_by_the_attack_registry(monkeypatch):
    from kfca_llm import attack_registry
    from kfca_llm.attacks import register_attack

    monkeypatch.setattr(attack_registry, "_REGISTRY", dict(attack_registry._REGISTRY))  # keep the registration local

    base = TINY
    with pytest.raises(RecipeError, match="kfca.attacks.*sparse:1.0"):
        load_recipe(base, ["kfca.attacks=['honest', 'sparse:1.0']"])
    with pytest.raises(RecipeError, match="kfca.attacks.*duplicate|kfca.attacks"):
        load_recipe(base, ["kfca.attacks=['flip', 'flip']"])

    @register_attack("halve_for_recipe_test")
    def _halve(honest, history, generator):
        return {k: v / 2 for k, v in honest.items()}

    recipe = load_recipe(base, ["kfca.attacks=['honest', 'halve_for_recipe_test']"])
    assert recipe.kfca.attacks == ("honest", "halve_for_recipe_test")


@pytest.mark.parametrize("entries, message", [
    ('["0=flip"]', "client 0, the attack-analysis client"),
    ('["6=flip"]', "outside 0..5"),
    ('["2=flop"]', "invalid spec"),
    ('["2:flip"]', "INDEX=SPEC"),
    ('["2=zero", "2=flip"]', "repeats client 2"),
])
def test_fixed_attackers_are_validated(entries, message):
    base = TINY
    with pytest.raises(RecipeError, match=message):
        load_recipe(base, [f"kfca.attackers={entries}"])


def test_fixed_attackers_parse_to_indices_and_specs():
    from kfca_llm.recipe import fixed_attackers

    base = TINY
    recipe = load_recipe(base, ['kfca.attackers=["3=flip", "5 = lagged:2"]'])
    assert fixed_attackers(recipe) == {3: "flip", 5: "lagged:2"}
    assert fixed_attackers(load_recipe(base, ["kfca.attacks=[]", 'kfca.attackers=["0=zero"]'])) == {0: "zero"}


def test_validating_a_recipe_does_not_import_torch():
    # The package's __init__ (scoring API) imports torch; load recipe.py under a bare package instead.
    import subprocess
    import sys

    code = ("import sys, types; pkg = types.ModuleType('kfca_llm'); pkg.__path__ = [sys.argv[1]]; "
            "sys.modules['kfca_llm'] = pkg; import kfca_llm.recipe as r; r.load_recipe(sys.argv[2]); "
            "print('torch' in sys.modules)")
    package = str(Path(__file__).resolve().parents[1] / "kfca_llm")
    out = subprocess.run([sys.executable, "-c", code, package, str(TINY)], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_typed_values_override_the_recipe_without_toml_text():
    """What a Flower run config gives (already typed scalars, a tuple of attackers): no text round trip."""
    recipe = load_recipe(TINY, ["num-server-rounds=2"], values={"train.training-arguments.max-steps": 3,
                                                                "kfca.attackers": ("1=flip",),
                                                                "num-server-rounds": 5})
    assert recipe.train.training_arguments.max_steps == 3 and recipe.kfca.attackers == ("1=flip",)
    assert recipe.num_server_rounds == 5  # values apply after the key=value overrides
    with pytest.raises(InputError, match="unknown recipe key 'train.max-stepz'"):
        load_recipe(TINY, values={"train.max-stepz": 1})
    with pytest.raises(InputError, match="train.training-arguments.max-steps"):
        load_recipe(TINY, values={"train.training-arguments.max-steps": "three"})


def test_the_data_order_is_flowertunes_static_one_unless_a_recipe_asks_for_a_dynamic_seed():
    """``train.dynamic-data-seed`` defaults to FlowerTune's false (a client's training seed is the same every round);
    true seeds it by the round as well, the seed the tiny recipe's published tables were measured with."""
    from kfca_llm.fl.seeds import TRAIN, derive_seed, train_seed

    assert load_recipe("general-nlp").train.dynamic_data_seed is False
    assert load_recipe(TINY).train.dynamic_data_seed is True
    assert load_recipe(TINY, ["train.dynamic-data-seed=false"]).train.dynamic_data_seed is False
    assert train_seed(0, 1, 3, False) == train_seed(0, 7, 3, False) != train_seed(0, 1, 4, False)
    assert train_seed(0, 1, 3, True) != train_seed(0, 2, 3, True)
    assert [train_seed(5, t, 3, True) for t in (1, 2)] == [derive_seed(5, TRAIN, t, 3) for t in (1, 2)]


def test_public_conditioning_keys_are_validated():
    from kfca_llm.recipe import RecipeError, load_recipe

    assert load_recipe(None, ["kfca.public-steps=0"]).kfca.conditioning.enabled is False
    for bad in ("kfca.public-steps=6", "kfca.public-buckets=3"):
        with pytest.raises(RecipeError):
            load_recipe(None, [bad])


def test_simulate_refuses_the_sampled_penalty_with_public_steps_before_training():
    """The Flower app does not condition yet, so the recipe accepts the pair; simulate refuses it at once."""
    from kfca_llm.errors import InputError
    from kfca_llm.fl.rounds import FederationOptions, run_federation
    from kfca_llm.recipe import load_recipe

    recipe = load_recipe(None, ['kfca.penalty="sampled"'])
    with pytest.raises(InputError, match="public-steps = 0"):
        run_federation(recipe, FederationOptions(progress=False))
