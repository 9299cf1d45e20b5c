"""Computation time against the number of clients n and peers p: KFCA beside CA (the paper's appendix figure).

    python benchmarks/bench_scaling.py                      # paper sizes: QP m=5,280, D 10,000 tasks x 10 labels
    python benchmarks/bench_scaling.py --adapter            # + m = 80,740,352 (rank-32 Qwen2.5-7B LoRA, bf16)
    python benchmarks/bench_scaling.py --smoke              # tiny sizes, seconds (CI)

Methods, all on the same inputs, all single calls on prepared data (best of --repeat):
* KFCA-QP: ``kfca_llm.score_updates(updates, peers=p)``, the public call end to end (packing the float
  updates, counting, payments and the report with its per-pair entries);
* KFCA-QP counts: the same round without the report objects (``SignPacker`` packing, the backend's
  counts of the scored pairs, ``pair_payments``): what the O(n p m) claim is about;
* CA-QP: the Correlated Agreement baseline on the same packed bits: every ordered pair, its 2x2 delta
  re-estimated from the pair's joint reports, S = 1{delta > 0}, bonus and expected penalty under S;
* KFCA-D: ``kfca_llm.score_labels(labels, num_labels=10, peers=p)`` on 10,000 tasks;
* CA-D: every ordered pair, ``mechanism.delta_matrix`` -> ``ca_score_matrix`` -> ``mtpp_terms``.

Points faster than 1 s are the best of --repeat calls; slower ones are one call. A line stops
growing n once one of its points took more than --max-seconds (the next would take
longer still); the table says so. The figure is log-log with the least-squares slope of each line
over its points with n >= 10 (below that, fixed per-call costs dominate and say nothing about growth).
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch

import kfca_llm
from kfca_llm.engine.stats import joint_tables, pair_payments
from kfca_llm.mechanism import ca_score_matrix, delta_matrix, mtpp_terms
from kfca_llm.partition import BONUS, PENALTY_1, PENALTY_2, peer_pairs

from bench_cpu_engine import best_of  # run as a script: benchmarks/ is on sys.path

PEERS = (1, 2, 5, None)
CLIENTS = (2, 5, 10, 20, 50, 100, 200, 500, 1000)
CNN_COORDS = 5_280
TASKS, LABELS = 10_000, 10


def _gaussian_updates(n: int, m: int, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    signal = torch.randn(m, generator=g)
    return {f"c{i:04d}": signal + torch.randn(m, generator=g) for i in range(n)}


def _labels(n: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    truth = rng.integers(0, LABELS, TASKS)
    out = {}
    for i in range(n):
        noisy = rng.random(TASKS) < 0.4
        out[f"c{i:04d}"] = np.where(noisy, rng.integers(0, LABELS, TASKS), truth)
    return out


def _packed(updates) -> kfca_llm.SignPacker:
    first = next(iter(updates.values()))
    packer = kfca_llm.SignPacker({"update": tuple(first.shape)}, list(updates), backend="cpu")
    for client, update in updates.items():
        packer.add(client, "update", update)
    return packer


def kfca_qp_counts(updates, peers) -> np.ndarray:
    packer = _packed(updates)
    pairs = peer_pairs(len(packer.clients), peers, 0)
    counts = packer.backend.round_counts(packer.buffers, 0, 0.5, pairs)
    payment, _, _ = pair_payments(counts, pairs)
    return payment


def ca_qp(updates, peers=None) -> np.ndarray:
    """CA on signs: per ordered pair, S = 1{delta > 0} from the pair's own joint reports (all pairs)."""
    packer = _packed(updates)
    pairs = peer_pairs(len(packer.clients), None, 0)
    counts = packer.backend.round_counts(packer.buffers, 0, 0.5)
    joint = joint_tables(counts, pairs).astype(np.float64)
    total = joint.sum(axis=(1, 2), keepdims=True)
    p = joint / total
    score = (p - p.sum(axis=2, keepdims=True) * p.sum(axis=1, keepdims=True) > 0).astype(np.float64)
    i, j = pairs[:, 0], pairs[:, 1]
    g = counts.gram
    n_bonus, m1, m2 = (int(v) for v in counts.sizes)
    both_neg = g[BONUS, i, j]
    bonus_joint = np.stack([both_neg, g[BONUS, i, i] - both_neg, g[BONUS, j, j] - both_neg,
                            n_bonus - g[BONUS, i, i] - g[BONUS, j, j] + both_neg], axis=1).reshape(-1, 2, 2)
    bonus = (score * bonus_joint).sum(axis=(1, 2)) / n_bonus
    f1 = np.stack([g[PENALTY_1, i, i], m1 - g[PENALTY_1, i, i]], axis=1) / m1
    f2 = np.stack([g[PENALTY_2, j, j], m2 - g[PENALTY_2, j, j]], axis=1) / m2
    penalty = np.einsum("pa,pab,pb->p", f1, score, f2)
    return bonus - penalty


