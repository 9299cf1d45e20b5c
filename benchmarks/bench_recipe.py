"""A FlowerTune recipe end to end at its real model's dimensions, on whatever device is there: time per phase and
peak device memory of each round, from ``kfca-llm simulate``'s own report.

    python benchmarks/bench_recipe.py                      # finance: Qwen2.5-7B dimensions, 4-bit, 1 round (GPU)
    python benchmarks/bench_recipe.py --smoke              # a tiny model of the same architecture, CPU (CI)

The base model is built here from the architecture's config at the real dimensions (random weights, the byte
tokenizer: a real download is not possible on the machines this runs on, and the weights' values do not change
the cost of a round), saved with ``save_pretrained`` and loaded by the recipe's own loader (``--model-dir``), 4-bit
as the recipe says; the data are the domain's synthetic rows in the FlowerTune schema (``--data-dir``). Everything
else is the recipe as shipped, changed only by the ``--set`` keys printed with the command.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

# The architectures of the recipes' base models, at their published dimensions (vocabulary: the byte tokenizer's).
ARCHITECTURES = {
    "finance": ("Qwen2Config", dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                                    num_attention_heads=28, num_key_value_heads=4)),  # Qwen/Qwen2.5-7B
}
SMOKE_DIMS = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2)


def build_model(path: Path, domain: str, smoke: bool, layers: int | None) -> int:
    """Save a base model of ``domain``'s architecture (random weights) and the byte tokenizer; its parameter count."""
    import transformers
    from transformers import AutoModelForCausalLM

    from kfca_llm.modeling import build_byte_tokenizer

    config_name, dims = ARCHITECTURES[domain]
    dims = dict(SMOKE_DIMS if smoke else dims)
    if layers:
        dims["num_hidden_layers"] = layers
    tok = build_byte_tokenizer()
    config = getattr(transformers, config_name)(
        vocab_size=len(tok), max_position_embeddings=4096, pad_token_id=tok.pad_token_id,
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, **dims)
    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() and not smoke else "cpu"
    with torch.device(device):  # random init of billions of weights: on the GPU where there is one
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    count = sum(p.numel() for p in model.parameters())
    del model
    if device == "cuda":
        torch.cuda.empty_cache()
    return count


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--recipe", default="finance", choices=sorted(ARCHITECTURES))
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--layers", type=int, default=None, help="fewer decoder layers than the real model")
    parser.add_argument("--rows", type=int, default=400, help="synthetic training rows, over all clients")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="another recipe key")
    parser.add_argument("--smoke", action="store_true", help="a tiny model of the architecture, on the CPU")
    parser.add_argument("--out", type=Path, default=None, help="keep the run folder here (default: a temporary one)")
    args = parser.parse_args(argv)

    import datasets

    from kfca_llm.synthetic import make_rows

    keys = [*(["train.training-arguments.max-steps=1", "train.training-arguments.per-device-train-batch-size=2",
               # three a round: a one-round run of two per round is undetermined (nothing to pay against yet)
               "num-clients=3", "strategy.fraction-train=1.0"] if args.smoke else []),
            *args.set]
    with tempfile.TemporaryDirectory(prefix="kfca-bench-recipe-") as tmp:
        tmp = Path(tmp)
        started = time.perf_counter()
        params = build_model(tmp / "model", args.recipe, args.smoke, args.layers)
        datasets.DatasetDict({"train": datasets.Dataset.from_list(make_rows(args.recipe, args.rows, seed=0))}
                             ).save_to_disk(str(tmp / "data"))
        built_s = time.perf_counter() - started
        out = args.out or tmp / "run"
        command = [sys.executable, "-m", "kfca_llm.cli", "simulate", "--recipe", args.recipe, "--rounds",
                   str(args.rounds), "--model-dir", str(tmp / "model"), "--data-dir", str(tmp / "data"),
                   "--out", str(out), "--no-progress", *(a for key in keys for a in ("--set", key)),
                   *(["--cpu"] if args.smoke else [])]
        started = time.perf_counter()
        subprocess.run(command, check=True)
        run_s = time.perf_counter() - started
        report = json.loads((out / "report.json").read_text())

    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() and not args.smoke else "cpu"
    print(f"\n{args.recipe} recipe, base model {params / 1e9:.3g}B parameters ({args.layers or 'all'} layers), "
          f"device: {device}; model and data built in {built_s:.1f} s; simulate {run_s:.1f} s")
    print("command: " + shlex.join(["kfca-llm", *command[3:]]))
    print("| round | training s | packing s | scoring s | aggregation s | saving s | round wall s | peak device memory |")
    print("|---|---|---|---|---|---|---|---|")
    for number, timing in enumerate(report["timing"], start=1):
        if timing is None:
            continue
        peak = timing["peak_device_bytes"]
        print(f"| {number} | {timing['train_s']:.2f} | {timing['pack_s']:.3f} | {timing['score_s']:.3f} | "
              f"{timing['aggregate_s']:.3f} | {timing['save_s']:.2f} | {timing['wall_s']:.2f} | "
              f"{'-' if peak is None else f'{peak / 2**30:.2f} GiB'} |")
    print("mean rewards: " + ", ".join(f"{name} {entry['mean_reward']:+.4f}"
                                      for name, entry in report["strategies"].items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
