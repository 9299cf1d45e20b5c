"""The pair counts (binary Gram matrices) on the GPU against their popcount floor, measured in one run.

    python benchmarks/bench_pair_counts.py             # GPU: n = 20, 100, 500 clients x 2,523,136 words (the
                                                       # Qwen2.5-7B rank-32 LoRA: 80.7M coordinates per client)
    python benchmarks/bench_pair_counts.py --smoke     # tiny, under TRITON_INTERPRET=1 on the CPU (CI)

Every figure from the same run on the same device:

* ``popc rate``: popcounts per second of ``_popc_rate_kernel``, which does nothing but popcount registers
  (8 independent chains per thread, one multiply-add each to feed it): the device's popcount ceiling;
* ``floor``: the popcounts the counts need (3 sets x the n (n + 1) / 2 pairs with the diagonal x words) over
  that rate. Reading the words (n x words x 4 bytes, plus the task plane) is ~100x less at these n;
* ``counts``: ``pair_counts.triton.binary_gram`` with its default tiling, device time (events, median of
  ``triton.testing.do_bench``), and ``counts / floor``; ``--runs`` repetitions give min, median and max;
* ``sweep``: every tiling of ``--sweep`` once (they must count the same integers: checked); up to
  ``--check-max-clients`` the counts are also checked against torch on the device (a SWAR popcount of
  ``s_i & s_j & set`` per pair: slow, independent of the kernel);
* ``gather rate``: random 4-byte lookups per second of ``_gather_rate_kernel``, which draws as the sampled
  penalty does (two hashes, two rank products, a lookup into M_1's and one into M_2's members) and nothing
  else; ``sampled floor``: the lookups the draw contract needs (the cheaper of the two draw ways,
  ``sampled_penalty.triton.lookup_pairs``) over that rate, and ``sampled floor / counts``: what no
  implementation of the sampled penalty can beat, against the expected penalty's counts.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import sys
from pathlib import Path

import numpy as np
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported

import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from layouts import QWEN25_7B, lora_shapes  # noqa: E402

from kfca_llm.engine import Layout  # noqa: E402
from kfca_llm.kernels.intrinsics.triton import kernels_interpreted, mix32, popcount32  # noqa: E402
from kfca_llm.kernels.pair_counts import triton as pair_counts  # noqa: E402
from kfca_llm.kernels.sampled_penalty import triton as sampled_penalty  # noqa: E402
from kfca_llm.partition import DRAW2_SALT, pair_keys, partition_params  # noqa: E402

_CHAINS = 8


@triton.jit
def _popc_rate_kernel(out_ptr, iterations, BLOCK: tl.constexpr):
    """8 independent popcount chains per thread; the multiply-adds feeding them run on another unit."""
    lanes = (tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)).to(tl.uint32)
    x0 = lanes * 3 + 1
    x1 = lanes * 5 + 2
    x2 = lanes * 7 + 3
    x3 = lanes * 11 + 4
    x4 = lanes * 13 + 5
    x5 = lanes * 17 + 6
    x6 = lanes * 19 + 7
    x7 = lanes * 23 + 8
    acc = tl.zeros((BLOCK,), dtype=tl.uint32)
    for _ in range(iterations):
        x0 = x0 * 1664525 + 1013904223
        x1 = x1 * 1664525 + 1013904223
        x2 = x2 * 1664525 + 1013904223
        x3 = x3 * 1664525 + 1013904223
        x4 = x4 * 1664525 + 1013904223
        x5 = x5 * 1664525 + 1013904223
        x6 = x6 * 1664525 + 1013904223
        x7 = x7 * 1664525 + 1013904223
        acc += (popcount32(x0) + popcount32(x1) + popcount32(x2) + popcount32(x3) + popcount32(x4)
                + popcount32(x5) + popcount32(x6) + popcount32(x7))
    tl.store(out_ptr + tl.program_id(0) * BLOCK + tl.arange(0, BLOCK), acc)


@triton.jit
def _gather_rate_kernel(m1_ptr, m2_ptr, out_ptr, m1, m2, draws_per_program, BLOCK: tl.constexpr):
    """Per draw as the sampled kernels do: u1 = mix32(v), u2 = mix32(u1 ^ salt), two rank products, two lookups."""
    base = tl.program_id(0) * draws_per_program
    acc = tl.zeros((BLOCK,), dtype=tl.int32)
    for start in range(0, draws_per_program, BLOCK):
        u1 = mix32((base + start + tl.arange(0, BLOCK)).to(tl.uint32))
        u2 = mix32(u1 ^ 0x9E3779B9)
        rank1 = tl.umulhi(u1, m1).to(tl.int64)
        rank2 = tl.umulhi(u2, m2).to(tl.int64)
        acc ^= tl.load(m1_ptr + rank1) ^ tl.load(m2_ptr + rank2)
    tl.store(out_ptr + tl.program_id(0) * BLOCK + tl.arange(0, BLOCK), acc)


def device_time(fn, device: torch.device) -> float:
    """Seconds: median of ``do_bench`` (events) on a GPU; one wall-clock call in the interpreter."""
    if device.type == "cuda":
        return triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median") / 1e3
    import time

    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def popc_rate(device: torch.device, smoke: bool) -> float:
    """Popcounts per second of the device (``_popc_rate_kernel``)."""
    block = 256
    programs = 2 if smoke else 32 * torch.cuda.get_device_properties(device).multi_processor_count
    iterations = 4 if smoke else 4096
    out = torch.empty(programs * block, dtype=torch.int32, device=device)
    seconds = device_time(lambda: _popc_rate_kernel[(programs,)](out, iterations, BLOCK=block, num_warps=8), device)
    return programs * block * iterations * _CHAINS / seconds


def gather_rate(m1: int, m2: int, device: torch.device, smoke: bool) -> float:
    """Random lookups per second into tables of M_1's and M_2's size (one 4-byte word per member)."""
    block = 256
    generator = torch.Generator(device=device).manual_seed(1)
    tables = [torch.randint(-2**31, 2**31 - 1, (size,), dtype=torch.int32, device=device, generator=generator)
              for size in (m1, m2)]
    programs = 2 if smoke else 16 * torch.cuda.get_device_properties(device).multi_processor_count
    draws = block * (2 if smoke else 1024)
    out = torch.empty(programs * block, dtype=torch.int32, device=device)
    seconds = device_time(lambda: _gather_rate_kernel[(programs,)](*tables, out, m1, m2, draws, BLOCK=block,
                                                                   num_warps=8), device)
    return 2 * programs * draws / seconds


def random_round(n: int, n_words: int, seed: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(signs [n, words], task [words]) int32: 95% of the coordinates are tasks, each client negative on about half
    of them (its signs a subset of the task plane, as packing makes them)."""
    generator = torch.Generator(device=device).manual_seed(seed)
    task = torch.randint(-2**31, 2**31 - 1, (n_words,), dtype=torch.int32, device=device, generator=generator)
    task |= torch.randint(-2**31, 2**31 - 1, (n_words,), dtype=torch.int32, device=device, generator=generator)
    task |= torch.randint(-2**31, 2**31 - 1, (n_words,), dtype=torch.int32, device=device, generator=generator)
    signs = torch.empty((n, n_words), dtype=torch.int32, device=device)
    for row in signs:  # row by row: no int64 temporaries of the whole round
        row.copy_(torch.randint(-2**31, 2**31 - 1, (n_words,), dtype=torch.int32, device=device,
                                generator=generator) & task)
    return signs, task


