"""One KFCA-FedAvg federation with the attack analysis, and its outputs (the work of ``kfca-llm simulate``).

``run_one`` writes report.json, rewards.csv, rewards.png and delta.png; ``reward_table`` is the table it prints.
"""

from __future__ import annotations

import csv
import io
import time
from pathlib import Path
from typing import Any

from .recipe import Recipe

def default_out(recipe: Recipe, domain: str | None = None) -> Path:
    """``runs/<recipe>-seed<seed>``, or ``runs/<recipe>-<domain>-seed<seed>`` when ``--domain`` chose the data."""
    name = recipe.name if domain in (None, recipe.name) else f"{recipe.name}-{domain}"
    return Path("runs") / f"{name}-seed{recipe.kfca.seed}"


def rewards_csv(report: dict[str, Any]) -> str:
    """Long format: one row per (round, strategy), then the honest clients' own rewards."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["round", "kind", "name", "reward"])
    for spec, entry in report["strategies"].items():
        for t, reward in enumerate(entry["per_round"], start=1):
            writer.writerow([t, "strategy", spec, repr(reward)])
    for t, rewards in enumerate(report["honest_clients"]["per_round"], start=1):
        for client, reward in sorted(rewards.items()):
            writer.writerow([t, "honest-client", client, repr(reward)])
    for client, entry in report.get("fixed_attackers", {}).items():
        for t, reward in enumerate(entry["per_round"], start=1):
            if reward is not None:
                writer.writerow([t, f"attacker:{entry['spec']}", client, repr(reward)])
    # A client flagged as a copy: its reward before the duplicate policy (the rows above are after it).
    for t, record in enumerate(report.get("round_records", []), start=1):
        for group in record.get("duplicates", []):
            for client, reward in sorted(group["unadjusted_rewards"].items()):
                writer.writerow([t, "copy-unadjusted", client, repr(reward)])
    return buffer.getvalue()


def reward_table(report: dict[str, Any], wall_s: float | None = None) -> str:
    """The table of mean rewards per strategy, sorted, as text."""
    from .fl.records import timing_note
    from .report import text_table  # here, not at the top: the simulate parser (--help) stays light

    strategies = report["strategies"]
    honest = strategies.get("honest", {}).get("mean_reward")
    order = sorted(strategies, key=lambda s: strategies[s]["mean_reward"], reverse=True)
    rows = []
    for rank, spec in enumerate(order, start=1):
        entry = strategies[spec]
        share = f"{100 * entry['mean_reward'] / honest:+.0f}%" if honest else "-"
        rows.append((str(rank), spec, f"{entry['mean_reward']:+.4f}", share,
                     f"{min(entry['per_round']):+.4f}", f"{max(entry['per_round']):+.4f}"))
    cat = report["categorical_world"]
    notes = [f"honest clients' own mean reward: {report['honest_clients']['mean_reward']:+.4f}; "
             f"categorical-world condition held in {sum(cat)}/{len(cat)} rounds"]
    for client, entry in report.get("fixed_attackers", {}).items():
        rounds = sum(v is not None for v in entry["per_round"])
        notes.append(f"fixed attacker {client} ({entry['spec']}): mean reward {entry['mean_reward']:+.4f} "
                     f"over the {rounds} rounds it was sampled")
    duplicates = report.get("duplicates", {})
    for client, rounds in duplicates.get("flagged", {}).items():
        notes.append(f"copies: {client} flagged in round(s) {', '.join(map(str, rounds))} "
                     f"(kfca.duplicates = {duplicates['policy']}; unadjusted rewards in report.json)")
    if timed := [t for t in report.get("timing", []) if t]:
        notes.append(timing_note(timed))
    if wall_s is not None:
        notes.append(f"wall time {wall_s:.1f} s")
    recipe, domain = report.get("recipe", report["domain"]), report["domain"]
    title = recipe if recipe == domain else f"{recipe} ({domain} data)"
    return text_table(f"KFCA-QP rewards: {title}, seed {report['seed']}, {report['rounds']} rounds",
                      ["rank", "strategy", "mean reward", "% of honest", "min", "max"], rows, notes, width=100)


def write_outputs(report: dict[str, Any], out: Path) -> None:
    from .plots import plot_delta, plot_rewards
    from .report import write_atomic, write_json

    write_json(out / "report.json", report)
    write_atomic(out / "rewards.csv", rewards_csv(report))
    plot_rewards([report], out / "rewards.png")
    plot_delta([report], out / "delta.png")


def run_one(recipe: Recipe, out: Path, *, resume: bool = False, cpu: bool = False, progress: bool = True,
            model_dir: Path | None = None, data_dir: Path | None = None,
            valuation: bool = False) -> dict[str, Any] | None:
    """Run one federation, write its outputs to ``out`` and print its table.

    Returns the report on the main process (None on the others of an ``accelerate launch``).
    """
    from .fl.rounds import FederationOptions, run_federation

    started = time.perf_counter()
    valuer = None
    if valuation:
        from .valuation.llm_rounds import RoundValuer

        valuer = RoundValuer(recipe, data_dir)
    options = FederationOptions(out_dir=out, resume=resume, cpu=cpu, progress=progress,
                                model_dir=model_dir, data_dir=data_dir, on_round=valuer)
    result = run_federation(recipe, options)
    from accelerate import PartialState

    if not PartialState().is_main_process:
        return None
    report = result.to_report()
    wall = time.perf_counter() - started
    report["wall_s"] = wall
    if valuer is not None:
        report["valuation"] = valuer.to_dict()
    write_outputs(report, out)
    print(reward_table(report, wall))
    if valuer is not None:
        print(valuer.table())
    saved = "adapters/, updates/" if recipe.train.save_client_updates else "adapters/"
    print(f"wrote {out}/report.json, rewards.csv, rewards.png, delta.png, {saved}")
    return report