def ca_d(labels, peers=None) -> list[float]:
    clients = sorted(labels)
    payments = []
    for i, j in peer_pairs(len(clients), None, 0).tolist():
        r1, r2 = labels[clients[i]], labels[clients[j]]
        score = ca_score_matrix(delta_matrix(r1, r2, LABELS))
        payments.append(mtpp_terms(r1, r2, score, pair=(i, j)).payment)
    return payments


METHODS = {
    "KFCA-QP": ("qp", lambda data, p: kfca_llm.score_updates(data, peers=p, backend="cpu"), False),
    "KFCA-QP counts": ("qp", kfca_qp_counts, False),
    "CA-QP": ("qp", ca_qp, True),
    "KFCA-D": ("d", lambda data, p: kfca_llm.score_labels(data, num_labels=LABELS, peers=p), False),
    "CA-D": ("d", ca_d, True),
}


def measure(clients, peers, methods, coords, repeat, max_seconds):
    rows, stopped = [], set()
    inputs = {}
    for n in clients:
        inputs.clear()  # one n at a time in memory
        for method in methods:
            kind, fn, all_pairs_only = METHODS[method]
            if kind not in inputs:
                inputs[kind] = _gaussian_updates(n, coords) if kind == "qp" else _labels(n)
            for p in ((None,) if all_pairs_only else peers):
                line = (method, "all" if p is None else p)
                if (p is not None and p >= n) or line in stopped:
                    continue
                fn(inputs[kind], p)  # warm-up: numba dispatch and caches outside the timing
                seconds = best_of(lambda: fn(inputs[kind], p), 1)
                if seconds < 1.0:  # best of --repeat where that is cheap
                    seconds = min(seconds, best_of(lambda: fn(inputs[kind], p), repeat - 1) if repeat > 1 else seconds)
                rows.append((method, line[1], n, seconds))
                print(f"{method:<15} p={line[1]!s:<4} n={n:<5} {seconds * 1e3:10.2f} ms", flush=True)
                if seconds > max_seconds:
                    stopped.add(line)
    return rows, stopped


def slopes(rows) -> dict[tuple, float]:
    out = {}
    for line in sorted({(m, p) for m, p, _, _ in rows}, key=str):
        pts = [(n, s) for m, p, n, s in rows if (m, p) == line and n >= 10]
        if len(pts) >= 3:
            x, y = np.log([n for n, _ in pts]), np.log([s for _, s in pts])
            out[line] = float(np.polyfit(x, y, 1)[0])
    return out


