"""Host-side cost of packing, on any machine: the Triton backend's Python with its kernel launches stubbed out,
and the CPU backend on files of many tiny tensors.

    python benchmarks/bench_host.py                 # 392-tensor Qwen2.5-7B rank-32 layout, n = 2, 20, 100, 500
    python benchmarks/bench_host.py --smoke         # CI: small layout and counts, one run each

Part 1 (launches stubbed): ``SignPacker(..., backend="triton")`` on CPU tensors with the two pack kernels
replaced by stubs that count launches, so what is timed is everything the host does per round: validation,
the layout's plan (built on the first round of a layout, then cached), the address tables, the launch
arguments. Updates are ``torch.empty`` buffers (never touched: the stubs read nothing). Cases: whole updates
in padded flat buffers (``FlatUpdate``, one ``add_clients`` call per round), the same as one ``add_flat`` call
per client, and separate tensors (state dicts of 392 views, one ``add_clients`` call). Reported per case:
milliseconds per client (the round's packing calls / n; the buffers' allocation excluded), launches per
round, median and range over ``--runs`` runs. On a GPU the table copies to the device are asynchronous and
come on top; the interpreter's stand-in for the device makes them free here.

Part 2 (CPU backend, nothing stubbed): ``score_checkpoints`` on two safetensors files of ``--tiny-tensors``
one-element fp32 tensors, against the same files packed tensor by tensor (``SignPacker.add`` per tensor, the
path ``score_checkpoints`` took before) in the same run.
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported: CPU tensors stand in for the device

import torch  # noqa: E402
from layouts import QWEN25_7B, lora_shapes  # noqa: E402

import kfca_llm  # noqa: E402
from kfca_llm import SignPacker  # noqa: E402
from kfca_llm.engine import Layout  # noqa: E402
from kfca_llm.engine.layout import FlatUpdate  # noqa: E402
from kfca_llm.kernels.sign_pack import triton as triton_pack  # noqa: E402


class LaunchStub:
    """Stands in for a Triton kernel: ``kernel[grid](...)`` counts the launch and runs nothing."""

    def __init__(self):
        self.launches = 0

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.launches += 1
        return launch


def _stub_kernels() -> list[LaunchStub]:
    stubs = [LaunchStub(), LaunchStub()]
    triton_pack._pack_words_kernel, triton_pack._pack_tails_kernel = stubs
    return stubs


def _spread(values: list[float]) -> str:
    return f"{statistics.median(values):8.3f} ms  [{min(values):.3f} - {max(values):.3f}]"


def host_rounds(shapes: dict, clients: list[int], runs: int) -> list[dict]:
    stubs = _stub_kernels()
    rows = []
    for n in clients:
        names = [f"c{i:04d}" for i in range(n)]
        for case in ("flat, one call", "flat, a call per client", "separate tensors"):
            for cold in (True, False):
                times, launches = [], None
                layout = Layout.from_shapes(shapes)
                # One shared buffer (never read: the kernels are stubs), so 500 clients need no 80 GB.
                buffer = torch.empty(layout.padded_numel, dtype=torch.bfloat16)
                for _ in range(runs):
                    if cold:
                        layout = Layout.from_shapes(shapes)  # a new layout: its plan is built in the timed call
                    flat = FlatUpdate(layout, buffer)
                    updates = {c: flat for c in names} if case != "separate tensors" else \
                        {c: dict(flat.items()) for c in names}
                    packer = SignPacker(layout, names, backend="triton")
                    before = sum(s.launches for s in stubs)
                    start = time.perf_counter()
                    if case == "flat, a call per client":
                        for c in names:
                            packer.add_flat(c, flat)
                    else:
                        packer.add_clients(updates)
                    times.append((time.perf_counter() - start) * 1e3 / n)
                    launches = sum(s.launches for s in stubs) - before
                rows.append({"clients": n, "case": case, "plan": "built" if cold else "cached", "ms_per_client": times,
                             "launches": launches})
                print(f"| {n:4d} | {case:24s} | {'built ' if cold else 'cached'} | {_spread(times)} | {launches:5d} |",
                      flush=True)
    return rows


def tiny_tensor_files(n_tensors: int, runs: int) -> None:
    from safetensors.torch import save_file

    with tempfile.TemporaryDirectory() as tmp:
        paths = {}
        for c, seed in (("a", 1), ("b", 2)):
            g = torch.Generator().manual_seed(seed)
            paths[c] = str(Path(tmp) / f"{c}.safetensors")
            save_file({f"t{k:06d}": torch.randn(1, generator=g) for k in range(n_tensors)}, paths[c])

        def batched():
            return kfca_llm.score_checkpoints(paths, backend="cpu")

        def tensor_by_tensor():
            from kfca_llm.checkpoints import check_same_tensors, open_adapter

            files = [open_adapter(p, c) for c, p in paths.items()]
            packer = SignPacker(check_same_tensors(files, None), list(paths), backend="cpu")
            for file in files:
                with open(file.path, "rb") as handle:
                    for slot in packer.layout.slots:
                        packer.add(file.client, slot.name, file.read(handle, slot.name))
            return packer.score()

        assert batched().rewards == tensor_by_tensor().rewards
        for label, fn in (("score_checkpoints (a client's file in one batch)", batched),
                          ("tensor by tensor (SignPacker.add per tensor)", tensor_by_tensor)):
            times = []
            for _ in range(runs):
                start = time.perf_counter()
                fn()
                times.append(time.perf_counter() - start)
            print(f"{label:52s} median {statistics.median(times):7.3f} s  [{min(times):.3f} - {max(times):.3f}]"
                  f"  ({len(times)} runs)", flush=True)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", default="2,20,100,500", help="comma-separated round sizes")
    parser.add_argument("--rank", type=int, default=32)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--tiny-tensors", type=int, default=30_000)
    parser.add_argument("--tiny-runs", type=int, default=3)
    parser.add_argument("--smoke", action="store_true", help="2 layers, n = 2 and 5, 2,000 tiny tensors, 2 runs")
    args = parser.parse_args(argv)
    dims = dict(QWEN25_7B)
    if args.smoke:
        dims["layers"], args.clients, args.runs, args.tiny_tensors, args.tiny_runs = 2, "2,5", 2, 2000, 1
    shapes = lora_shapes(**dims, rank=args.rank)
    print(f"command: {shlex.join([Path(sys.executable).name] + sys.argv)}")
    print(f"load average: {' '.join(f'{v:.2f}' for v in os.getloadavg())}, {os.cpu_count()} cores")
    print(f"layout: {len(shapes)} tensors, {Layout.from_shapes(shapes).n_coords:,} coordinates per client, bf16")
    print("\n| clients | case | plan | host ms per client: median [min - max] | launches per round |")
    print("|---|---|---|---|---|")
    host_rounds(shapes, [int(v) for v in args.clients.split(",")], args.runs)
    print(f"\nCPU backend, 2 files x {args.tiny_tensors:,} one-element fp32 tensors:")
    tiny_tensor_files(args.tiny_tensors, args.tiny_runs)


if __name__ == "__main__":
    main()