def parse_sweep(text: str, device: torch.device) -> list[pair_counts.GramConfig]:
    """``tile:warps:programs_per_sm`` items, comma-separated."""
    sms = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 1
    configs = []
    for item in filter(None, text.split(",")):
        tile, warps, per_sm = (int(v) for v in item.split(":"))
        configs.append(pair_counts.GramConfig(tile=tile, num_warps=warps, target_programs=per_sm * sms,
                                              planes_block=256))
    return configs


def torch_gram(signs: torch.Tensor, planes: torch.Tensor) -> torch.Tensor:
    """[3, n, n] int64: the counts by plain torch operations, pair by pair (the check, not the method)."""
    def popcount(x):
        x = x.to(torch.int64) & 0xFFFFFFFF
        x = x - ((x >> 1) & 0x55555555)
        x = (x & 0x33333333) + ((x >> 2) & 0x33333333)
        x = (x + (x >> 4)) & 0x0F0F0F0F
        return ((x * 0x01010101) & 0xFFFFFFFF) >> 24

    n = signs.shape[0]
    gram = torch.zeros((3, n, n), dtype=torch.int64, device=signs.device)
    for i in range(n):
        for j in range(i, n):
            both = signs[i] & signs[j]
            for s in range(3):
                gram[s, i, j] = gram[s, j, i] = popcount(both & planes[s]).sum()
    return gram


def spread(values: list[float]) -> dict:
    return {"min": min(values), "median": statistics.median(values), "max": max(values)}