def adapter_rows(clients, peers, dtype, repeat, max_seconds):
    """KFCA-QP (counts) and CA-QP on a rank-32 Qwen2.5-7B LoRA, clients streamed in one at a time."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_triton import lora_shapes

    shapes = lora_shapes(28, 3584, 18944, 512, 32)
    names = sorted(shapes)
    g = torch.Generator().manual_seed(0)
    base = {k: torch.randn(shapes[k], generator=g).to(dtype) for k in names}
    noise = {k: torch.randn(shapes[k], generator=g).to(dtype) for k in names}
    for size in (64, 1 << 21):  # load both builds of the packing kernel for this dtype outside the timing
        warm = kfca_llm.SignPacker({"w": (size,)}, ["a", "b"], backend="cpu")
        warm.add_many("a", {"w": torch.randn(size).to(dtype)})
    rows, stopped = [], set()
    for n in clients:
        packer = kfca_llm.SignPacker(shapes, [f"c{i:04d}" for i in range(n)], backend="cpu")
        pack_seconds = 0.0
        for i, client in enumerate(packer.clients):
            update = {k: base[k] + noise[k].roll(i * 7919) for k in names}  # distinct, cheap to make
            start = time.perf_counter()
            packer.add_many(client, update)
            pack_seconds += time.perf_counter() - start
        for p in peers + (None, "ca"):
            method = "CA-QP" if p == "ca" else "KFCA-QP counts"
            line = (method, "all" if p in (None, "ca") else p)
            if (isinstance(p, int) and p >= n) or line in stopped:
                continue
            pairs = peer_pairs(n, None if p == "ca" else p, 0)

            def count():
                counts = packer.backend.round_counts(packer.buffers, 0, 0.5, None if p == "ca" else pairs)
                return pair_payments(counts, pairs)

            seconds = pack_seconds + best_of(count, repeat)
            rows.append((method, line[1], n, seconds))
            print(f"adapter {method:<15} p={line[1]!s:<4} n={n:<5} {seconds:8.2f} s (packing {pack_seconds:.2f} s)",
                  flush=True)
            if seconds > max_seconds:
                stopped.add(line)
        packer = None  # free this round's packed bits before the next, larger one is allocated
    return rows, stopped, sum(s.numel() if hasattr(s, "numel") else int(np.prod(s)) for s in shapes.values())


def table(rows, stopped, title) -> str:
    lines_ = sorted({(m, p) for m, p, _, _ in rows}, key=lambda t: (t[0], str(t[1])))
    ns = sorted({n for _, _, n, _ in rows})
    fitted = slopes(rows)
    head = "| method | p | " + " | ".join(f"n={n}" for n in ns) + " | slope (n >= 10) |"
    out = [f"**{title}** (seconds)", "", head, "|" + "---|" * (len(ns) + 3)]
    for line in lines_:
        cells = []
        for n in ns:
            hit = [s for m, p, k, s in rows if (m, p) == line and k == n]
            cells.append(f"{hit[0]:.3g}" if hit else ("stop" if line in stopped else "-"))
        slope = f"{fitted[line]:.2f}" if line in fitted else "-"
        out.append(f"| {line[0]} | {line[1]} | " + " | ".join(cells) + f" | {slope} |")
    return "\n".join(out)


def figure(rows, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fitted = slopes(rows)
    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=False)
    for ax, kind in zip(axes, ("qp", "d")):
        for line in sorted({(m, p) for m, p, _, _ in rows if METHODS[m][0] == kind}, key=str):
            pts = sorted((n, s) for m, p, n, s in rows if (m, p) == line)
            label = f"{line[0]} p={line[1]}" + (f" (slope {fitted[line]:.2f})" if line in fitted else "")
            style = "--" if line[0].startswith("CA") else "-"
            ax.loglog([n for n, _ in pts], [s for _, s in pts], style, marker="o", markersize=3, label=label)
        ax.set_xlabel("clients n")
        ax.set_ylabel("seconds per round")
        ax.set_title("QP: m = 5,280 sign tasks" if kind == "qp" else "D: 10,000 tasks x 10 labels")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=6)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, nargs="+", default=list(CLIENTS))
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--max-seconds", type=float, default=5.0, help="stop a line after a point this slow")
    parser.add_argument("--figure", default=None, help="write the log-log figure (PNG) here")
    parser.add_argument("--adapter", action="store_true", help="also m = 80.7M adapter coordinates")
    parser.add_argument("--adapter-clients", type=int, nargs="+", default=[2, 5, 10, 20, 50])
    parser.add_argument("--smoke", action="store_true", help="tiny sizes for CI (seconds)")
    args = parser.parse_args(argv)
    if args.smoke:
        args.clients, args.repeat, args.max_seconds = [2, 5, 10, 20], 1, 5.0

    load = os.getloadavg()
    print(f"command: {' '.join([Path(sys.executable).name, *sys.argv])}")
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, torch threads {torch.get_num_threads()}, "
          f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    rows, stopped = measure(args.clients, PEERS, args.methods, CNN_COORDS, args.repeat, args.max_seconds)
    print()
    print(table(rows, stopped, f"QP m = {CNN_COORDS:,}, D {TASKS:,} tasks x {LABELS} labels"))
    if args.figure:
        figure(rows, Path(args.figure), f"KFCA vs CA, {platform.machine()} {os.cpu_count()} cores, "
                                        f"load {load[0]:.1f}")
        print(f"figure: {args.figure}")
    if args.adapter:
        adapter, stopped_adapter, m = adapter_rows(args.adapter_clients, (1, 5), torch.bfloat16, 1, 60.0)
        print()
        print(table(adapter, stopped_adapter, f"adapter m = {m:,} bf16 (packing included)"))
    print(f"load average after: {' '.join(f'{v:.2f}' for v in os.getloadavg())}")


if __name__ == "__main__":
    main()
