"""The winners' real stack on the CPU: a tiny model and data set saved locally, loaded with from_pretrained
and load_from_disk, the recipe as is (4-bit nf4 base with bf16 compute, k-bit preparation, gradient
checkpointing, LoRA or DoRA on its targets, its optimizer, paged 8-bit AdamW), one local step through
train_client. CPU nf4 is slow, so each domain trains one step of two examples."""

import bitsandbytes as bnb
import datasets
import pytest
import torch
from helpers import RECIPES, TINY, save_tiny_model
from transformers import LlamaConfig, Qwen2Config, Qwen3Config

from kfca_llm.data import IGNORE_INDEX, load_client_datasets
from kfca_llm.fl import client
from kfca_llm.fl.training_plan import TrainingPlan
from kfca_llm.modeling import load_model_and_tokenizer
from kfca_llm.recipe import load_recipe
from kfca_llm.synthetic import make_rows

CONFIGS = {"general-nlp": LlamaConfig, "finance": Qwen2Config, "medical": LlamaConfig, "code": Qwen3Config}
ONE_SMALL_STEP = ["num-clients=4", "train.training-arguments.max-steps=1",
                  "train.training-arguments.per-device-train-batch-size=2",
                  "train.training-arguments.gradient-accumulation-steps=1"]


def optimizers_made(monkeypatch) -> list:
    made = []
    real = client.make_optimizer

    def spy(params, lr, optim):
        made.append(real(params, lr, optim))
        return made[-1]

    monkeypatch.setattr(client, "make_optimizer", spy)
    return made


@pytest.mark.parametrize("domain", list(CONFIGS))
def test_winner_recipe_trains_a_4bit_base_on_the_cpu(domain, tmp_path, monkeypatch):
    model_dir, data_dir = tmp_path / "model", tmp_path / "data"
    save_tiny_model(model_dir, CONFIGS[domain], seed=len(domain))
    # 45 rows for the clients and the rows the recipe sets aside for the held-out evaluation
    rows = make_rows(domain, 45 + load_recipe(RECIPES / f"{domain}.toml").dataset.heldout_rows, seed=3)
    datasets.DatasetDict({"train": datasets.Dataset.from_list(rows)}).save_to_disk(
        str(data_dir))
    recipe = load_recipe(RECIPES / f"{domain}.toml", ONE_SMALL_STEP)
    assert recipe.model.quantization == 4 and recipe.train.training_arguments.optim == "paged_adamw_8bit"
    with pytest.warns(UserWarning, match="4-bit on the CPU"):
        model, tok = load_model_and_tokenizer(recipe, device="cpu", model_dir=model_dir)
    assert model.config.use_cache is False
    assert any(getattr(m, "gradient_checkpointing", False) for m in model.modules())
    quantized = [m for m in model.modules() if isinstance(m, bnb.nn.Linear4bit)]
    assert quantized and all(m.weight.quant_state.quant_type == "nf4" for m in quantized)

    clients = load_client_datasets(recipe, tok, data_dir=data_dir)
    assert [len(c) for c in clients] == [11] * 4
    item = clients[0][0]
    prompt = tok.decode(item["input_ids"][:sum(1 for label in item["labels"] if label == IGNORE_INDEX)])
    if recipe.train.prompt_format == "chat-template":  # Qwen-based winners: the saved tokenizer's template
        assert prompt.endswith("<|im_start|>assistant\n")
    else:
        assert prompt.endswith("### Response:\n")

    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    assert any("lora_magnitude_vector" in n for n in trainable) == recipe.model.lora.peft_use_dora
    made = optimizers_made(monkeypatch)
    global_state = client.adapter_state(model)
    result = client.train_client(model, global_state, clients[0], TrainingPlan.of(recipe), server_round=1, seed=0,
                                 device=torch.device("cpu"), pad_token_id=tok.pad_token_id)
    assert [type(o) for o in made] == [bnb.optim.PagedAdamW8bit]
    assert all(torch.isfinite(u).all() for u in result.update.values())
    # lora_B starts at zero: the first step moves it, so the update is not zero there
    assert any(u.abs().sum() > 0 for k, u in result.update.items() if "lora_B" in k)
    assert set(result.update) == set(global_state)


def test_tiny_recipe_quantizes_its_base_when_asked():
    recipe = load_recipe(TINY, ["model.quantization=4"])
    model, _ = load_model_and_tokenizer(recipe)
    assert any(isinstance(m, bnb.nn.Linear4bit) for m in model.modules())
    again, _ = load_model_and_tokenizer(recipe)  # seeded: the same adapter init
    a, b = client.adapter_state(model), client.adapter_state(again)
    assert all(torch.equal(a[k], b[k]) for k in a)
    # The adapter trains in float32 over the 4-bit base (peft's default) and travels so: a retrain's values are not
    # rounded to 16 bits, which pool rule 11's value sketch would read as a replay (docs/few-peers.md).
    assert {p.dtype for p in model.parameters() if p.requires_grad} == {torch.float32}
    assert {v.dtype for v in a.values()} == {torch.float32}
    plain, _ = load_model_and_tokenizer(load_recipe(TINY))
    assert not any(isinstance(m, bnb.nn.Linear4bit) for m in plain.modules())
