"""Adapter layouts the benchmarks share."""

from __future__ import annotations

PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
# Qwen2.5-7B: 28 layers, hidden 3584, intermediate 18944, 4 KV heads x 128.
QWEN25_7B = dict(layers=28, hidden=3584, intermediate=18944, kv=4 * 128)


def lora_shapes(layers: int, hidden: int, intermediate: int, kv: int, rank: int) -> dict[str, tuple[int, int]]:
    """PEFT state-dict shapes of a LoRA on all attention and MLP projections (A: [r, in], B: [out, r]).

    With ``QWEN25_7B`` and rank 32: 392 tensors, 80,740,352 coordinates."""
    dims = {"q_proj": (hidden, hidden), "k_proj": (hidden, kv), "v_proj": (hidden, kv),
            "o_proj": (hidden, hidden), "gate_proj": (hidden, intermediate),
            "up_proj": (hidden, intermediate), "down_proj": (intermediate, hidden)}
    shapes = {}
    for layer in range(layers):
        for proj in PROJECTIONS:
            block = "self_attn" if proj in ("q_proj", "k_proj", "v_proj", "o_proj") else "mlp"
            prefix = f"base_model.model.model.layers.{layer}.{block}.{proj}"
            fan_in, fan_out = dims[proj]
            shapes[f"{prefix}.lora_A.weight"] = (rank, fan_in)
            shapes[f"{prefix}.lora_B.weight"] = (fan_out, rank)
    return shapes
