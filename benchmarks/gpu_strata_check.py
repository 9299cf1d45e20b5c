"""The public conditioning's GPU path (issue 43; issue 41's deliverable 5) on a lent GPU: the stratum counts'
compiled kernel against the numpy reference bit for bit, then its cost beside the pack's and the Gram counts' at
the Qwen2.5-7B rank-32 layout (80.7M coordinates), and the cost of building the public planes from 3 steps.

    python3 benchmarks/gpu_strata_check.py [--runs 3]

Device times are medians of ``triton.testing.do_bench`` (events), one fresh round per run, printed as
min / median / max over the runs. The planes are built with torch on the device (``engine.public.public_planes``:
float64 sums, per-tensor ``kthvalue``), timed by wall clock around a synchronize, best of 3 per run.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch
import triton

from bench_pair_counts import random_round
from kfca_llm.engine.layout import Layout
from kfca_llm.engine.public import PublicConditioning, public_planes
from kfca_llm.kernels.pair_counts.triton import binary_gram
from kfca_llm.kernels.stratum_counts import reference
from kfca_llm.kernels.stratum_counts.triton import stratum_counts
from kfca_llm.partition import partition_params
from layouts import QWEN25_7B, lora_shapes


def spread(values: list[float]) -> str:
    return f"{min(values):.3f} / {statistics.median(values):.3f} / {max(values):.3f}"


def check_bits(device: torch.device) -> None:
    rng = np.random.default_rng(0)
    for n, w, p in ((3, 1001, 2), (9, 4097, 4), (20, 20001, 5)):
        task = rng.integers(-2**31, 2**31, size=w, dtype=np.int64).astype(np.int32)
        signs = rng.integers(-2**31, 2**31, size=(n, w), dtype=np.int64).astype(np.int32) & task
        planes = rng.integers(-2**31, 2**31, size=(p, w), dtype=np.int64).astype(np.int32)
        expected = reference.stratum_counts(signs, task, planes, 7, 0.5)
        got = stratum_counts(*(torch.from_numpy(a).to(device) for a in (signs, task, planes)), *partition_params(7, 0.5))
        if not all(np.array_equal(g.cpu().numpy(), e) for g, e in zip(got, expected)):
            raise AssertionError(f"stratum counts differ from the reference at n={n}, {w} words, {p} planes")
    print("stratum counts equal the reference bit for bit (n = 3, 9, 20; 2-5 planes)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--clients", default="20,100")
    args = parser.parse_args()
    device = torch.device("cuda")
    print(f"device: {torch.cuda.get_device_name(device)}; torch {torch.__version__}, triton {triton.__version__}")
    check_bits(device)
    layout = Layout.from_shapes(lora_shapes(**QWEN25_7B, rank=32))
    n_words = layout.n_words
    conditioning = PublicConditioning()  # the default: 3 steps x 2 magnitude buckets, 16 strata
    key, t_bonus, t_m1 = partition_params(0, 0.5)
    bench = lambda fn: triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median")  # noqa: E731
    print(f"layout: {layout.n_coords:,} coordinates, {n_words:,} words; {conditioning}")
    print("| n | Gram counts ms | stratum counts ms (16 strata) | strata / Gram |")
    print("|---|---|---|---|")
    for n in (int(v) for v in args.clients.split(",")):
        gram_ms, strata_ms = [], []
        for run in range(args.runs):
            signs, task = random_round(n, n_words, run, device)
            planes = torch.randint(-2**31, 2**31 - 1, (4, n_words), dtype=torch.int32, device=device)
            gram_ms.append(bench(lambda: binary_gram(signs, task, key, t_bonus, t_m1)))
            strata_ms.append(bench(lambda: stratum_counts(signs, task, planes, key, t_bonus, t_m1)))
        ratios = [s / g for s, g in zip(strata_ms, gram_ms)]
        print(f"| {n} | {spread(gram_ms)} | {spread(strata_ms)} | {spread(ratios)} |")
    build_s = []
    for run in range(args.runs):
        generator = torch.Generator(device=device).manual_seed(run)
        steps = [{slot.name: torch.randn(slot.shape, generator=generator, device=device, dtype=torch.bfloat16)
                  for slot in layout.slots} for _ in range(3)]
        best = float("inf")
        for _ in range(3):
            torch.cuda.synchronize(device)
            start = time.perf_counter()
            public_planes(layout, steps, conditioning, device=device)
            torch.cuda.synchronize(device)
            best = min(best, time.perf_counter() - start)
        build_s.append(best * 1e3)
    print(f"public planes from 3 bf16 steps on the device (once a round, any n): {spread(build_s)} ms")


if __name__ == "__main__":
    main()
