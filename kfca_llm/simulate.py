"""One KFCA-FedAvg federation with the attack analysis, and its outputs (the work of ``kfca-llm simulate``).

``run_one`` writes report.json, rewards.csv, rewards.png, delta.png and heldout.png (the global adapter's
held-out loss and exact-answer accuracy per round, where the data set has held-out rows); ``reward_table`` is the table it prints.
``run_seeds`` runs one recipe under several seeds, one after another, each into ``seed<S>/``, and writes
their ``summary.json``.
"""

from __future__ import annotations

import csv
import hashlib
import io
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .recipe import Recipe

SUMMARY = "summary.json"


def default_out(recipe: Recipe, domain: str | None = None, overrides: Sequence[str] = ()) -> Path:
    """``runs/<recipe>-seed<seed>``, or ``runs/<recipe>-<domain>-seed<seed>`` when ``--domain`` chose the data;
    ``overrides`` (the command line's other recipe changes) add a digest of themselves before ``-seed``, so a run
    with other settings never writes into the recipe's own run (20 clients' few-peers run once replaced the demo's)."""
    name = recipe.name if domain in (None, recipe.name) else f"{recipe.name}-{domain}"
    if overrides:
        name += "-" + hashlib.sha256("\n".join(overrides).encode()).hexdigest()[:8]
    return Path("runs") / f"{name}-seed{recipe.kfca.seed}"


def default_seeds_out(recipe: Recipe, seeds: Sequence[int], domain: str | None = None,
                      overrides: Sequence[str] = ()) -> Path:
    """``runs/<recipe>-seeds0-1-2`` (with the domain and the overrides' digest as in ``default_out``)."""
    name = default_out(recipe, domain, overrides).name.rpartition("-seed")[0]
    return Path("runs") / f"{name}-seeds{'-'.join(map(str, seeds))}"


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
        charged = {r["round"]: r["charged_back"][client] for r in report.get("round_records", [])
                   if client in r.get("charged_back", {})}
        notes.append(f"fixed attacker {client} ({entry['spec']}): mean reward {entry['mean_reward']:+.4f} "
                     f"over the {rounds} rounds it was sampled" + (
                         f"; resubmitted its own update in round(s) {', '.join(map(str, charged))}: paid at most 0, "
                         f"{sum(charged.values()):.4f} charged back" if charged else ""))
    if undetermined := report.get("undetermined_rounds"):
        kfca = report.get("config", {}).get("kfca", {})
        settled = {(s["round"], s["participant"]) for r in report.get("round_records", []) for s in r.get("settlements", [])}
        unsettled = sorted({r["round"] for r in report.get("round_records", [])
                            for c in r.get("undetermined", []) if (r["round"], c) not in settled})
        notes.append(f"undetermined: {len(undetermined)}/{report['rounds']} round(s) paid a client with fewer than "
                     f"kfca.min-peers = {kfca.get('min-peers', '?')} distinct peers (first: round {undetermined[0]}); "
                     f"settled later (by the run's last round at the latest): {len(undetermined) - len(unsettled)}, "
                     f"never paid: {len(unsettled)} (raise strategy.fraction-train or kfca.pool-window, or run more "
                     "rounds)")
    duplicates = report.get("duplicates", {})
    for client, rounds in duplicates.get("flagged", {}).items():
        notes.append(f"copies: {client} flagged in round(s) {', '.join(map(str, rounds))} "
                     f"(kfca.duplicates = {duplicates['policy']}; unadjusted rewards in report.json)")
    if report.get("heldout"):
        notes.append(heldout_note(report))
    if timed := [t for t in report.get("timing", []) if t]:
        notes.append(timing_note(timed))
    if wall_s is not None:
        notes.append(f"wall time {wall_s:.1f} s")
    recipe, domain = report.get("recipe", report["domain"]), report["domain"]
    title = recipe if recipe == domain else f"{recipe} ({domain} data)"
    return text_table(f"KFCA-QP rewards: {title}, seed {report['seed']}, {report['rounds']} rounds",
                      ["rank", "strategy", "mean reward", "% of honest", "min", "max"], rows, notes, width=100)


