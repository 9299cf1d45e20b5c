"""Real loading path (from_pretrained + load_from_disk) on a tiny model and data set saved locally."""

import datasets
import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config, Qwen3Config

from kfca_llm.data import IGNORE_INDEX, collate, load_client_datasets
from kfca_llm.modeling import build_byte_tokenizer, load_model_and_tokenizer
from kfca_llm.recipe import load_recipe
from kfca_llm.synthetic import make_rows

from helpers import RECIPES

CONFIGS = {"general-nlp": LlamaConfig, "finance": Qwen2Config, "medical": LlamaConfig, "code": Qwen3Config}


def save_tiny_model(path, config_cls, seed):
    tok = build_byte_tokenizer()
    config = config_cls(vocab_size=len(tok), hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                        pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    torch.manual_seed(seed)
    AutoModelForCausalLM.from_config(config).save_pretrained(path)
    tok.save_pretrained(path)


@pytest.mark.parametrize("domain", list(CONFIGS))
def test_recipe_loads_local_model_and_data_and_trains_one_step(domain, tmp_path):
    model_dir, data_dir = tmp_path / "model", tmp_path / "data"
    save_tiny_model(model_dir, CONFIGS[domain], seed=len(domain))
    rows = make_rows(domain, 45, seed=3)
    datasets.DatasetDict({"train": datasets.Dataset.from_list(rows)}).save_to_disk(str(data_dir))
    # the winner recipe as is (LoRA/DoRA, targets, gradient checkpointing), in full precision on the CPU
    recipe = load_recipe(RECIPES / f"{domain}.toml", ["model.quantization=none", "num-clients=4"])
    model, tok = load_model_and_tokenizer(recipe, device="cpu", model_dir=model_dir)
    assert model.config.use_cache is False
    assert any(getattr(m, "gradient_checkpointing", False) for m in model.modules())

    clients = load_client_datasets(recipe, tok, data_dir=data_dir)
    assert [len(c) for c in clients] == [11] * 4
    item = clients[0][0]
    n_masked = sum(1 for label in item["labels"] if label == IGNORE_INDEX)
    prompt = tok.decode(item["input_ids"][:n_masked])
    if recipe.train.prompt_format == "chat-template":  # Qwen-based winners: the saved tokenizer's template
        assert prompt.endswith("<|im_start|>assistant\n")
    else:
        assert prompt.endswith("### Response:\n")

    trainable = {n: p for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    assert any("lora_magnitude_vector" in n for n in trainable) == recipe.model.lora.peft_use_dora
    model.train()
    loss = model(**collate(clients[0][:2], tok.pad_token_id)).loss
    assert torch.isfinite(loss)
    loss.backward()
    # lora_B starts at zero, so at the first step the gradient reaches the B matrices
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for n, p in trainable.items() if "lora_B" in n)
    assert all(p.grad is None for n, p in model.named_parameters() if not p.requires_grad)
