"""kfca-llm simulate: run a KFCA-FedAvg federation with the attack analysis (the main job).

Outputs (in --out, default runs/<recipe>-seed<seed>, or runs/<recipe>-<domain>-seed<seed> when --domain
changes the recipe's data): report.json, rewards.csv, rewards.png (attack-analysis figure), delta.png
(delta matrices per round), adapters/round-XXX (the global adapter in PEFT's format) and, with
train.save-client-updates (on in the tiny recipe), updates/round-XXX/{global,client-YYY} for
kfca-llm score. --domain all runs the recipe on each domain's synthetic data into <out>/<domain>/ and
draws combined figures in <out>.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from ..attacks import resolve_attacks
from ..errors import InputError
from ..recipe import DOMAINS, SYNTHETIC_DATASET, Recipe, load_recipe


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
    recipe = load_recipe(args.recipe, overrides)
    if domain is not None and recipe.dataset.name != SYNTHETIC_DATASET:
        raise InputError(f"--domain needs a recipe on synthetic data; {recipe.name!r} reads {recipe.dataset.name!r} "
                         "(its domain is set in the recipe)")
    return recipe


def run(args: argparse.Namespace) -> int:
    from ..simulate import default_out, run_one

    domains: Sequence[str | None] = DOMAINS if args.domain == "all" else [args.domain]
    recipes = [build_recipe(args, d) for d in domains]
    if args.dry_run:
        from ..plan import dry_run

        for recipe in recipes:
            print(dry_run(recipe, model_dir=args.model_dir, data_dir=args.data_dir))
        return 0
    options = dict(resume=args.resume, cpu=args.cpu, progress=not args.no_progress, model_dir=args.model_dir,
                   data_dir=args.data_dir, valuation=args.valuation)
    if args.domain == "all":
        out = Path(args.out) if args.out else Path("runs") / f"{recipes[0].name}-all-seed{recipes[0].kfca.seed}"
        reports = [run_one(r, out / r.domain, **options) for r in recipes]
        if reports[0] is not None:
            from ..plots import plot_delta, plot_rewards

            plot_rewards(reports, out / "rewards.png")
            plot_delta(reports, out / "delta.png")
            print(f"wrote combined figures {out}/rewards.png, {out}/delta.png")
        return 0
    recipe = recipes[0]
    run_one(recipe, Path(args.out) if args.out else default_out(recipe, args.domain), **options)
    return 0


def add_parser(subparsers) -> argparse.ArgumentParser:
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
    p.set_defaults(handler=run)
    return p
