"""How far apart an honest client's own updates of different rounds are: what the peer pool's resubmission rule must
not take for a replay (``fl.pool_copies``).

Under FlowerTune's static data order (``train.dynamic-data-seed = false``) every participation of a client trains on
the same samples, from a newer global; its updates of two rounds can then share most of their signs. This trains (or
reads the ``--cache`` of) one honest tiny federation at 20 x 0.1 (``bench_few_peers.capture``) and prints, per lag
between a client's two participations and per phase of training (the newer round in the first, middle or last third
of the run), the fraction of signs on the round's task mask in which the two differ: the statistic the copy rule
reads. The analysis client of the capture trains every round, so lag 1 is well covered.

    .venv/bin/python benchmarks/honest_repeats.py --rounds 60 --cache /tmp/updates60.safetensors
    .venv/bin/python benchmarks/honest_repeats.py --rounds 60 --cache /tmp/steps2.safetensors \
        --set train.training-arguments.max-steps=2 --set dataset.num-rows=400

The second is the issue's regime (Flower's general-NLP app offline: 2 local steps, 20-row partitions), where an
honest client's repeats come closest.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_few_peers import DATA_ORDERS, capture, synthetic  # noqa: E402

from kfca_llm.api import pack_updates  # noqa: E402
from kfca_llm.fl.pool_values import share_apart, value_sketch  # noqa: E402
from kfca_llm.fl.reference import REFERENCE  # noqa: E402
from kfca_llm.fl.seeds import KFCA, derive_seed  # noqa: E402

LAG_BINS = ((1, 1), (2, 2), (3, 5), (6, 10), (11, 10**9))
PHASES = ("early", "middle", "late")


def own_disagreements(updates) -> list[tuple[int, int, float, float]]:
    """(lag, newer round, fraction of differing signs on the pair's task mask, fraction of the value sketch's sampled
    coordinates whose values differ: ``fl.pool_values``, exact updates) for every two updates of one client."""
    by_client: dict[str, list[tuple[int, dict]]] = {}
    for t, clients in updates.items():
        for client, update in clients.items():
            if client != REFERENCE:
                by_client.setdefault(client, []).append((t, update))
    out = []
    for history in by_client.values():
        for k, (t, newer) in enumerate(history):
            for s, older in history[:k]:
                packer = pack_updates({"newer": newer, "older": older})
                signs, task = packer.words()
                tasks = popcount(task)
                sketches = [value_sketch(u, packer.layout) for u in (newer, older)]
                out.append((t - s, t, popcount((signs[0] ^ signs[1]) & task) / tasks if tasks else 0.0,
                            share_apart(*sketches)))
    return out


def popcount(words: np.ndarray) -> int:
    return int(np.unpackbits(np.ascontiguousarray(words).view(np.uint8)).sum())


def repeat_table(updates, limit: float = 0.02) -> str:
    """Per lag bin and phase: pairs, the smallest, 1st-percentile and median fraction of differing signs, and how
    many pairs differ in at most ``limit`` (the copy rule's ``max_disagreement``); over all pairs, how many repeat
    every sign, and how many every sampled value (pool rule 11's replay)."""
    rows = own_disagreements(updates)
    last = max(updates)
    lines = [f"| lag (rounds) | phase | pairs | min | 1st pct | median | within {limit:.0%} |", "|---|---|---|---|---|---|---|"]
    for low, high in LAG_BINS:
        for phase_index, phase in enumerate(PHASES):
            found = np.array([d for lag, t, d, _ in rows if low <= lag <= high
                              and min((t - 1) * len(PHASES) // last, len(PHASES) - 1) == phase_index])
            if found.size:
                lag = str(low) if low == high else f"{low}+" if high > 10**6 else f"{low}-{high}"
                lines.append(f"| {lag} | {phase} | {found.size} | {found.min():.4f} | {np.percentile(found, 1):.4f} | "
                             f"{np.median(found):.4f} | {int((found <= limit).sum())} |")
    every = np.array([d for _, _, d, _ in rows])
    values = np.array([v for _, _, _, v in rows])
    if every.size:
        lines.append(f"\nall {every.size} pairs: smallest {every.min():.4f}, within {limit:.0%}: "
                     f"{int((every <= limit).sum())}, identical: {int((every == 0).sum())}; sampled values: "
                     f"smallest share differing {values.min():.4f}, every one repeated: {int((values == 0).sum())}")
    return "\n".join(lines)


def lag_table(updates, max_lag: int = 6) -> str:
    """Mean payment of an honest update against other clients' honest updates k rounds older (k = 0: the same
    round), on the newer round's partition, and the share of such pairs paid < 0."""
    by_lag: dict[int, list[float]] = {}
    updates = {t: {c: u for c, u in clients.items() if c != REFERENCE} for t, clients in updates.items()}
    for t, clients in updates.items():
        for client, update in clients.items():
            others = {f"{c}@{s}": u for s in range(max(1, t - max_lag), t + 1) for c, u in updates[s].items()
                      if c != client}
            if not others:
                continue
            report = pack_updates({"me": update, **others}).score(pairs=[("me", o) for o in others],
                                                                  seed=derive_seed(0, KFCA, t))
            for (_, other), payment in report.pairwise.items():
                by_lag.setdefault(t - int(other.rpartition("@")[2]), []).append(payment)
    lines = ["| lag (rounds) | pairs | mean payment | paid < 0 |", "|---|---|---|---|"]
    lines += [f"| {k} | {len(v)} | {np.mean(v):+.4f} | {np.mean(np.array(v) < 0):.2f} |" for k, v in sorted(by_lag.items())]
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--cache", type=Path, default=None, help="safetensors file of the honest updates (read or written)")
    parser.add_argument("--data-order", choices=("both", *DATA_ORDERS), default="both")
    parser.add_argument("--synthetic", action="store_true", help="synthetic updates instead of training (CI smoke)")
    parser.add_argument("--lags", action="store_true", help="how honest updates agree with *other* clients' by lag")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a recipe key for the capture")
    args = parser.parse_args(argv)
    for order in list(DATA_ORDERS) if args.data_order == "both" else [args.data_order]:
        dynamic = DATA_ORDERS[order]
        updates = synthetic(args.rounds, dynamic) if args.synthetic else capture(args.rounds, args.cache, dynamic, tuple(args.set))
        print(f"## data order: {order} (train.dynamic-data-seed = {str(dynamic).lower()})\n")
        print((lag_table(updates) if args.lags else repeat_table(updates)) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
