"""Pack + score throughput of the Triton backend against a device copy and a naive torch baseline.

    python benchmarks/bench_triton.py                      # n=20 clients, Qwen2.5-7B rank-32 LoRA, bf16
    python benchmarks/bench_triton.py --smoke              # tiny, CPU under TRITON_INTERPRET=1 (CI)

Default adapter: a rank-32 LoRA on all seven projections of Qwen2.5-7B (28 layers, hidden 3584,
intermediate 18944, 4 KV heads x 128): 392 tensors, 80,740,352 coordinates per client.

Reported, all measured in the same run on the same device:
* pack: every client's tensors streamed through ``TritonBackend.pack`` (one launch per tensor);
  bandwidth = bytes read (the updates) + bytes written (sign words) per second;
* copy: a device-to-device copy of the same update bytes, once per tensor (same launch count as
  pack) and once as one flat buffer; bandwidth = bytes read + written per second;
* score: ``round_counts`` (the three binary Gram matrices) and ``sampled_matches`` for all pairs;
* naive: torch on the device, ``((x_i < 0) & (x_j < 0)).sum()`` per unordered pair over the float
  updates: a lower bound on a naive implementation (it counts one set, not three).
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported

from kfca_llm.engine.layout import Layout  # noqa: E402
from kfca_llm.engine.triton_backend import TritonBackend  # noqa: E402

PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def lora_shapes(layers: int, hidden: int, intermediate: int, kv: int, rank: int) -> dict[str, tuple[int, int]]:
    """PEFT state-dict shapes of a LoRA on all attention and MLP projections (A: [r, in], B: [out, r])."""
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


def timed(fn, device: torch.device, repeats: int) -> float:
    """Best wall time of ``fn`` over ``repeats`` runs (after one warm-up), synchronizing the device."""
    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    fn()
    sync()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        sync()
        best = min(best, time.perf_counter() - start)
    return best


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    parser.add_argument("--layers", type=int, default=28)
    parser.add_argument("--hidden", type=int, default=3584)
    parser.add_argument("--intermediate", type=int, default=18944)
    parser.add_argument("--kv", type=int, default=4 * 128, help="KV heads x head dim")
    parser.add_argument("--rank", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes; runs on CPU under TRITON_INTERPRET=1")
    args = parser.parse_args(argv)
    if args.smoke:
        args.clients, args.layers, args.hidden, args.intermediate, args.kv, args.rank, args.repeats = 3, 2, 64, 160, 16, 4, 1

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = DTYPES[args.dtype]
    shapes = lora_shapes(args.layers, args.hidden, args.intermediate, args.kv, args.rank)
    layout = Layout.from_shapes(shapes)
    generator = torch.Generator(device=device).manual_seed(args.seed)
    # Each client's tensors live in one flat buffer (as a loaded checkpoint does), viewed per tensor.
    flats = [torch.randn(layout.n_coords, generator=generator, device=device).to(dtype) for _ in range(args.clients)]
    for flat in flats:
        flat[torch.rand(flat.numel(), generator=generator, device=device) < 0.05] = 0.0
    updates, offsets = [], {}
    start = 0
    for slot in layout.slots:
        offsets[slot.name] = start
        start += slot.numel
    for flat in flats:
        updates.append([flat[offsets[s.name]:offsets[s.name] + s.numel].view(s.shape) for s in layout.slots])

    backend = TritonBackend()
    n, d = args.clients, layout.n_coords
    in_bytes = n * d * flats[0].element_size()
    out_bytes = n * layout.n_words * 4
    pairs = [(i, j) for i in range(n) for j in range(n) if i != j]

    def pack_per_tensor():  # the streaming path: one launch per tensor as it arrives
        buffers = backend.allocate(n, layout, device)
        for client, tensors in enumerate(updates):
            for k, values in enumerate(tensors):
                backend.pack(buffers, client, k, values)
        return buffers

    def pack_grouped():  # score_updates' path: one launch per client (and float dtype)
        buffers = backend.allocate(n, layout, device)
        for client, tensors in enumerate(updates):
            backend.pack_many(buffers, client, list(enumerate(tensors)))
        return buffers

    buffers = pack_grouped()
    assert all((a == b).all() for a, b in zip(backend.host_words(buffers), backend.host_words(pack_per_tensor())))
    t_pack = timed(pack_per_tensor, device, args.repeats)
    t_grouped = timed(pack_grouped, device, args.repeats)
    copies = [torch.empty_like(flat) for flat in flats]
    copy_views = [[c[offsets[s.name]:offsets[s.name] + s.numel].view(s.shape) for s in layout.slots] for c in copies]

    def copy_per_tensor():
        for src_tensors, dst_tensors in zip(updates, copy_views):
            for src, dst in zip(src_tensors, dst_tensors):
                dst.copy_(src)

    def copy_flat():
        for src, dst in zip(flats, copies):
            dst.copy_(src)

    t_copy_tensors = timed(copy_per_tensor, device, args.repeats)
    t_copy_flat = timed(copy_flat, device, args.repeats)
    t_gram = timed(lambda: backend.round_counts(buffers, args.seed, 0.5), device, args.repeats)
    t_sampled = timed(lambda: backend.sampled_matches(buffers, args.seed, 0.5, pairs), device, args.repeats)

    def naive_torch():
        negative_counts = []
        for i in range(n):
            for j in range(i, n):
                negative_counts.append(((flats[i] < 0) & (flats[j] < 0)).sum())
        return torch.stack(negative_counts)

    t_naive = timed(naive_torch, device, args.repeats)

    # Correctness guard: the packed words and counts agree with the CPU backend in smoke runs.
    if args.smoke:
        from kfca_llm.engine import get_backend
        cpu = get_backend("cpu")
        cpu_buffers = cpu.allocate(n, layout)
        for client, tensors in enumerate(updates):
            for k, values in enumerate(tensors):
                cpu.pack(cpu_buffers, client, k, values.cpu())
        assert all((a == b).all() for a, b in zip(backend.host_words(buffers), cpu.host_words(cpu_buffers)))
        assert (backend.round_counts(buffers, args.seed, 0.5).gram == cpu.round_counts(cpu_buffers, args.seed, 0.5).gram).all()

    gb = 1e9
    pack_bw = (in_bytes + out_bytes) / t_pack
    grouped_bw = (in_bytes + out_bytes) / t_grouped
    copy_tensors_bw = 2 * in_bytes / t_copy_tensors
    copy_flat_bw = 2 * in_bytes / t_copy_flat
    t_ours = t_grouped + t_gram
    print(f"command: {shlex.join([sys.executable] + sys.argv)}")
    print(f"device: {torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu (TRITON_INTERPRET=1)'}")
    print(f"clients {n}, coordinates {d:,} per client in {len(layout.slots)} tensors, {args.dtype}: "
          f"{in_bytes / gb:.3f} GB of updates, {out_bytes / gb:.3f} GB of sign words")
    print(f"pack (one launch per tensor, {n * len(layout.slots)} launches): {t_pack * 1e3:9.3f} ms  "
          f"{pack_bw / gb:8.1f} GB/s  ({t_pack / (n * len(layout.slots)) * 1e6:.1f} us/tensor)")
    print(f"pack grouped (one launch per client, {n}):   {t_grouped * 1e3:9.3f} ms  {grouped_bw / gb:8.1f} GB/s")
    print(f"copy per tensor (same launches):           {t_copy_tensors * 1e3:9.3f} ms  {copy_tensors_bw / gb:8.1f} GB/s")
    print(f"copy flat (one launch per client):         {t_copy_flat * 1e3:9.3f} ms  {copy_flat_bw / gb:8.1f} GB/s")
    print(f"round_counts (3 Gram matrices):            {t_gram * 1e3:9.3f} ms")
    print(f"sampled_matches ({len(pairs)} ordered pairs):      {t_sampled * 1e3:9.3f} ms")
    print(f"naive torch ({n * (n + 1) // 2} pair sign compares):   {t_naive * 1e3:9.3f} ms")
    print(f"ratio pack grouped / copy flat:       {grouped_bw / copy_flat_bw:.2f}   (target >= 0.70)")
    print(f"ratio pack per tensor / copy per tensor: {pack_bw / copy_tensors_bw:.2f}")
    print(f"speed-up pack grouped + round_counts vs naive torch: {t_naive / t_ours:.1f}x   (target >= 10x)")


if __name__ == "__main__":
    main()
