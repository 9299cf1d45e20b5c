"""kfca-llm simulate: run a KFCA-FedAvg federation with the attack analysis and write its outputs.

Outputs (in --out, default runs/<recipe>-seed<seed>, or runs/<recipe>-<domain>-seed<seed> when --domain
changes the recipe's data): report.json, rewards.csv, rewards.png (attack-analysis figure), delta.png
(delta matrices per round), adapters/round-XXX (the global adapter in PEFT's format) and, with
train.save-client-updates (on in the tiny recipe), updates/round-XXX/{global,client-YYY} for
kfca-llm score. --domain all runs the recipe on each domain's synthetic data into <out>/<domain>/ and
draws combined figures in <out>.
"""

from __future__ import annotations

import argparse
import csv
import io
import time
from collections.abc import Sequence
from importlib.resources import files
from pathlib import Path
from typing import Any

from .attacks import resolve_attacks
from .errors import InputError
from .recipe import DOMAINS, SYNTHETIC_DATASET, Recipe, load_recipe

# recipes/ is installed as the data package kfca_llm.recipes (pyproject), so this works outside a checkout too.
RECIPES_DIR = Path(str(files("kfca_llm.recipes")))
DEFAULT_RECIPE = RECIPES_DIR / "tiny.toml"


def resolve_recipe_path(name: str | None) -> Path:
    """A recipe file, or the name of one shipped in ``recipes/`` (``tiny``, ``general-nlp``, ...)."""
    if name is None:
        return DEFAULT_RECIPE
    path = Path(name)
    if path.is_file():
        return path
    shipped = RECIPES_DIR / f"{name}.toml"
    if shipped.is_file():
        return shipped
    known = sorted(p.stem for p in RECIPES_DIR.glob("*.toml"))
    raise InputError(f"no recipe file {name!r} (shipped recipes: {', '.join(known) or 'none'})")


def build_recipe(args: argparse.Namespace, domain: str | None) -> Recipe:
    overrides = list(args.set or [])
    if domain is not None:
        overrides.append(f"domain={domain}")
    if args.rounds is not None:
        overrides.append(f"num-server-rounds={args.rounds}")
    if args.seed is not None:
        overrides.append(f"kfca.seed={args.seed}")
    if args.attacks is not None:
        specs = [s.strip() for s in args.attacks.split(",") if s.strip()]
        resolve_attacks(specs)  # our error lists the valid specs
        overrides.append("kfca.attacks=[" + ", ".join(f'"{s}"' for s in specs) + "]")
    recipe = load_recipe(resolve_recipe_path(args.recipe), overrides)
    if domain is not None and recipe.dataset.name != SYNTHETIC_DATASET:
        raise InputError(f"--domain needs a recipe on synthetic data; {recipe.name!r} reads {recipe.dataset.name!r} "
                         "(its domain is set in the recipe)")
    return recipe


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


def _run_one(recipe: Recipe, out: Path, args: argparse.Namespace) -> dict[str, Any] | None:
    """Run one federation; returns its report on the main process (None on the others)."""
    from .fl.rounds import FederationOptions, run_federation

    started = time.perf_counter()
    valuer = None
    if getattr(args, "valuation", False):
        from .valuation.llm_rounds import RoundValuer

        valuer = RoundValuer(recipe, args.data_dir)
    options = FederationOptions(out_dir=out, resume=args.resume, cpu=args.cpu, progress=not args.no_progress,
                                model_dir=args.model_dir, data_dir=args.data_dir, on_round=valuer)
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


def run_simulate(args: argparse.Namespace) -> int:
    domains: Sequence[str | None] = DOMAINS if args.domain == "all" else [args.domain]
    recipes = [build_recipe(args, d) for d in domains]
    if args.dry_run:
        from .plan import dry_run

        for recipe in recipes:
            print(dry_run(recipe, model_dir=args.model_dir, data_dir=args.data_dir))
        return 0
    if args.domain == "all":
        out = Path(args.out) if args.out else Path("runs") / f"{recipes[0].name}-all-seed{recipes[0].kfca.seed}"
        reports = [_run_one(r, out / r.domain, args) for r in recipes]
        if reports[0] is not None:
            from .plots import plot_delta, plot_rewards

            plot_rewards(reports, out / "rewards.png")
            plot_delta(reports, out / "delta.png")
            print(f"wrote combined figures {out}/rewards.png, {out}/delta.png")
        return 0
    recipe = recipes[0]
    _run_one(recipe, Path(args.out) if args.out else default_out(recipe, args.domain), args)
    return 0


def add_simulate_parser(subparsers) -> argparse.ArgumentParser:
    """Add the ``simulate`` subcommand to a ``kfca-llm`` subparsers object."""
    p = subparsers.add_parser(
        "simulate", help="run a KFCA-FedAvg federation with the attack analysis (default: recipes/tiny.toml)",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--recipe", default=None, help="recipe TOML file or shipped recipe name (default: tiny)")
    p.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="override a recipe key (FlowerTune names, e.g. train.learning-rate-max=1e-3); repeatable")
    p.add_argument("--domain", choices=(*DOMAINS, "all"), default=None,
                   help="the recipe's synthetic data in this domain's schema; 'all' runs the four")
    p.add_argument("--rounds", type=int, default=None, help="number of rounds (num-server-rounds)")
    p.add_argument("--attacks", default=None,
                   help="comma-separated attack specs, e.g. 'honest,flip,lagged:2,sparse:0.5'")
    p.add_argument("--seed", type=int, default=None, help="seed of everything (kfca.seed)")
    p.add_argument("--out", default=None, help="output folder (default runs/<recipe>-seed<seed>)")
    p.add_argument("--resume", action="store_true", help="continue from the last saved round in --out")
    p.add_argument("--cpu", action="store_true", help="train on the CPU even where CUDA is present")
    p.add_argument("--dry-run", action="store_true", help="print the run plan (memory, time, tasks) and exit")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument("--valuation", action="store_true",
                   help="also value each round's clients by MR-SV and GTG-Shapley (v = -held-out loss) beside "
                        "KFCA-QP (report.json 'valuation'; synthetic data only)")
    p.add_argument("--model-dir", type=Path, default=None, help="local base model directory (no download)")
    p.add_argument("--data-dir", type=Path, default=None, help="local data set (datasets.save_to_disk)")
    p.set_defaults(handler=run_simulate)
    return p
