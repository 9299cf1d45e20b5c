"""Tokenizer and base model + LoRA/DoRA adapter for a recipe.

Tiny recipes (``model.name`` one of ``TINY_MODELS``) build everything in code: a byte-level tokenizer and a
small Llama- or Qwen2-style causal LM with seeded weights, so tests and CPU simulations need no download.
Real recipes load a Hugging Face model (by id or from a local ``model_dir``). ``model.quantization`` (4: nf4
with bf16 compute, 8: LLM.int8) loads the base through bitsandbytes, on a CUDA device or, slowly, on the
CPU; a tiny base is quantized the same way (saved to a temporary folder and loaded back).
"""

from __future__ import annotations

import tempfile
import warnings
from pathlib import Path
from typing import Any

import torch

from .recipe import Recipe

TINY_MODELS = ("tiny-llama", "tiny-qwen2")
# ChatML turn markers are single tokens (as in Qwen) so chat-formatted tiny sequences stay short.
_SPECIAL_TOKENS = ("<pad>", "<s>", "</s>", "<|im_start|>", "<|im_end|>")
# A minimal ChatML chat template (as Qwen uses) so the tiny tokenizer serves prompt-format "chat-template".
_TINY_CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def is_tiny(recipe: Recipe) -> bool:
    return recipe.model.name in TINY_MODELS


def build_byte_tokenizer() -> Any:
    """Byte-level tokenizer built in code: 256 byte tokens + <pad>, <s> (BOS, prepended), </s> (EOS) and
    the ChatML markers <|im_start|>, <|im_end|>."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {tok: i for i, tok in enumerate(_SPECIAL_TOKENS)}
    for ch in sorted(alphabet):
        vocab[ch] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))  # no merges: one token per byte
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                       special_tokens=[("<s>", vocab["<s>"])])
    tok.add_special_tokens(list(_SPECIAL_TOKENS))  # never split into bytes
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>",
                                   additional_special_tokens=["<|im_start|>", "<|im_end|>"])
    fast.padding_side = "right"
    fast.chat_template = _TINY_CHAT_TEMPLATE
    return fast


def build_tokenizer(recipe_or_model_dir: Recipe | str | Path, *, trust_remote_code: bool = False) -> Any:
    """The recipe's tokenizer (tiny: built in code), or the one saved in a local model directory."""
    if isinstance(recipe_or_model_dir, Recipe):
        if is_tiny(recipe_or_model_dir):
            return build_byte_tokenizer()
        source: str | Path = recipe_or_model_dir.model.name
        trust_remote_code = trust_remote_code or recipe_or_model_dir.model.trust_remote_code
    else:
        source = recipe_or_model_dir
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(source), trust_remote_code=trust_remote_code)
    if tokenizer.pad_token is None:  # Llama-style tokenizers ship without one; padding is masked anyway
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "right"
    return tokenizer


