"""The global model under attack: KFCA's aggregation modes beside Flower's robust strategies, on the tiny LLM task.

Every cell is one federation through the real pipeline (``kfca_llm.fl.rounds.run_federation`` on
``recipes/tiny.toml`` with overrides): ``--clients`` clients, a fraction of them per round (FlowerTune's
``max(int(n * f), 2)``), 20% of them fixed attackers of one kind (``kfca.attackers``; clients 3, 8, 13, 18
of 20), the scoring the recipe defaults to (whatever ``kfca.peers`` & co. default to in this checkout). The
global adapter is evaluated on the held-out rows after every round; the table gives the last round's loss
and exact-answer accuracy.

Methods:
- ``honest`` (the oracle: every sampled client's honest update, attacks never reach the model), ``all``
  (unguarded FedAvg), ``exclude-negative``, ``reward-weighted``: ``kfca.aggregate`` (``fl/aggregate.py``,
  the rule ``KFCAStrategy`` uses);
- ``fedmedian``, ``fedtrimmedavg`` (beta 0.2), ``krum``, ``multikrum`` (m = n - f), ``bulyan`` (f = number of
  attackers expected in a round, at least 1): Flower's own classes (``flwr.serverapp.strategy``), their
  ``aggregate_train`` called on the round's replies (global + submission, weighted by examples) through
  ``FederationOptions.aggregator``: the same replies a ServerApp would receive, without a simulation engine;
- ``kfca+<strategy>``: KFCA's ``exclude-negative`` first (``aggregation_weights``, under the recipe's
  ``kfca.weak-verdict``), the Flower strategy on the replies it keeps: ``KFCAStrategy(<strategy>,
  aggregation="exclude-negative")``.
A round whose aggregation returns nothing (Bulyan below 4f + 3 replies) keeps the global adapter.

Clients' local training is memoised on (global adapter bytes, client, round): cells that reach the same
global adapter (round 1 of every method, methods that agree bit for bit) train once.

    python benchmarks/bench_aggregation.py --smoke            # seconds: 1 attack, 2 rounds, 3 methods
    python benchmarks/bench_aggregation.py --out runs/agg.json --markdown runs/agg.md   # the grid (long)
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

from kfca_llm.fl import rounds
from kfca_llm.fl.aggregate import aggregation_weights
from kfca_llm.fl.rounds import FederationOptions, RoundAggregation, run_federation
from kfca_llm.recipe import load_recipe

KFCA_MODES = ("honest", "all", "exclude-negative", "reward-weighted")
FLOWER = ("fedmedian", "fedtrimmedavg", "krum", "multikrum", "bulyan")
METHODS = (*KFCA_MODES, *FLOWER, *(f"kfca+{name}" for name in FLOWER))
ATTACKS = ("flip", "random", "zero", "stale", "sparse:0.25", "scaled:-10")
ATTACKER_SHARE = 0.2


def attackers(num_clients: int, spec: str) -> list[str]:
    """20% of the clients, spread over the ids (3, 8, 13, 18 of 20)."""
    count = max(1, round(ATTACKER_SHARE * num_clients))
    step = num_clients // count
    return [f"{step * i + step - 2}={spec}" for i in range(count)]


def cell_recipe(args, fraction: float, attack: str, seed: int, aggregate: str):
    return load_recipe("tiny", getattr(args, "set", None) or (), values={
        "num-clients": args.clients, "dataset.num-rows": args.clients * args.rows_per_client,
        "strategy.fraction-train": fraction, "num-server-rounds": args.rounds,
        "train.training-arguments.max-steps": args.steps, "kfca.attacks": [],
        "kfca.attackers": attackers(args.clients, attack), "kfca.seed": seed, "kfca.aggregate": aggregate,
        "train.save-client-updates": False})


def memoised_training():
    """``train_client`` memoised on (global adapter bytes, seed, round): the seed names client and round."""
    train = rounds.train_client
    cache: dict[tuple, object] = {}
    stats = {"trained": 0, "reused": 0}

    def cached(model, global_state, examples, plan, *, server_round, seed, **kwargs):
        digest = hashlib.sha256()
        for name in sorted(global_state):
            digest.update(name.encode())
            digest.update(global_state[name].detach().cpu().numpy().tobytes())
        key = (digest.hexdigest(), seed, server_round, len(examples), plan.max_steps)
        if key in cache:
            stats["reused"] += 1
            return cache[key]
        stats["trained"] += 1
        cache[key] = train(model, global_state, examples, plan, server_round=server_round, seed=seed, **kwargs)
        return cache[key]

    rounds.train_client = cached
    return stats


def flower_strategy(name: str, replies_expected: int, attackers_expected: float):
    """Flower's class with this benchmark's parameters (f = attackers expected per round, at least 1)."""
    from flwr.serverapp.strategy import Bulyan, FedMedian, FedTrimmedAvg, Krum, MultiKrum

    f = max(1, math.ceil(attackers_expected))
    if name == "fedmedian":
        return FedMedian()
    if name == "fedtrimmedavg":
        return FedTrimmedAvg(beta=0.2)
    if name == "krum":
        return Krum(num_malicious_nodes=f)
    if name == "multikrum":
        return MultiKrum(num_malicious_nodes=f, num_nodes_to_select=max(1, replies_expected - f))
    return Bulyan(num_malicious_nodes=f)


def flower_aggregator(strategy, kfca_mode: str, weak_verdict: str):
    """``FederationOptions.aggregator``: KFCA's rule ``kfca_mode`` picks the replies (``"all"``: every one; under
    the recipe's ``kfca.weak-verdict``), the Flower strategy's ``aggregate_train`` aggregates them as it would a
    ServerApp's replies."""
    from flwr.app import Array, ArrayRecord, Message, MetricRecord, RecordDict
    from flwr.supercore.task_identity import TaskIdentity

    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1  # messages read their run from it

    def aggregate(round_: RoundAggregation):
        weights = aggregation_weights(kfca_mode, round_.rewards, {s.id: s.num_examples for s in round_.submissions},
                                      verdicts=round_.verdicts, weak_verdict=weak_verdict)
        by_id = {s.id: s for s in round_.submissions}
        replies = []
        for node, who in enumerate(weights, start=1):
            arrays = ArrayRecord({k: Array((g + by_id[who].update[k]).numpy()) for k, g in round_.global_state.items()})
            sent = Message(RecordDict(), dst_node_id=node, message_type="train")
            content = RecordDict({"arrays": arrays, "metrics": MetricRecord({"num-examples": weights[who]})})
            replies.append(Message(content=content, reply_to=sent))
        arrays = strategy.aggregate_train(round_.round, replies)[0] if replies else None
        if arrays is None:
            return round_.global_state, {}
        return {k: torch.from_numpy(np.array(arrays[k].numpy(), dtype=np.float32)) for k in round_.global_state}, weights

    return aggregate


