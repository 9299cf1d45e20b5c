import pytest
import transformers
from transformers import LlamaConfig, Qwen2Config, Qwen3Config

from kfca_llm.plan import build_plan, dry_run, main
from kfca_llm.recipe import RecipeError, load_recipe

from helpers import RECIPES, TINY

# Real dimensions of the four winners' base models (hidden, intermediate, layers, heads, kv heads, head dim).
ARCHS = {
    "finance": (Qwen2Config, dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                                  num_attention_heads=28, num_key_value_heads=4, vocab_size=152064), 128, "qwen2"),
    "medical": (LlamaConfig, dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                                  num_attention_heads=32, num_key_value_heads=8, vocab_size=128256), 128, "llama"),
    "code": (Qwen3Config, dict(hidden_size=4096, intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32,
                               num_key_value_heads=8, head_dim=128, vocab_size=151936), 128, "qwen3"),
    # transformers ships InternLM3 natively (Llama implementation) from 5.23.0 (the first release with
    # InternLM3Config); older releases skip this case (the general-nlp recipe itself needs 5.23 or remote code)
    "general-nlp": (getattr(transformers, "InternLM3Config", None), dict(hidden_size=4096, intermediate_size=10240, num_hidden_layers=48,
                                          num_attention_heads=32, num_key_value_heads=2, head_dim=128,
                                          vocab_size=128512), 128, "internlm3"),
}


def expected_adapter(dims, head_dim, targets, r, dora):
    """LoRA adds r*(in+out) per adapted linear, DoRA also a magnitude vector of size out."""
    h, i = dims["hidden_size"], dims["intermediate_size"]
    q_out, kv_out = dims["num_attention_heads"] * head_dim, dims["num_key_value_heads"] * head_dim
    in_out = {"q_proj": (h, q_out), "k_proj": (h, kv_out), "v_proj": (h, kv_out), "o_proj": (q_out, h),
              "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h)}
    per_layer = sum(r * (in_out[t][0] + in_out[t][1]) + (in_out[t][1] if dora else 0) for t in targets)
    return dims["num_hidden_layers"] * per_layer


@pytest.mark.parametrize("domain", list(ARCHS))
def test_dry_run_counts_the_winners_adapters_from_real_dimensions(domain, tmp_path):
    cls, dims, head_dim, model_type = ARCHS[domain]
    if cls is None:
        pytest.skip(f"transformers {transformers.__version__} has no InternLM3Config (first shipped in 5.23.0)")
    cls(**dims).save_pretrained(tmp_path)
    recipe = load_recipe(RECIPES / f"{domain}.toml")
    plan = build_plan(recipe, model_dir=tmp_path)
    lora = recipe.model.lora
    want = expected_adapter(dims, head_dim, lora.target_modules, lora.peft_lora_r, lora.peft_use_dora)
    assert plan.architecture == model_type
    assert plan.adapter_params == want
    assert plan.adapted_modules == dims["num_hidden_layers"] * len(lora.target_modules)
    assert len(plan.adapter_shapes) == plan.adapted_modules * (3 if lora.peft_use_dora else 2)
    assert plan.base_params > 6_000_000_000  # all four are 7-8B models
    # every tensor's size is a multiple of 32 here, so packed signs are exactly one bit per parameter
    assert plan.sign_bytes_per_update == want // 8
    assert plan.clients_per_round == 2
    assert plan.upload_bytes_per_round("bf16") == 2 * 2 * want
    assert plan.download_bytes_per_round("fp32") == 2 * 4 * want
    assert plan.local_steps == 10
    # 4-bit: every decoder linear at 4.5 bits (nf4 + one fp32 scale per 64), embeddings/head/norms in bf16
    h, i, L = dims["hidden_size"], dims["intermediate_size"], dims["num_hidden_layers"]
    q_out, kv_out = dims["num_attention_heads"] * head_dim, dims["num_key_value_heads"] * head_dim
    linear = L * (2 * h * q_out + 2 * h * kv_out + 3 * h * i)
    assert plan.base_weight_bytes == int(linear * 4.5 / 8) + 2 * (plan.base_params - linear)
    optim_bytes = 2  # paged_adamw_8bit: two 8-bit moments
    assert plan.adapter_train_bytes == want * (4 + 4 + optim_bytes)
    text = plan.describe()
    assert f"{want:,} trainable parameters" in text and "10 rounds, " in text and "2 per round" in text
    assert "synthetic stand-ins" in text  # no data set offline


def test_dry_run_rejects_targets_the_architecture_lacks(tmp_path):
    LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, vocab_size=300).save_pretrained(tmp_path)
    recipe = load_recipe(RECIPES / "medical.toml", ['model.lora.target-modules=["c_attn"]'])
    with pytest.raises(RecipeError, match="target-modules"):
        build_plan(recipe, model_dir=tmp_path)


def test_tiny_dry_run_formats_rows_with_token_counts():
    recipe = load_recipe(TINY)
    plan = build_plan(recipe, n_rows=3)
    assert len(plan.samples) == 3
    for s in plan.samples:
        assert s.prompt.startswith("<|im_start|>user\n") and s.response.endswith("<|im_end|>\n")
        # byte tokenizer: BOS + one token per byte, except the two ChatML markers per turn
        assert s.prompt_tokens == 1 + len(s.prompt.replace("<|im_start|>", "S").replace("<|im_end|>", "E").encode())
        assert s.response_tokens == 1 + len(s.response.replace("<|im_end|>", "E").encode())
    text = dry_run(recipe)
    assert "tiny-llama" in text and "3 per round" in text and "sign update" in text


def test_module_entry_point_prints_the_plan(capsys):
    assert main([str(TINY), "--set", "num-server-rounds=4", "--rows", "1"]) == 0
    out = capsys.readouterr().out
    assert "4 rounds" in out and "--- row 0" in out and "--- row 1" not in out


def test_offline_dry_run_fails_at_once_with_a_hint(tmp_path, monkeypatch):
    import kfca_llm.plan as plan

    monkeypatch.setenv("HF_HOME", str(tmp_path / "empty-cache"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache" / "hub"))
    monkeypatch.setattr(plan, "hub_reachable", lambda timeout=5.0: pytest.fail("offline: no request expected"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(RecipeError, match="HF_HUB_OFFLINE is set: pass --model-dir"):
        build_plan(load_recipe(RECIPES / "medical.toml"))
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setattr(plan, "hub_reachable", lambda timeout=5.0: False)
    with pytest.raises(RecipeError, match="the hub cannot be reached: pass --model-dir"):
        build_plan(load_recipe(RECIPES / "medical.toml"))


def test_missing_or_empty_model_dir_is_named(tmp_path):
    recipe = load_recipe(RECIPES / "medical.toml")
    with pytest.raises(RecipeError, match="is not a directory"):
        build_plan(recipe, model_dir=tmp_path / "missing")
    with pytest.raises(RecipeError, match="holds no config.json"):
        build_plan(recipe, model_dir=tmp_path)
