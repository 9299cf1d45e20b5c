"""The Triton backend on a round, against copies of the same bytes and a naive torch path, measured in one run.

    python benchmarks/bench_triton.py                 # GPU: Qwen2.5-7B rank-32 LoRA (392 tensors, 80.7M coordinates
                                                      # per client), n = 2, 8, 20, 64, 100, 500; bf16 and fp32
    python benchmarks/bench_triton.py --smoke         # tiny, under TRITON_INTERPRET=1 on the CPU (CI)

Per float format and round size n, every figure from the same run on the same device:
* ``copy``: a device-to-device copy of the round's update bytes (reads and writes every byte; packing reads
  them once, so 0.5x a copy is the floor); ``h2d``: a copy of the same bytes from pinned host memory;
* ``pack``: ``TritonBackend.pack_flat`` of the round (whole updates in padded flat buffers: one launch per
  float format), wall time to the end of the kernels; ``host``: the time until the call returns (the launches
  are queued), per client; device-resident while the round fits ``--resident-gb``, else streamed from pinned
  host memory in chunks of clients (``stream``, compared with ``h2d``);
* ``counts``: ``round_counts`` (the three binary Gram matrices: what the expected penalty needs);
  ``sampled``: ``sampled_matches`` of every ordered pair (up to ``--sampled-max-clients``), over ``counts``;
* ``naive``: torch on the device, ``((x_i < 0) & (x_j < 0)).sum()`` per unordered pair over the float updates
  (a lower bound on a naive implementation: one set of three), over ``pack + counts`` (up to
  ``--naive-max-clients``);
* ``peak``: peak device memory allocated during the case.
Times are the best of ``--repeats`` after a warm-up (and the GPU kept busy for a second before the first case). ``--runs K`` measures every case K times (its
buffers allocated and filled anew each time) and prints each figure as ``median [min - max]`` of the K runs; ``--json`` keeps every run's figures.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import shlex
import sys
import time
from pathlib import Path

import numpy as np
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported

from layouts import QWEN25_7B, lora_shapes  # noqa: E402

from kfca_llm.engine import Layout, get_backend  # noqa: E402
from kfca_llm.engine import triton_backend  # noqa: E402
from kfca_llm.kernels.intrinsics.triton import kernels_interpreted  # noqa: E402
from kfca_llm.kernels.sampled_penalty import triton as sampled_penalty  # noqa: E402
from kfca_llm.partition import DRAW2_SALT, pair_keys, partition_params  # noqa: E402

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def timed(fn, device: torch.device, repeats: int) -> float:
    """Best wall time of ``fn`` over ``repeats`` runs, synchronizing the device; on a GPU after one warm-up (the
    kernels compile at their first launch). The interpreter (``--smoke``) compiles nothing: no warm-up, which
    halves the smoke run."""
    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    if device.type == "cuda":
        fn()
        sync()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        sync()
        best = min(best, time.perf_counter() - start)
    return best


def spin_up(device: torch.device, seconds: float = 1.0) -> None:
    """Keep the GPU busy for ``seconds`` before the first case: from idle its clocks take a while to rise, so the
    first case of a fresh process measured 1.4 ms of pack where a warm GPU takes 1.0 (H200). A scoring round
    meets a GPU that has just trained, at its working clocks."""
    if device.type != "cuda":
        return
    a = torch.randn((4096, 4096), device=device, dtype=torch.bfloat16)
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        for _ in range(20):
            a = (a @ a).clamp_(-1, 1)
        torch.cuda.synchronize(device)


def host_time(fn, device: torch.device, repeats: int) -> float:
    """Best time until ``fn`` returns (its launches queued, not finished)."""
    best = float("inf")
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def round_case(layout: Layout, n: int, dtype: torch.dtype, device: torch.device, args) -> dict:
    backend = get_backend("triton")
    padded = layout.padded_numel
    row_bytes = padded * torch.empty(0, dtype=dtype).element_size()
    streamed = n * row_bytes > args.resident_gb * 1e9
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    generator = torch.Generator(device=device).manual_seed(args.seed)
    distinct = min(n, args.host_buffers) if streamed else n
    data = torch.empty((distinct, padded), dtype=dtype, device=device)
    for row in data:  # row by row: no float32 temporaries of the whole round
        row.copy_(torch.randn(padded, generator=generator, device=device))
        row[torch.rand(padded, generator=generator, device=device) < 0.05] = 0.0
    chunk = 8  # copies go through an 8-client destination: the same bytes, less memory
    rows = list(range(n))
    figures = {"clients": n, "dtype": str(dtype).removeprefix("torch."), "bytes": n * row_bytes,
               "mode": "streamed" if streamed else "resident"}
    buffers = backend.allocate(n, layout, device)
    if streamed:  # from pinned host memory: a few distinct buffers cycled over the round's clients
        host = data.cpu().pin_memory() if device.type == "cuda" else data.cpu()
        flats = [host[i % distinct] for i in rows]
        staging = torch.empty((max(1, min(n, triton_backend.STAGING_BYTES // row_bytes)), padded), dtype=dtype,
                              device=device)

        def h2d():
            for i, flat in enumerate(flats):
                staging[i % staging.shape[0]].copy_(flat, non_blocking=True)

        figures["h2d_s"] = timed(h2d, device, args.repeats)
        # stream_flat is what pack_flat runs for host buffers and GPU kernels (called directly, so that the
        # interpreter, where host memory is device memory, takes the same path).
        figures["pack_s"] = timed(lambda: backend.stream_flat(buffers, rows, flats), device, args.repeats)
        figures["host_ms_per_client"] = host_time(lambda: backend.stream_flat(buffers, rows, flats), device,
                                                  args.repeats) * 1e3 / n
        figures["pack_over_h2d"] = figures["pack_s"] / figures["h2d_s"]
    else:
        flats = list(data)
        destination = torch.empty((min(n, chunk), padded), dtype=dtype, device=device)

        def copy():
            for first in range(0, n, chunk):
                part = data[first:first + chunk]
                destination[:part.shape[0]].copy_(part)

        figures["copy_s"] = timed(copy, device, args.repeats)
        host = data[0].cpu().pin_memory() if device.type == "cuda" else data[0].cpu()

        def h2d():
            for i in range(n):
                destination[i % destination.shape[0]].copy_(host, non_blocking=True)

        figures["h2d_s"] = timed(h2d, device, args.repeats)
        del destination, host
        figures["pack_s"] = timed(lambda: backend.pack_flat(buffers, rows, flats), device, args.repeats)
        figures["host_ms_per_client"] = host_time(lambda: backend.pack_flat(buffers, rows, flats), device,
                                                  args.repeats) * 1e3 / n
        figures["pack_over_copy"] = figures["pack_s"] / figures["copy_s"]
    figures["counts_s"] = timed(lambda: backend.round_counts(buffers, args.seed, 0.5), device, args.repeats)
    if n <= args.sampled_max_clients:
        pairs = np.array([(i, j) for i in range(n) for j in range(n) if i != j], dtype=np.int64)
        figures["sampled_s"] = timed(lambda: backend.sampled_matches(buffers, args.seed, 0.5, pairs), device,
                                     max(1, args.repeats // 2))
        figures["sampled_over_expected"] = figures["sampled_s"] / figures["counts_s"]
        if n <= args.draw_ways_max_clients:
            figures.update(draw_ways(buffers, pairs, device, args))
            if "shared_s" in figures:
                figures["shared_over_expected"] = figures["shared_s"] / figures["counts_s"]
            figures["per_pair_over_expected"] = figures["per_pair_s"] / figures["counts_s"]
    if not streamed and n <= args.naive_max_clients:
        def naive():
            negative = data < 0
            return torch.stack([(negative[i] & negative[j]).sum() for i in range(n) for j in range(i, n)])
        figures["naive_s"] = timed(naive, device, max(1, args.repeats // 2))
        figures["speedup_over_naive"] = figures["naive_s"] / (figures["pack_s"] + figures["counts_s"])
    if device.type == "cuda":
        figures["peak_GB"] = torch.cuda.max_memory_allocated(device) / 1e9
    if args.check:  # the packed words equal the CPU backend's
        cpu = get_backend("cpu")
        cpu_buffers = cpu.allocate(n, layout)
        cpu.pack_flat(cpu_buffers, rows, [f.cpu() for f in flats])
        for mine, theirs in zip(backend.host_words(buffers), cpu.host_words(cpu_buffers)):
            assert (mine == theirs).all(), "Triton and CPU words differ"
        figures["checked"] = True
    return figures


def draw_ways(buffers, pairs: np.ndarray, device: torch.device, args) -> dict:
    """The sampled penalty's two draw ways timed apart (values shared between pairs, or drawn per pair), their
    matches compared, and the way ``shared_draws_pay_off`` picks for this round: the crossover to check."""
    matches = {}  # each way's matches from its timed runs: compared without drawing again

    def draws(shared: bool):
        matches[shared] = sampled_penalty.sampled_matches(buffers.signs, buffers.task,
                                                          *partition_params(args.seed, 0.5), pairs,
                                                          pair_keys(args.seed, pairs), DRAW2_SALT, shared=shared)

    figures = {"per_pair_s": timed(lambda: draws(False), device, max(1, args.repeats // 2))}
    if buffers.signs.shape[0] <= sampled_penalty.MAX_SHARED_CLIENTS:
        figures["shared_s"] = timed(lambda: draws(True), device, max(1, args.repeats // 2))
        if not torch.equal(matches[True], matches[False]):
            raise AssertionError("the two draw ways count different matches")
    n_bonus = int(get_backend("triton").round_counts(buffers, args.seed, 0.5).sizes[0])
    shared = sampled_penalty.draws_shared(buffers.signs.shape[0], len(pairs), n_bonus, pair_keys(args.seed, pairs),
                                          buffers.signs.shape[1])
    figures["auto_way"] = "shared" if shared else "per pair"
    return figures


def summarize(runs: list[dict]) -> dict:
    """Each numeric figure of the runs as (min, median, max); the others as the first run has them."""
    summary = dict(runs[0])
    for key, value in runs[0].items():
        if isinstance(value, float):
            values = [run[key] for run in runs if key in run]
            summary[key] = (min(values), statistics.median(values), max(values))
    return summary


def _figure(figures: dict, key: str, scale: float, digits: int) -> str:
    if key not in figures:
        return "-"
    value = figures[key]
    if not isinstance(value, tuple):
        return f"{value * scale:.{digits}f}"
    low, middle, high = (v * scale for v in value)
    return f"{middle:.{digits}f}" if low == high else f"{middle:.{digits}f} [{low:.{digits}f} - {high:.{digits}f}]"


def _ms(figures: dict, key: str) -> str:
    return _figure(figures, key, 1e3, 3)


def _ratio(figures: dict, key: str) -> str:
    return _figure(figures, key, 1, 2)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", default="2,8,20,64,100,500")
    parser.add_argument("--dtypes", default="bf16,fp32")
    parser.add_argument("--rank", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--resident-gb", type=float, default=40.0, help="rounds above this stream from host memory")
    parser.add_argument("--host-buffers", type=int, default=8, help="distinct pinned host buffers of a streamed round")
    parser.add_argument("--sampled-max-clients", type=int, default=100)
    parser.add_argument("--draw-ways-max-clients", type=int, default=100,
                        help="time the two draw ways apart (and compare their matches) up to this many clients")
    parser.add_argument("--naive-max-clients", type=int, default=100)
    parser.add_argument("--runs", type=int, default=1, help="measure every case this many times: median [min - max]")
    parser.add_argument("--json", type=Path, help="write every run's figures here (a JSON list)")
    parser.add_argument("--check", action="store_true", help="compare the packed words with the CPU backend")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, a streamed case, checked; runs on the CPU "
                        "under TRITON_INTERPRET=1")
    args = parser.parse_args(argv)
    dims = dict(QWEN25_7B)
    if args.smoke:
        dims = dict(layers=1, hidden=64, intermediate=160, kv=16)
        args.rank, args.clients, args.repeats, args.check = 4, "2,3", 1, True
        # the 3-client round streams through a 2-client staging buffer
        layout_bytes = Layout.from_shapes(lora_shapes(**dims, rank=4)).padded_numel * 4
        args.resident_gb = 2.5 * layout_bytes / 1e9
        triton_backend.STAGING_BYTES = 2 * layout_bytes
    device = torch.device("cpu" if kernels_interpreted() else "cuda")
    layout = Layout.from_shapes(lora_shapes(**dims, rank=args.rank))
    print(f"command: {shlex.join([Path(sys.executable).name] + sys.argv)}")
    print(f"device: {torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu (TRITON_INTERPRET=1)'}; "
          f"load average {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    print(f"layout: {len(layout.slots)} tensors, {layout.n_coords:,} coordinates per client")
    print("\n| dtype | n | mode | copy ms | h2d ms | pack ms | pack / copy | pack / h2d | host ms/client | counts ms "
          "| sampled / expected | shared draws / expected | per-pair draws / expected | chosen way | naive ms "
          "| pack + counts vs naive | peak GB |")
    print("|" + "---|" * 17)
    every_run = []
    spin_up(device)
    for name in args.dtypes.split(","):
        for n in (int(v) for v in args.clients.split(",")):
            runs = [round_case(layout, n, DTYPES[name], device, args) for _ in range(args.runs)]
            every_run += runs
            if args.json:
                args.json.write_text(json.dumps(every_run, indent=1))
            f = summarize(runs)
            print(f"| {name} | {n} | {f['mode']} | {_ms(f, 'copy_s')} | {_ms(f, 'h2d_s')} | {_ms(f, 'pack_s')} | "
                  f"{_ratio(f, 'pack_over_copy')} | {_ratio(f, 'pack_over_h2d')} | {_figure(f, 'host_ms_per_client', 1, 3)} | "
                  f"{_ms(f, 'counts_s')} | {_ratio(f, 'sampled_over_expected')} | {_ratio(f, 'shared_over_expected')} | "
                  f"{_ratio(f, 'per_pair_over_expected')} | {f.get('auto_way', '-')} | {_ms(f, 'naive_s')} | "
                  f"{_ratio(f, 'speedup_over_naive')} | {_ratio(f, 'peak_GB')} |", flush=True)
            if f.get("checked"):
                print(f"  checked: {name} n={n} words equal the CPU backend's")
    print("\ntargets: pack / copy <= 0.75 (resident 20 x 80.7M); pack + counts vs naive >= 20x; sampled / expected "
          "<= 3; pack / h2d <= 1.25 (500 streamed)")


if __name__ == "__main__":
    main()