def tiny_config(name: str, vocab_size: int) -> Any:
    """Config of a tiny model (about 0.3M parameters): 2 layers, hidden 128, 4 heads, 2 key/value heads."""
    from transformers import LlamaConfig, Qwen2Config

    dims = dict(vocab_size=vocab_size, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                tie_word_embeddings=True, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    if name == "tiny-llama":
        return LlamaConfig(**dims)
    if name == "tiny-qwen2":
        return Qwen2Config(**dims)
    raise ValueError(f"unknown tiny model {name!r}; expected one of {TINY_MODELS}")


def lora_config(recipe: Recipe) -> Any:
    """peft LoraConfig from ``recipe.model.lora`` (LoRA, or DoRA with ``peft-use-dora``)."""
    from peft import LoraConfig

    spec = recipe.model.lora
    return LoraConfig(r=spec.peft_lora_r, lora_alpha=spec.peft_lora_alpha, lora_dropout=spec.peft_lora_dropout,
                      target_modules=list(spec.target_modules), use_dora=spec.peft_use_dora,
                      bias="none", task_type="CAUSAL_LM")


def warn_if_quantized_on_cpu(recipe: Recipe, device: str | torch.device) -> None:
    """bitsandbytes quantizes on the CPU too, but an 8B model then trains very slowly: say so, once."""
    q = recipe.model.quantization
    if q is not None and torch.device(device).type == "cpu" and not is_tiny(recipe):
        warnings.warn(f"recipe {recipe.name!r} loads {recipe.model.name} in {q}-bit on the CPU: bitsandbytes "
                      "supports it, but training is very slow without a CUDA GPU", stacklevel=2)


def _device_map(device: str | torch.device) -> dict[str, int | str]:
    """Quantized weights live where they are loaded: the whole model on this process's device."""
    dev = torch.device(device)
    if dev.type == "cuda":
        return {"": dev.index if dev.index is not None else torch.cuda.current_device()}
    return {"": dev.type}


def load_model_and_tokenizer(recipe: Recipe, *, device: str | torch.device = "cpu",
                             model_dir: str | Path | None = None) -> tuple[Any, Any]:
    """Base model with the recipe's LoRA/DoRA adapter (a ``peft.PeftModel``) and its tokenizer.

    The adapter is the only trainable part. Tiny recipes build the model from a config with weights (and
    adapter) seeded by ``recipe.kfca.seed``, without disturbing the caller's RNG."""
    if model_dir is None and is_tiny(recipe):
        tokenizer = build_byte_tokenizer()
        from transformers import AutoModelForCausalLM

        config = tiny_config(recipe.model.name, len(tokenizer))
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(recipe.kfca.seed)
            base = AutoModelForCausalLM.from_config(config)
            if recipe.model.quantization is None:
                from peft import get_peft_model

                return get_peft_model(base, lora_config(recipe)).to(device), tokenizer
            with tempfile.TemporaryDirectory() as tmp:
                base.save_pretrained(tmp)
                return _load_pretrained(recipe, tmp, device), tokenizer
    warn_if_quantized_on_cpu(recipe, device)
    source = str(model_dir) if model_dir is not None else recipe.model.name
    tokenizer = build_tokenizer(source, trust_remote_code=recipe.model.trust_remote_code)
    return _load_pretrained(recipe, source, device), tokenizer


def _keep_4bit_training_layout(model) -> None:
    """bitsandbytes repacks a 4-bit weight for its CPU inference kernel the first time the layer runs in
    eval mode without gradients (our probe loss does), and keeps that layout: later training forwards then
    take the inference-only kernel, which fails on layers with a bias (Qwen2's q/k/v). Keep the layout
    training uses."""
    import bitsandbytes as bnb

    for module in model.modules():
        if isinstance(module, bnb.nn.Linear4bit):
            module.support_avx512bf16_for_cpu = False


def _load_pretrained(recipe: Recipe, source: str, device: str | torch.device) -> Any:
    """``from_pretrained`` (quantized when the recipe says so), k-bit preparation, checkpointing, adapter."""
    from peft import get_peft_model
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    kwargs: dict[str, Any] = {"trust_remote_code": recipe.model.trust_remote_code}
    q = recipe.model.quantization
    if q is not None:
        if q == 4:
            kwargs["quantization_config"] = BitsAndBytesConfig(
                load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.bfloat16)
        else:
            kwargs["quantization_config"] = BitsAndBytesConfig(load_in_8bit=True)
        kwargs["device_map"] = _device_map(device)
        kwargs["dtype"] = torch.bfloat16
    else:
        kwargs["dtype"] = torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32
    model = AutoModelForCausalLM.from_pretrained(source, **kwargs)
    model.config.use_cache = False  # the cache is useless in training and breaks gradient checkpointing
    ckpt_kwargs = {"use_reentrant": False}
    if q is not None:
        from peft import prepare_model_for_kbit_training

        _keep_4bit_training_layout(model)
        model = prepare_model_for_kbit_training(
            model, use_gradient_checkpointing=recipe.model.gradient_checkpointing,
            gradient_checkpointing_kwargs=ckpt_kwargs)
    else:
        model = model.to(device)
        if recipe.model.gradient_checkpointing:
            # transformers >= 5 renamed it (the old name warns); older releases only have the old one
            if hasattr(model, "activation_checkpointing_enable"):
                model.activation_checkpointing_enable(activation_checkpointing_kwargs=ckpt_kwargs)
            else:
                model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=ckpt_kwargs)
            model.enable_input_require_grads()  # frozen embeddings: checkpointed blocks need inputs with grad
    return get_peft_model(model, lora_config(recipe))
