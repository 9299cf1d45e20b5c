"""Cost of the public conditioning (issue 43) on the CPU backend: the stratum counts against the Gram counts of the
same round, timed in the same run (the ratio is what to read; absolute times depend on the machine).

    OMP_NUM_THREADS=1 python benchmarks/bench_public.py [--clients 12] [--coords 4000000] [--repeats 5]

A round of random updates (``--clients``, ``--coords`` in 8 tensors) is packed once; then the best of
``--repeats`` of: the Gram counts (``round_counts``, every pair), the stratum counts at 5 sign planes x 2 magnitude
buckets (64 strata, the default), 5 x 1 (32) and 3 x 2 (16), building the public planes at 5 x 2 from 16 steps (the
spans 1, 2, 4, 8, 16: host work that reads 16 float steps) and at 3 x 2 from 4; compare them with packing the
clients' updates, the last row.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from kfca_llm.api import pack_updates
from kfca_llm.engine.public import PublicConditioning, public_planes


def best(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=12)
    parser.add_argument("--coords", type=int, default=4_000_000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    shapes = {f"t{k}": (args.coords // 8 + k,) for k in range(8)}  # uneven sizes: padded words

    def random_state():
        return {k: torch.from_numpy(rng.standard_normal(s).astype(np.float32)) for k, s in shapes.items()}

    updates = {f"c{i}": random_state() for i in range(args.clients)}
    packer = pack_updates(updates, backend="cpu")
    steps = [random_state() for _ in range(16)]
    backend, buffers = packer.backend, packer.buffers
    backend.round_counts(buffers, 0, 0.5)  # compile the kernels first
    rows = {}
    rows["gram counts (every pair)"] = best(lambda: backend.round_counts(buffers, 0, 0.5), args.repeats)
    for k, q in ((5, 2), (5, 1), (3, 2)):
        conditioning = PublicConditioning(steps=k, magnitude_buckets=q)
        planes = public_planes(packer.layout, steps, conditioning)
        backend.stratum_counts(buffers, 0, 0.5, planes.words)
        rows[f"stratum counts, {k} planes x {q} buckets ({1 << planes.n_planes} strata)"] = best(
            lambda: backend.stratum_counts(buffers, 0, 0.5, planes.words), args.repeats)
    for k, n_steps in ((5, 16), (3, 4)):
        conditioning = PublicConditioning(steps=k, magnitude_buckets=2)
        rows[f"public planes ({k} planes x 2 buckets from {n_steps} steps, torch)"] = best(
            lambda: public_planes(packer.layout, steps[-n_steps:], conditioning), args.repeats)
    rows[f"packing the {args.clients} updates (for scale)"] = best(lambda: pack_updates(updates, backend="cpu"),
                                                                   args.repeats)
    gram = rows["gram counts (every pair)"]
    print(f"{args.clients} clients, {args.coords} coordinates, torch threads {torch.get_num_threads()}")
    print("| operation | seconds (best of {}) | x gram counts |".format(args.repeats))
    print("|---|---:|---:|")
    for name, seconds in rows.items():
        print(f"| {name} | {seconds:.4f} | {seconds / gram:.2f} |")


if __name__ == "__main__":
    main()