def exclusion_shares(report: dict) -> dict[str, float | None]:
    """Attacker submissions left out of FedAvg / all attacker submissions; the same for honest ones."""
    attacked = honest = attacked_out = honest_out = 0
    for record in report["round_records"]:
        kept = record["aggregated"]
        for cid in record["clients"]:
            if cid in record["fixed_attacks"]:
                attacked += 1
                attacked_out += cid not in kept
            else:
                honest += 1
                honest_out += cid not in kept
    return {"attackers_excluded": attacked_out / attacked if attacked else None,
            "honest_excluded": honest_out / honest if honest else None}


def labelled(method: str, label: str | None) -> str:
    """The method's name in the table: ``exclude-negative [round peers]`` for a run under ``--set``/``--label``."""
    return f"{method} [{label}]" if label else method


def base_method(name: str) -> str:
    return name.split(" [", 1)[0]


def run_cell(args, fraction: float, attack: str, seed: int, method: str) -> dict:
    started = time.perf_counter()
    replies = max(int(args.clients * fraction), 2)
    aggregator = None
    if method in KFCA_MODES:
        recipe = cell_recipe(args, fraction, attack, seed, method)
    else:
        recipe = cell_recipe(args, fraction, attack, seed, "all")
        name = method.removeprefix("kfca+")
        aggregator = flower_aggregator(flower_strategy(name, replies, ATTACKER_SHARE * replies),
                                       "exclude-negative" if method.startswith("kfca+") else "all",
                                       recipe.kfca.weak_verdict)
    result = run_federation(recipe, FederationOptions(progress=False, cpu=True, aggregator=aggregator))
    report = result.to_report()
    heldout = report["heldout"]
    cell = {"fraction": fraction, "attack": attack, "seed": seed, "method": labelled(method, args.label),
            "overrides": list(args.set or ()), "rounds": args.rounds, "steps": args.steps,
            "loss": heldout["loss"][-1], "accuracy": heldout["accuracy"][-1], "loss_per_round": heldout["loss"],
            "rounds_kept_global": sum(not r["aggregated"] for r in report["round_records"]),
            "wall_s": time.perf_counter() - started}
    if method in KFCA_MODES[2:] or method.startswith("kfca+"):
        cell.update(exclusion_shares(report))
    return cell


def column(cell: dict) -> tuple[float, str, int]:
    """A table column: (fraction, attack, rounds); a longer run of the same attack is a column of its own."""
    return cell["fraction"], cell["attack"], cell["rounds"]


def column_order(col: tuple[float, str, int]) -> tuple:
    return col[0], ATTACKS.index(col[1]) if col[1] in ATTACKS else 99, col[2]


