"""What settling an undetermined round costs (``kfca_llm.fl.pool_settle``), against scoring a pooled round on the same
pool in the same run: both count the pooled rows on the CPU backend, the settlement over the window on both sides.

    .venv/bin/python benchmarks/bench_settle.py              # Qwen2.5-7B rank-32 LoRA: 392 tensors, 80.7M coordinates
    .venv/bin/python benchmarks/bench_settle.py --smoke      # a small layout, seconds

A pool of ``--rounds`` rounds of two participants (sign words: one shared direction, 30% of the bits flipped at
random per participant), a fresh round of two scored against it, and a pending round in the middle of the window
scored again at the last round (``score_pending``); best of ``--repeats``. Prints both times and their ratio.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from layouts import QWEN25_7B, lora_shapes  # noqa: E402

from kfca_llm.engine.duplicates import DuplicateRule  # noqa: E402
from kfca_llm.engine.layout import Layout  # noqa: E402
from kfca_llm.fl.peer_pool import PeerPool, score_with_pool  # noqa: E402
from kfca_llm.fl.pool_settle import PendingRound, score_pending  # noqa: E402
from kfca_llm.packer import SignPacker  # noqa: E402


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=12, help="rounds of two in the pool (the window is 10)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--smoke", action="store_true", help="a 2-layer rank-4 layout instead of Qwen2.5-7B rank 32")
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    dims = dict(layers=2, hidden=256, intermediate=512, kv=64) if args.smoke else QWEN25_7B
    shapes = lora_shapes(**dims, rank=4 if args.smoke else 32)
    n_words = Layout.from_shapes(shapes).n_words
    base = np.random.default_rng(0).integers(-2**31, 2**31, size=n_words, dtype=np.int64).astype(np.int32)
    task = np.full(n_words, -1, np.int32)

    def words(seed: int) -> np.ndarray:
        flips = np.random.default_rng(seed).random((n_words, 32)) < 0.3
        return base ^ np.packbits(flips, axis=1, bitorder="little").view(np.int32).ravel()

    pool = PeerPool()
    for t in range(1, args.rounds + 1):
        members = {f"c{2 * t:02d}": words(2 * t), f"c{2 * t + 1:02d}": words(2 * t + 1)}
        pool.add_round(t, members, {c: 0.1 for c in members})
    fresh = SignPacker.from_words(shapes, {"a": words(1000), "b": words(1001)}, task)
    mid = args.rounds // 2
    members = {f"c{2 * mid:02d}": words(2 * mid), f"c{2 * mid + 1:02d}": words(2 * mid + 1)}
    pending = PendingRound(mid, 1, tuple(shapes.items()), members, task, (tuple(members), tuple(reversed(members))),
                           tuple(members), duplicate_rule=DuplicateRule())

    def best(call) -> float:
        times = []
        for _ in range(args.repeats):
            started = time.perf_counter()
            call()
            times.append(time.perf_counter() - started)
        return min(times)

    round_s = best(lambda: score_with_pool(fresh, pool, args.rounds + 1, seed=1))
    settle_s = best(lambda: score_pending(pool, pending, args.rounds))
    print(f"layout: {len(shapes)} tensors, {Layout.from_shapes(shapes).n_coords:,} coordinates; pool of {args.rounds} "
          f"rounds of two; load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"pooled round scored: {round_s:.6f} s; pending round settled (both sides): {settle_s:.6f} s; "
          f"settle / pooled round {settle_s / round_s:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
