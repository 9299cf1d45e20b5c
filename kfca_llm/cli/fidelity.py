"""``kfca-llm fidelity``: reward fidelity of KFCA, CA and Shapley estimators against the exact Shapley value."""

from __future__ import annotations

import argparse

from ..errors import InputError


def run(args: argparse.Namespace) -> int:
    from ..valuation.cases import CASES
    from ..valuation.fidelity import FidelityConfig, run_fidelity, tables

    cases = CASES if args.case == "all" else tuple(c.strip() for c in args.case.split(","))
    bad = [c for c in cases if c not in CASES]
    if bad:
        raise InputError(f"unknown case(s) {bad}; choose from {', '.join(CASES)} or all")
    if not 2 <= args.clients <= 16:
        raise InputError(f"--clients must be in [2, 16] (exact SV retrains 2^n - 1 coalitions), got {args.clients}")
    if args.rounds < 1 or args.threads < 1 or args.jobs < 1:
        raise InputError("--rounds, --threads and --jobs must be positive")
    cfg = FidelityConfig(cases=cases, clients=args.clients, rounds=args.rounds, seed=args.seed,
                         methods=tuple(m.strip() for m in args.methods.split(",") if m.strip()), data=args.data,
                         max_examples=args.max_examples, threads=args.threads, jobs=args.jobs)
    result = run_fidelity(cfg, args.out)
    print(tables(result))
    print(f"total wall time {result['wall_seconds']:.1f} s; wrote {args.out}/fidelity.json, fidelity.csv, "
          "fidelity_distance_vs_time.png, fidelity_variance.png, fidelity_rewards.png")
    return 0


def add_parser(sub) -> None:
    from ..valuation.cases import CASES
    from ..valuation.fidelity import DEFAULT_METHODS
    from ..valuation.fidelity import __doc__ as description

    p = sub.add_parser("fidelity", help="reward fidelity: KFCA, CA and Shapley estimators against exact Shapley",
                       description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--case", default="all", help=f"one of {', '.join(CASES)}, or all (default)")
    p.add_argument("--clients", type=int, default=10, help="number of clients (default 10; exact SV is 2^n)")
    p.add_argument("--rounds", type=int, default=10, help="FedAvg rounds (default 10)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--methods", default=",".join(DEFAULT_METHODS),
                   help="comma-separated methods besides exact SV (default: all)")
    p.add_argument("--data", default=None,
                   help="local image set: raw MNIST IDX files or a datasets.save_to_disk folder "
                        "(default: scikit-learn's bundled 8x8 digits)")
    p.add_argument("--max-examples", type=int, default=None, help="use only the first N images of --data")
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads (default 1: the many small stacked matmuls gain little from more)")
    p.add_argument("--jobs", type=int, default=1,
                   help="cases run in this many processes at once (default 1; 2 halves the wall time on 2 free cores)")
    p.add_argument("--out", default="runs/fidelity", help="output folder (default runs/fidelity)")
    p.set_defaults(handler=run)
