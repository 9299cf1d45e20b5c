"""Fixed cost of one ``score_updates`` call on small rounds (a service scoring many small rounds pays it each time).

    python benchmarks/bench_overhead.py            # tiny recipe's adapter and 2 clients x 5,280 coordinates
    python benchmarks/bench_overhead.py --calls 50 # fewer calls (CI)

Each case is timed over --calls calls after a warm-up (numba dispatch, thread pool), reporting the best
and the median call. Baseline in the same run: ``torch.sum`` over the same tensors (the read floor of the
data, which for these sizes is itself mostly per-call cost), interleaved with the engine.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

import kfca_llm


def _calls(fn, calls: int) -> list[float]:
    out = []
    for _ in range(calls):
        start = time.perf_counter()
        fn()
        out.append(time.perf_counter() - start)
    return out


def _tiny_recipe_shapes() -> tuple[dict[str, tuple[int, ...]], int]:
    """The tiny recipe's LoRA state-dict shapes and the clients it trains per round (from its plan)."""
    from kfca_llm.plan import build_plan
    from kfca_llm.recipe import load_recipe

    plan = build_plan(load_recipe("tiny"))
    return plan.adapter_shapes, plan.clients_per_round


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=300)
    args = parser.parse_args(argv)

    g = torch.Generator().manual_seed(0)
    shapes, per_round = _tiny_recipe_shapes()
    cases = {
        "2 clients x 5,280 (flat)": {f"c{i}": torch.randn(5_280, generator=g) for i in range(2)},
        f"tiny recipe: {per_round} clients x {sum(torch.Size(s).numel() for s in shapes.values()):,} "
        f"in {len(shapes)} tensors": {f"c{i}": {k: torch.randn(s, generator=g) for k, s in shapes.items()}
                                      for i in range(per_round)},
    }
    load = os.getloadavg()
    print(f"command: {' '.join([Path(sys.executable).name, *sys.argv])}")
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    print(f"{'case':<50} {'penalty':<9} {'best':>9} {'median':>9} {'floor best':>11}")
    for name, updates in cases.items():
        tensors = [t for u in updates.values() for t in (u.values() if isinstance(u, dict) else [u])]
        for penalty in ("expected", "sampled"):
            kfca_llm.score_updates(updates, penalty=penalty)  # warm-up
            engine, floor = [], []
            block = min(10, args.calls)
            for _ in range(max(1, args.calls // block)):  # interleaved blocks: both see the same machine state
                engine += _calls(lambda: kfca_llm.score_updates(updates, penalty=penalty), block)
                floor += _calls(lambda: [t.sum() for t in tensors], block)
            print(f"{name:<50} {penalty:<9} {min(engine) * 1e6:7.0f}us {statistics.median(engine) * 1e6:7.0f}us "
                  f"{min(floor) * 1e6:9.0f}us")
    print(f"load average after: {' '.join(f'{v:.2f}' for v in os.getloadavg())}")


if __name__ == "__main__":
    main()