def summarise(cells: list[dict]) -> dict:
    """(column, method) -> mean, min, max of the final loss and accuracy over seeds, and exclusions."""
    groups: dict[tuple, list[dict]] = {}
    for c in cells:
        groups.setdefault((column(c), c["method"]), []).append(c)
    out = {}
    for key, group in groups.items():
        if len({c["steps"] for c in group}) > 1:
            raise ValueError(f"cells {key} ran with different local steps: not one figure")
        losses, accuracies = [c["loss"] for c in group], [c["accuracy"] for c in group]
        entry = {"seeds": [c["seed"] for c in group], "loss": float(np.mean(losses)), "loss_min": min(losses),
                 "loss_max": max(losses), "accuracy": float(np.mean(accuracies)),
                 "rounds_kept_global": float(np.mean([c["rounds_kept_global"] for c in group]))}
        for share in ("attackers_excluded", "honest_excluded"):
            values = [c[share] for c in group if c.get(share) is not None]
            if values:
                entry[share] = float(np.mean(values))
        out[key] = entry
    return out


def table(cells: list[dict]) -> str:
    """Markdown: one row per method, one column per (fraction, attack, rounds): final held-out loss (mean, min-max
    over seeds), exact answers; KFCA modes add the shares of attacker / honest updates left out; rounds whose
    aggregation kept nothing (the global adapter stayed) are counted."""
    summary = summarise(cells)
    columns = sorted({col for col, _ in summary}, key=column_order)
    methods = sorted({m for _, m in summary}, key=lambda m: (METHODS.index(base_method(m)), m))
    lines = ["| method | " + " | ".join(f"{a} @ {f}, {r} rounds" for f, a, r in columns) + " |",
             "|---|" + "---|" * len(columns)]
    for method in methods:
        row = []
        for col in columns:
            e = summary.get((col, method))
            if e is None:
                row.append("not run")
                continue
            seeds = len(e["seeds"])
            spread = f"{e['loss_min']:.3f}-{e['loss_max']:.3f}, {seeds} seeds" if seeds > 1 else "1 seed"
            text = f"{e['loss']:.3f} ({spread}), {100 * e['accuracy']:.0f}%"
            if "attackers_excluded" in e:
                text += f"; out {100 * e['attackers_excluded']:.0f}%/{100 * e.get('honest_excluded', 0):.0f}%"
            if e["rounds_kept_global"]:
                text += f"; {e['rounds_kept_global']:.1f} rounds skipped"
            row.append(text)
        lines.append(f"| {method} | " + " | ".join(row) + " |")
    return "\n".join(lines)


def verdict(cells: list[dict]) -> list[str]:
    """The issue's goal per column: exclude-negative (and each scoring variant of it) within 5% of the oracle's
    final loss; below the best Flower robust strategy alone. Each comparison averages over the seeds both sides
    ran (the oracle's, or the strategy's, may have fewer)."""
    losses: dict[tuple, dict[int, float]] = {}
    for c in cells:
        losses.setdefault((column(c), c["method"]), {})[c["seed"]] = c["loss"]

    def paired(ours: dict[int, float], theirs: dict[int, float]) -> tuple[float, float, int]:
        seeds = sorted(set(ours) & set(theirs))
        return (float(np.mean([ours[s] for s in seeds])) if seeds else math.nan,
                float(np.mean([theirs[s] for s in seeds])) if seeds else math.nan, len(seeds))

    lines = []
    for col in sorted({col for col, _ in losses}, key=column_order):
        f, a, r = col
        oracle = losses.get((col, "honest"))
        variants = sorted(m for cc, m in losses if cc == col and base_method(m) == "exclude-negative")
        for name in variants if oracle is not None else ():
            ours_loss, oracle_loss, n = paired(losses[(col, name)], oracle)
            if not n:
                continue
            gap = ours_loss / oracle_loss - 1
            text = (f"{a} @ {f}, {r} rounds: {name} {100 * gap:+.1f}% of the oracle's loss "
                    f"({'within' if gap <= 0.05 else 'OUTSIDE'} 5%; {n} seed{'s' * (n > 1)})")
            robust = {m: paired(losses[(col, name)], losses[(col, m)]) for m in FLOWER if (col, m) in losses}
            robust = {m: got for m, got in robust.items() if got[2]}
            if robust:
                best = min(robust, key=lambda m: robust[m][1] - robust[m][0])  # the lowest loss among them
                mine, theirs, n = robust[best]
                text += (f"; best Flower robust strategy {best} {theirs:.3f} against {mine:.3f} ({n} seed"
                         f"{'s' * (n > 1)}): {name} {'better' if mine < theirs else 'NOT better'}")
            lines.append(text)
    return lines


