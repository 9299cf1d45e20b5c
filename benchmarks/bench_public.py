"""Cost of the public conditioning (issue 43) on the CPU backend: the stratum counts against the Gram counts of the
same round, timed in the same run (the ratio is what to read; absolute times depend on the machine).

    OMP_NUM_THREADS=1 python benchmarks/bench_public.py [--clients 12] [--coords 4000000] [--repeats 5]

A round of random updates (``--clients``, ``--coords`` in 8 tensors) is packed once; then the best of
``--repeats`` of: the Gram counts (``round_counts``, every pair), the stratum counts at 3 public steps x 2 magnitude
buckets (16 strata, the default) and at 3 x 1 (8 strata), building the public planes from 3 steps (host work that
reads three float updates: compare it with packing the clients' updates, the last row).
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
    steps = [random_state() for _ in range(3)]
    backend, buffers = packer.backend, packer.buffers
    backend.round_counts(buffers, 0, 0.5)  # compile the kernels first
    rows = {}
    rows["gram counts (every pair)"] = best(lambda: backend.round_counts(buffers, 0, 0.5), args.repeats)
    for q in (2, 1):
        conditioning = PublicConditioning(steps=3, magnitude_buckets=q)
        planes = public_planes(packer.layout, steps, conditioning)
        backend.stratum_counts(buffers, 0, 0.5, planes.words)
        rows[f"stratum counts, 3 steps x {q} buckets ({1 << planes.n_planes} strata)"] = best(
            lambda: backend.stratum_counts(buffers, 0, 0.5, planes.words), args.repeats)
    rows["public planes (3 steps x 2 buckets, torch)"] = best(
        lambda: public_planes(packer.layout, steps, PublicConditioning(steps=3, magnitude_buckets=2)), args.repeats)
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