def heldout_note(report: dict[str, Any]) -> str:
    """One line: the global adapter on the held-out rows after the first and the last round."""
    heldout = report["heldout"]
    first, last = 0, len(heldout["loss"]) - 1
    return (f"global adapter on {heldout['rows']} held-out rows (kfca.aggregate = "
            f"{report['config']['kfca']['aggregate']}): loss {heldout['loss'][first]:.4f} after round 1, "
            f"{heldout['loss'][last]:.4f} after round {last + 1}; exact answers {100 * heldout['accuracy'][first]:.1f}% "
            f"-> {100 * heldout['accuracy'][last]:.1f}%")


def write_outputs(report: dict[str, Any], out: Path) -> None:
    from .plots import plot_delta, plot_heldout, plot_rewards
    from .report import write_atomic, write_json

    write_json(out / "report.json", report)
    write_atomic(out / "rewards.csv", rewards_csv(report))
    plot_rewards([report], out / "rewards.png")
    plot_delta([report], out / "delta.png")
    if report.get("heldout"):
        plot_heldout(report, out / "heldout.png")


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
    figures = "rewards.png, delta.png" + (", heldout.png" if report.get("heldout") else "")
    print(f"wrote {out}/report.json, rewards.csv, {figures}, {saved}")
    return report


def seeds_summary(reports: Sequence[dict[str, Any]], report_paths: Sequence[str]) -> dict[str, Any]:
    """What several seeds' runs of one recipe earned: per strategy the mean reward of each seed, their mean,
    min and max; per seed the report (path relative to the summary) and the categorical-world rounds."""
    seeds = [r["seed"] for r in reports]
    strategies = {}
    for spec in reports[0]["strategies"]:
        per_seed = [r["strategies"][spec]["mean_reward"] for r in reports]
        strategies[spec] = {"mean_reward": sum(per_seed) / len(per_seed), "min": min(per_seed), "max": max(per_seed),
                            "per_seed": dict(zip(map(str, seeds), per_seed))}
    return {"recipe": reports[0].get("recipe"), "domain": reports[0]["domain"], "seeds": seeds,
            "rounds": reports[0]["rounds"], "runs": dict(zip(map(str, seeds), report_paths)),
            "strategies": strategies,
            "categorical_world_rounds": {str(r["seed"]): sum(r["categorical_world"]) for r in reports},
            "wall_s": {str(r["seed"]): r.get("wall_s") for r in reports}}


def seeds_table(summary: dict[str, Any]) -> str:
    """Mean reward per strategy (rows, sorted by the mean over seeds) and seed (columns)."""
    from .report import text_table

    strategies = summary["strategies"]
    order = sorted(strategies, key=lambda s: strategies[s]["mean_reward"], reverse=True)
    seeds = [str(s) for s in summary["seeds"]]
    rows = [(str(rank), spec, *(f"{strategies[spec]['per_seed'][s]:+.4f}" for s in seeds),
             f"{strategies[spec]['mean_reward']:+.4f}") for rank, spec in enumerate(order, start=1)]
    cat = summary["categorical_world_rounds"]
    notes = ["categorical-world condition held in " + ", ".join(f"{cat[s]}/{summary['rounds']} rounds (seed {s})"
                                                               for s in seeds)]
    return text_table(f"KFCA-QP mean rewards: {summary['recipe']}, {len(seeds)} seeds, {summary['rounds']} rounds",
                      ["rank", "strategy", *(f"seed {s}" for s in seeds), "mean"], rows, notes, width=100)


def run_seeds(recipes: Sequence[Recipe], out: Path, **options: Any) -> list[dict[str, Any]] | None:
    """Run one recipe under several seeds (``recipes``: one per seed), one after another, into
    ``out/seed<S>/``, then write ``out/summary.json`` and print the seeds' table.

    One after another, in this process: a run already uses every core (torch, numba) or its GPU, and the
    process's imports and compiled kernels serve every seed. Seeds in parallel are a CI matrix's job
    (``kfca-llm check`` reads the reports of separate jobs). Returns the reports on the main process
    (None on the others of an ``accelerate launch``).
    """
    from .report import write_json

    reports = [run_one(r, out / f"seed{r.kfca.seed}", **options) for r in recipes]
    if reports[0] is None:
        return None
    summary = seeds_summary(reports, [f"seed{r['seed']}/report.json" for r in reports])
    write_json(out / SUMMARY, summary)
    print(seeds_table(summary))
    print(f"wrote {out}/{SUMMARY} (reports in {out}/seed<S>/)")
    return reports
