"""Shared test constants and builders (imported by test modules; fixtures live in conftest.py)."""

from __future__ import annotations

from pathlib import Path

import torch

RECIPES = Path(__file__).resolve().parents[1] / "recipes"
TINY = RECIPES / "tiny.toml"
# A short tiny federation: 3 rounds of 2 local steps, every round saved.
SHORT = ["num-server-rounds=3", "train.training-arguments.max-steps=2", "train.save-every-round=1"]


def short_recipe(*overrides: str):
    from kfca_llm.recipe import load_recipe

    return load_recipe(TINY, [*SHORT, *overrides])


def save_tiny_model(path, config_cls, seed: int, **dims) -> None:
    """A tiny causal LM (byte tokenizer) saved with ``save_pretrained``, for the real loading path.

    Dimensions are multiples of 64, the nf4 block size (bitsandbytes' CPU kernels need that)."""
    from transformers import AutoModelForCausalLM

    from kfca_llm.modeling import build_byte_tokenizer

    tok = build_byte_tokenizer()
    config = config_cls(**{**dict(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                                  pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id,
                                  eos_token_id=tok.eos_token_id), **dims})
    torch.manual_seed(seed)
    AutoModelForCausalLM.from_config(config).save_pretrained(path)
    tok.save_pretrained(path)