def case(n: int, n_words: int, args, device: torch.device, rate: float, lookups_per_s: float,
         sweep: list[pair_counts.GramConfig], sms: int) -> dict:
    key, t_bonus, t_m1 = partition_params(args.seed, 0.5)
    figures = {"clients": n, "words": n_words}
    counts_s, gram = [], None
    for run in range(args.runs):  # a fresh round each run
        signs, task = random_round(n, n_words, args.seed + run, device)
        counts_s.append(device_time(lambda: pair_counts.binary_gram(signs, task, key, t_bonus, t_m1), device))
        if run == 0:
            gram, sizes = pair_counts.binary_gram(signs, task, key, t_bonus, t_m1)
            if not torch.equal(gram, gram.transpose(1, 2)):
                raise AssertionError("the Gram matrices are not symmetric")
            if n <= args.check_max_clients:
                planes = pair_counts.set_planes(task, key, t_bonus, t_m1)[0]
                if not torch.equal(torch_gram(signs, planes), gram):
                    raise AssertionError("the kernel's counts differ from torch's")
                figures["checked_against_torch"] = True
            for config in sweep:
                other = pair_counts.binary_gram(signs, task, key, t_bonus, t_m1, config)[0]
                if not torch.equal(other, gram):
                    raise AssertionError(f"tiling {config} counts other integers than the default")
                label = f"tile {config.tile}, {config.num_warps} warps, {config.target_programs // sms} programs per SM"
                figures.setdefault("sweep_s", {})[label] = device_time(
                    lambda: pair_counts.binary_gram(signs, task, key, t_bonus, t_m1, config), device)
        del signs, task
    popcounts = 3 * n * (n + 1) // 2 * n_words
    figures["counts_s"] = spread(counts_s)
    figures["floor_s"] = popcounts / rate
    figures["counts_over_floor"] = {k: v / figures["floor_s"] for k, v in figures["counts_s"].items()}
    n_bonus, m1, m2 = (int(v) for v in sizes.cpu())
    if n <= args.sampled_max_clients:
        pairs = np.array([(i, j) for i in range(n) for j in range(n) if i != j], dtype=np.int64)
        shared, per_pair = sampled_penalty.lookup_pairs(len(pairs), n_bonus, pair_keys(args.seed, pairs), n_words)
        figures["lookups"] = 2 * min(shared, per_pair)
        figures["sampled_floor_s"] = figures["lookups"] / lookups_per_s
        figures["sampled_floor_over_counts"] = figures["sampled_floor_s"] / figures["counts_s"]["median"]
    figures["set_sizes"] = [n_bonus, m1, m2]
    return figures


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", default="20,100,500")
    parser.add_argument("--runs", type=int, default=3, help="fresh rounds per n: the spread of the counts")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sweep", default="2:4:64,4:4:8,4:4:16,4:8:64",
                        help="tilings timed once per n (tile:warps:programs per SM), checked against the default")
    parser.add_argument("--sampled-max-clients", type=int, default=100)
    parser.add_argument("--check-max-clients", type=int, default=20)
    parser.add_argument("--json", type=Path, help="write every figure here")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes on the CPU under TRITON_INTERPRET=1")
    args = parser.parse_args(argv)
    device = torch.device("cpu" if kernels_interpreted() else "cuda")
    n_words = Layout.from_shapes(lora_shapes(**QWEN25_7B, rank=32)).n_words
    if args.smoke:
        n_words, args.clients, args.runs, args.sweep = 700, "3,5", 1, "2:8:1"
    sweep = parse_sweep(args.sweep, device)
    sms = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 1
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu (TRITON_INTERPRET=1)"
    print(f"command: {shlex.join([Path(sys.executable).name] + sys.argv)}")
    print(f"device: {name}; triton {triton.__version__}, torch {torch.__version__}; "
          f"load average {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    rate = popc_rate(device, args.smoke)
    key, t_bonus, t_m1 = partition_params(args.seed, 0.5)
    _, sizes = pair_counts.set_planes(random_round(1, n_words, args.seed, device)[1], key, t_bonus, t_m1)
    lookups_per_s = gather_rate(int(sizes[1]), int(sizes[2]), device, args.smoke)
    print(f"popc rate {rate / 1e12:.3f} T/s; random lookups {lookups_per_s / 1e9:.1f} G/s "
          f"(tables of {int(sizes[1]):,} and {int(sizes[2]):,} words); {n_words:,} words per client")
    results = {"device": name, "triton": triton.__version__, "torch": torch.__version__, "popc_per_s": rate,
               "lookups_per_s": lookups_per_s, "words": n_words, "cases": []}
    print("\n| n | counts ms (min / median / max) | popcount floor ms | counts / floor (median) | sampled floor ms "
          "| sampled floor / counts |")
    print("|---|---|---|---|---|---|")
    for n in (int(v) for v in args.clients.split(",")):
        f = case(n, n_words, args, device, rate, lookups_per_s, sweep, sms)
        results["cases"].append(f)
        c = f["counts_s"]
        sampled = (f"{f['sampled_floor_s'] * 1e3:.1f} | {f['sampled_floor_over_counts']:.0f}x"
                   if "sampled_floor_s" in f else "- | -")
        print(f"| {n} | {c['min'] * 1e3:.3f} / {c['median'] * 1e3:.3f} / {c['max'] * 1e3:.3f} | "
              f"{f['floor_s'] * 1e3:.3f} | {f['counts_over_floor']['median']:.2f} | {sampled} |", flush=True)
        if f.get("checked_against_torch"):
            print(f"  checked: n={n} counts equal torch's pair by pair")
        for label, seconds in f.get("sweep_s", {}).items():
            print(f"|   {label} | {seconds * 1e3:.3f} | | {seconds / f['floor_s']:.2f} | | |", flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    print("\ntarget: counts within 1.5x of the popcount floor at n = 20, 100, 500")


if __name__ == "__main__":
    main()
