"""kfca-llm check: check a federation's rewards against expectations (the attack ordering, by default).

Reads report.json files, run folders, or the folder of a multi-seed run (summary.json); or, with --recipe
or --seeds and no report, runs kfca-llm simulate itself first (one run per seed, into --out). Prints one
row per expectation (the smallest gap measured on each seed, the margin, pass/fail) and, for each one
that failed, the seeds and rounds where it broke with the two values and the run's rewards.png.
Expectations: a TOML file (--expect; default: the paper's LLM attack ordering, shipped as paper-llm).
Exit status: 0 when every expectation holds, 1 when one fails, 2 for bad input or when an expectation cannot
be measured on these runs (two strategies that submit the same update in every round: run more rounds).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ..errors import InputError
from .simulate import (add_run_arguments, print_plans, recipe_overrides, require_sources, run_options,
                       seed_recipes)


def run(args: argparse.Namespace) -> int:
    from ..check import check_runs, require_strategies
    from ..check_reports import load_runs
    from ..expectations import load_expectations
    from ..report import check_output_dir, check_output_path, write_atomic

    expectations = load_expectations(args.expect)  # bad files fail before a long run
    if args.junit:
        check_output_path(args.junit)
    if args.out and not args.dry_run:
        check_output_dir(args.out)
    runs_itself = args.recipe is not None or args.seeds is not None or args.seed is not None
    if args.reports and runs_itself:
        raise InputError("give report files or --recipe/--seeds (to run simulate), not both")
    if args.dry_run and not runs_itself:
        raise InputError("--dry-run plans the runs check would make: give --recipe or --seeds")
    if args.reports:
        paths = args.reports
    elif runs_itself:
        from ..simulate import default_seeds_out, run_seeds

        recipes = seed_recipes(args)
        require_strategies(expectations, recipes[0].kfca.attacks, f"recipe {recipes[0].name!r}")
        if args.dry_run:
            print_plans(args, recipes)
            return 0
        require_sources(args, recipes[0])
        seeds = [r.kfca.seed for r in recipes]
        out = Path(args.out) if args.out else default_seeds_out(recipes[0], seeds, args.domain,
                                                                    recipe_overrides(args))
        if run_seeds(recipes, out, **run_options(args)) is None:
            return 0  # another process of an accelerate launch: the main one checks
        paths = [out]
    else:
        raise InputError("nothing to check: give report.json files or run folders, or --recipe and --seeds")
    result = check_runs(expectations, load_runs(paths))
    print(result.table())
    if args.junit:
        write_atomic(args.junit, result.junit_xml())
        print(f"wrote {args.junit}")
    return 0 if result.passed else 1 if result.failed else 2


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("check", help="check rewards against expectations (exit 1 when one fails)",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("reports", nargs="*", metavar="REPORT",
                   help="report.json files, run folders, or a multi-seed run's folder (summary.json)")
    p.add_argument("--expect", default=None, metavar="FILE|NAME",
                   help="expectations TOML file or shipped name (default: paper-llm, the paper's LLM attack ordering)")
    p.add_argument("--junit", default=None, metavar="FILE", help="also write JUnit XML (one test case per expectation)")
    p.add_argument("--out", default=None,
                   help="with --recipe/--seeds: the runs' folder (default runs/<recipe>-seeds<S-S-...>)")
    add_run_arguments(p)
    p.set_defaults(handler=run)
    return p
