"""kfca-llm simulate: run a KFCA-FedAvg federation with the attack analysis (the main job).

Outputs (in --out, default runs/<recipe>-seed<seed>, or runs/<recipe>-<domain>-seed<seed> when --domain
changes the recipe's data; --set, --rounds and --attacks add a digest of themselves before -seed):
report.json, rewards.csv, rewards.png (attack-analysis figure), delta.png (delta matrices per round),
adapters/round-XXX (the global adapter in PEFT's format) and, with train.save-client-updates (on in the tiny
recipe), updates/round-XXX/{global,client-YYY} for kfca-llm score. --domain all runs the recipe on each
domain's synthetic data into <out>/<domain>/ and draws combined figures in <out>. --seeds 0,1,2 runs the seeds
one after another into <out>/seed<S>/ (default out: runs/<recipe>-seeds0-1-2) and writes <out>/summary.json
(kfca-llm check reads the folder).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from ..attacks import resolve_attacks
from ..errors import InputError
from ..plugins import load_plugins
from ..recipe import DOMAINS, SYNTHETIC_DATASET, Recipe, load_recipe


def parse_seeds(text: str) -> list[int]:
    """``0,1,2`` -> [0, 1, 2]: distinct non-negative integers, in the order given."""
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not parts or not all(p.isdigit() for p in parts):
        raise InputError(f"--seeds {text!r}: give distinct non-negative integers separated by commas, e.g. 0,1,2")
    seeds = [int(p) for p in parts]
    if len(set(seeds)) != len(seeds):
        raise InputError(f"--seeds {text!r} repeats a seed")
    return seeds


def recipe_overrides(args: argparse.Namespace) -> list[str]:
    """The recipe keys ``--set``, ``--rounds`` and ``--attacks`` change (the domain and the seed name the output
    folder on their own; these go into it as a digest: ``kfca_llm.simulate.default_out``)."""
    overrides = list(args.set or [])
    if args.rounds is not None:
        overrides.append(f"num-server-rounds={args.rounds}")
    if args.attacks is not None:
        specs = [s.strip() for s in args.attacks.split(",") if s.strip()]
        resolve_attacks(specs)  # our error lists the valid specs
        overrides.append("kfca.attacks=[" + ", ".join(f'"{s}"' for s in specs) + "]")
    return overrides


def build_recipe(args: argparse.Namespace, domain: str | None, seed: int | None = None) -> Recipe:
    load_plugins(args.plugins)  # before the specs and the recipe's attacks are resolved
    overrides = recipe_overrides(args)
    if domain is not None:
        overrides.append(f"domain={domain}")
    seed = getattr(args, "seed", None) if seed is None else seed
    if seed is not None:
        overrides.append(f"kfca.seed={seed}")
    recipe = load_recipe(args.recipe, overrides)
    if domain is not None and recipe.dataset.name != SYNTHETIC_DATASET:
        raise InputError(f"--domain needs a recipe on synthetic data; {recipe.name!r} reads {recipe.dataset.name!r} "
                         "(its domain is set in the recipe)")
    return recipe


def seed_recipes(args: argparse.Namespace) -> list[Recipe]:
    """One recipe per ``--seeds`` entry (the recipe's own seed when not given)."""
    if getattr(args, "seed", None) is not None and args.seeds is not None:
        raise InputError("give --seed or --seeds, not both")
    if args.domain == "all":
        raise InputError("--seeds runs one recipe on one domain; give --domain a single domain")
    if args.seeds is None:
        return [build_recipe(args, args.domain)]
    return [build_recipe(args, args.domain, seed) for seed in parse_seeds(args.seeds)]


def run_options(args: argparse.Namespace) -> dict:
    """run_one's keyword arguments from the shared run options."""
    return dict(resume=args.resume, cpu=args.cpu, progress=not args.no_progress, model_dir=args.model_dir,
                data_dir=args.data_dir, valuation=args.valuation)


def print_plans(args: argparse.Namespace, recipes: Sequence[Recipe]) -> None:
    """``--dry-run``: the plan of each run (one for several seeds: the plan does not depend on the seed)."""
    from ..plan import dry_run

    for recipe in recipes[:1] if args.seeds is not None else recipes:
        print(dry_run(recipe, model_dir=args.model_dir, data_dir=args.data_dir))


def require_sources(args: argparse.Namespace, recipe: Recipe) -> None:
    """A model or data set the run would download fails at once, in one line, when the hub is out of reach and
    the cache lacks it (before anything imports the hub client, which would retry for a minute)."""
    from ..hub import require_cached_sources
    from ..modeling import is_tiny

    models = [recipe.model.name] if args.model_dir is None and not is_tiny(recipe) else []
    datasets = [recipe.dataset.name] if args.data_dir is None and recipe.dataset.name != SYNTHETIC_DATASET else []
    require_cached_sources(models, datasets)


def run(args: argparse.Namespace) -> int:
    from ..simulate import default_out, default_seeds_out, run_one, run_seeds

    if args.seeds is not None:
        recipes = seed_recipes(args)
    else:
        domains: Sequence[str | None] = DOMAINS if args.domain == "all" else [args.domain]
        recipes = [build_recipe(args, d) for d in domains]
    if args.dry_run:
        print_plans(args, recipes)
        return 0
    require_sources(args, recipes[0])  # every recipe of the command reads the same model and data set
    options = run_options(args)
    if args.out:
        from ..report import check_output_dir

        check_output_dir(args.out)  # before the federation runs, not when its first file is written
    if args.seeds is not None:
        seeds = [r.kfca.seed for r in recipes]
        run_seeds(recipes, Path(args.out) if args.out else default_seeds_out(recipes[0], seeds, args.domain,
                                                                              recipe_overrides(args)), **options)
        return 0
    if args.domain == "all":
        out = Path(args.out) if args.out else default_out(recipes[0], "all", recipe_overrides(args))
        reports = [run_one(r, out / r.domain, **options) for r in recipes]
        if reports[0] is not None:
            from ..plots import plot_delta, plot_rewards

            plot_rewards(reports, out / "rewards.png")
            plot_delta(reports, out / "delta.png")
            print(f"wrote combined figures {out}/rewards.png, {out}/delta.png")
        return 0
    recipe = recipes[0]
    run_one(recipe, Path(args.out) if args.out else default_out(recipe, args.domain, recipe_overrides(args)), **options)
    return 0


def add_run_arguments(p: argparse.ArgumentParser) -> None:
    """The options of a federated run, shared by simulate and check (which runs simulate itself)."""
    p.add_argument("--recipe", default=None, help="recipe TOML file or shipped recipe name (default: tiny)")
    p.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="override a recipe key (FlowerTune names, e.g. train.learning-rate-max=1e-3); repeatable")
    p.add_argument("--domain", choices=(*DOMAINS, "all"), default=None,
                   help="the recipe's synthetic data in this domain's schema; 'all' runs the four")
    p.add_argument("--rounds", type=int, default=None, help="number of rounds (num-server-rounds)")
    p.add_argument("--attacks", default=None,
                   help="comma-separated attack specs, e.g. 'honest,flip,lagged:2,sparse:0.5'")
    p.add_argument("--seed", type=int, default=None, help="seed of everything (kfca.seed)")
    p.add_argument("--plugins", action="append", default=[], metavar="MODULE|FILE.py",
                   help="import this module or file first (it registers attacks with @register_attack); repeatable")
    p.add_argument("--seeds", default=None, metavar="S,S,...",
                   help="run these seeds one after another, each into <out>/seed<S>/, and write <out>/summary.json")
    p.add_argument("--resume", action="store_true", help="continue from the last saved round in --out")
    p.add_argument("--cpu", action="store_true", help="train on the CPU even where CUDA is present")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument("--valuation", action="store_true",
                   help="also value each round's clients by MR-SV and GTG-Shapley (v = -held-out loss) beside "
                        "KFCA-QP (report.json 'valuation'; synthetic data only)")
    p.add_argument("--dry-run", action="store_true",
                   help="print the run plan (adapter size, bytes per round, memory, formatted rows) and exit")
    p.add_argument("--model-dir", type=Path, default=None, help="local base model directory (no download)")
    p.add_argument("--data-dir", type=Path, default=None, help="local data set (datasets.save_to_disk)")


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "simulate", help="run a KFCA-FedAvg federation with the attack analysis (default: recipes/tiny.toml)",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_run_arguments(p)
    p.add_argument("--out", default=None,
                   help="output folder (default runs/<recipe>-seed<seed>, with --seeds runs/<recipe>-seeds<S-S-...>)")
    p.set_defaults(handler=run)
    return p