FIGURE_PANELS = ((0.1, "flip"), (0.1, "scaled:-10"), (0.1, "zero"), (0.5, "flip"), (0.5, "scaled:-10"), (0.5, "zero"))
FIGURE_METHODS = ("honest", "all", "exclude-negative", "exclude-negative [trust-pool]",
                  "exclude-negative [round-peers-only]", "reward-weighted", "krum", "fedmedian")


def plot(cells: list[dict], path: Path) -> None:
    """Held-out loss after each round, mean over seeds, of the main methods in six columns of the grid."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 3, figsize=(13, 7), sharey=True)
    colours = dict(zip(FIGURE_METHODS, plt.rcParams["axes.prop_cycle"].by_key()["color"]))
    for ax, (fraction, attack) in zip(axes.flat, FIGURE_PANELS):
        for method in FIGURE_METHODS:
            curves = [c["loss_per_round"] for c in cells
                      if (c["fraction"], c["attack"], c["method"]) == (fraction, attack, method)]
            if len({len(curve) for curve in curves}) > 1:  # a longer run of the column: its curve (the label says)
                curves = [curve for curve in curves if len(curve) == max(len(c) for c in curves)]
            if curves:
                mean = np.mean(curves, axis=0)
                ax.plot(range(1, len(mean) + 1), mean, marker="o", markersize=3, color=colours[method],
                        label=f"{method} ({len(curves)} seed{'s' * (len(curves) > 1)}, {len(mean)} rounds)")
        ax.set_title(f"{attack} @ {fraction}")
        ax.set_xlabel("round")
        ax.legend(fontsize=6)
    for ax in axes[:, 0]:
        ax.set_ylabel("held-out loss (mean over seeds)")
    fig.suptitle("Global adapter's held-out loss under 20% fixed attackers (tiny LLM, 20 clients)")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--rows-per-client", type=int, default=40)
    parser.add_argument("--fractions", type=float, nargs="+", default=[0.1, 0.5])
    parser.add_argument("--attacks", nargs="+", default=list(ATTACKS))
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--steps", type=int, default=4, help="local steps per round (train max-steps)")
    parser.add_argument("--set", action="append", metavar="KEY=VALUE",
                        help="recipe override for every cell (e.g. kfca.min-peers=0); needs --label")
    parser.add_argument("--label", help="the cells' methods are named 'METHOD [LABEL]' (a scoring variant)")
    parser.add_argument("--out", type=Path, help="JSON of every cell (written after each cell: a long run resumes)")
    parser.add_argument("--markdown", type=Path, help="write the table here too")
    parser.add_argument("--figure", type=Path, help="plot the held-out loss per round here (PNG)")
    parser.add_argument("--threads", type=int, default=max(1, min(2, os.cpu_count() or 1)),
                        help="torch threads (1 on a busy machine: two threads sharing a loaded core wait on each other)")
    parser.add_argument("--smoke", action="store_true", help="seconds: 6 clients, 2 rounds, 1 step, flip, 3 methods")
    args = parser.parse_args(argv)
    if bool(args.set) != bool(args.label):
        parser.error("--set and --label go together: a variant's cells need their own name")
    if args.smoke:
        args.clients, args.rows_per_client, args.fractions, args.attacks = 6, 8, [0.5], ["flip"]
        args.methods, args.seeds, args.rounds, args.steps = ["honest", "exclude-negative", "kfca+fedmedian"], [0], 2, 1
    torch.set_num_threads(args.threads)
    stats = memoised_training()
    cells: list[dict] = json.loads(args.out.read_text())["cells"] if args.out and args.out.exists() else []
    done = {(c["fraction"], c["attack"], c["seed"], c["method"]) for c in cells
            if (c["rounds"], c["steps"]) == (args.rounds, args.steps)}
    started = time.perf_counter()
    for fraction in args.fractions:
        for attack in args.attacks:
            for seed in args.seeds:
                for method in args.methods:
                    if (fraction, attack, seed, labelled(method, args.label)) in done:
                        continue
                    cell = run_cell(args, fraction, attack, seed, method)
                    cells.append(cell)
                    print(f"{attack} @ {fraction} seed {seed} {cell['method']}: loss {cell['loss']:.4f} "
                          f"accuracy {cell['accuracy']:.3f} ({cell['wall_s']:.1f} s)", file=sys.stderr, flush=True)
                    if args.out:
                        args.out.parent.mkdir(parents=True, exist_ok=True)
                        args.out.write_text(json.dumps({"clients": args.clients, "rows_per_client": args.rows_per_client,
                                                        "cells": cells}, indent=1))
    text = table(cells)
    print(text)
    for line in verdict(cells):
        print(line)
    print(f"local trainings: {stats['trained']} run, {stats['reused']} reused; wall {time.perf_counter() - started:.0f} s; "
          f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if args.markdown:
        args.markdown.write_text(text + "\n")
    if args.figure:
        plot(cells, args.figure)
    return 0


if __name__ == "__main__":
    sys.exit(main())
