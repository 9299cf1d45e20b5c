import pytest
import torch

from kfca_llm.modeling import build_tokenizer, load_model_and_tokenizer
from kfca_llm.recipe import load_recipe

from helpers import TINY


def _adapter(model):
    return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen2"])
def test_tiny_model_is_small_seeded_and_only_the_adapter_trains(name):
    r = load_recipe(TINY, [f"model.name={name}"])
    model, tok = load_model_and_tokenizer(r)
    total = sum(p.numel() for p in model.parameters())
    assert 100_000 < total < 1_000_000
    trainable = _adapter(model)
    assert trainable and all("lora_" in n for n in trainable)
    # LoRA adds r*(in+out) per target linear: hidden 128, kv 64, mlp 256, 2 layers, r = 8
    shapes = {"q_proj": (128, 128), "k_proj": (128, 64), "v_proj": (128, 64), "o_proj": (128, 128),
              "gate_proj": (128, 256), "up_proj": (128, 256), "down_proj": (256, 128)}
    assert sum(v.numel() for v in trainable.values()) == 2 * 8 * sum(i + o for i, o in shapes.values())
    model2, _ = load_model_and_tokenizer(r)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), model2.state_dict().values()))
    model3, _ = load_model_and_tokenizer(load_recipe(TINY, [f"model.name={name}", "kfca.seed=1"]))
    assert not torch.equal(_adapter(model)[next(iter(trainable))], _adapter(model3)[next(iter(trainable))])
    assert len(tok) == model.get_input_embeddings().num_embeddings


def test_tiny_model_loads_without_touching_the_global_rng():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    load_model_and_tokenizer(load_recipe(TINY))
    assert torch.equal(torch.rand(3), expected)


def test_tokenizer_for_tiny_recipe_is_built_locally():
    tok = build_tokenizer(load_recipe(TINY))
    ids = tok("héllo")["input_ids"]
    assert ids[0] == tok.bos_token_id and tok.decode(ids[1:]) == "héllo"
    assert len(ids) == 1 + len("héllo".encode())
