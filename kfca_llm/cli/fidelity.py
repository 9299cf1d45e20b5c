"""``kfca-llm fidelity``: reward fidelity of KFCA, CA and Shapley estimators against the exact Shapley value,
the non-IID sweep of the categorical-world condition and the disjoint-classes case where KFCA must fail."""

from __future__ import annotations

import argparse

from ..errors import InputError

SWEEPS = ("noniid", "noniid-llm")  # --case values that run the non-IID sweep instead of the comparison
DEFAULT_CLIENTS = {"fidelity": 10, "noniid": 5, "noniid-llm": 5}
DEFAULT_ROUNDS = {"fidelity": 10, "noniid": 10, "noniid-llm": 5}


def _sweep(args: argparse.Namespace) -> int:
    from ..report import check_output_dir
    from ..valuation.noniid import NonIIDConfig, noniid_table, run_noniid

    check_output_dir(args.out)
    clients = args.clients or DEFAULT_CLIENTS[args.case]
    rounds = args.rounds or DEFAULT_ROUNDS[args.case]
    if not 2 <= clients <= 10 or rounds < 1:
        raise InputError(f"the sweep needs 2-10 clients and a positive number of rounds, got {clients}, {rounds}")
    cfg = NonIIDConfig(clients=clients, rounds=rounds, seed=args.seed, data=args.data, max_examples=args.max_examples,
                       threads=args.threads, public_steps=args.public_steps, public_buckets=args.public_buckets)
    stem = args.case.replace("-", "_")
    if args.case == "noniid-llm":
        from ..valuation.topic_task import llm_task

        result = run_noniid(cfg, args.out, task=llm_task(cfg), stem=stem)
    else:
        result = run_noniid(cfg, args.out, stem=stem)
    print(noniid_table(result))
    print(f"total wall time {result['wall_seconds']:.1f} s; wrote {args.out}/{stem}.json, {stem}.png")
    return 0


def auto_jobs(cases: int) -> int:
    """One process per case, as many as this process may run on at once (the cases are independent)."""
    import os

    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(cases, cpus))


def run(args: argparse.Namespace) -> int:
    from ..valuation.cases import CASES
    from ..valuation.fidelity import FidelityConfig, run_fidelity, tables

    if args.case in SWEEPS:
        return _sweep(args)
    from ..report import check_output_dir

    check_output_dir(args.out)  # before minutes of retraining
    cases = CASES if args.case == "all" else tuple(c.strip() for c in args.case.split(","))
    bad = [c for c in cases if c not in CASES]
    if bad:
        raise InputError(f"unknown case(s) {bad}; choose from {', '.join(CASES)}, all, {' or '.join(SWEEPS)}")
    clients = args.clients or DEFAULT_CLIENTS["fidelity"]
    rounds = args.rounds or DEFAULT_ROUNDS["fidelity"]
    if not 2 <= clients <= 16:
        raise InputError(f"--clients must be in [2, 16] (exact SV retrains 2^n - 1 coalitions), got {clients}")
    if rounds < 1 or args.threads < 1 or args.jobs < 0:
        raise InputError("--rounds and --threads must be positive, --jobs positive or 0 (auto)")
    cfg = FidelityConfig(cases=cases, clients=clients, rounds=rounds, seed=args.seed,
                         methods=tuple(m.strip() for m in args.methods.split(",") if m.strip()), data=args.data,
                         max_examples=args.max_examples, protocol=args.protocol, threads=args.threads,
                         jobs=args.jobs or auto_jobs(len(cases)), public_steps=args.public_steps,
                         public_buckets=args.public_buckets)
    result = run_fidelity(cfg, args.out)
    print(tables(result))
    print(f"total wall time {result['wall_seconds']:.1f} s; wrote {args.out}/fidelity.json, fidelity.csv, "
          "fidelity_distance_vs_time.png, fidelity_variance.png, fidelity_rewards.png")
    return 0


def add_parser(sub) -> None:
    from ..valuation.cases import CASES
    from ..valuation.fidelity import DEFAULT_METHODS

    p = sub.add_parser("fidelity", help="reward fidelity: KFCA, CA and Shapley estimators against exact Shapley",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--case", default="all",
                   help=f"one of {', '.join(CASES)}, or all (default); noniid: the Dirichlet sweep and the "
                        "disjoint-classes case on the digits CNN; noniid-llm: the same on the tiny LLM")
    p.add_argument("--clients", type=int, default=None,
                   help="number of clients (default 10; 5 for the sweeps; exact SV is 2^n)")
    p.add_argument("--rounds", type=int, default=None, help="FedAvg rounds (default 10; 5 for noniid-llm)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--methods", default=",".join(DEFAULT_METHODS),
                   help="comma-separated methods besides exact SV (default: all)")
    p.add_argument("--data", default=None,
                   help="local image set: raw MNIST IDX files (gzip or not) or a datasets.save_to_disk folder "
                        "(default: scikit-learn's bundled 8x8 digits)")
    p.add_argument("--max-examples", type=int, default=None, help="use only the first N images of --data")
    p.add_argument("--protocol", default="auto", choices=("auto", "silos", "split"),
                   help="clients' data: silos = the paper's MNIST protocol (pairs from 5 silos, 10,840 images each "
                        "where the silo allows), split = dealt from the pool; auto (default): silos for 28x28 images")
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads (default 1: the many small stacked matmuls gain little from more)")
    p.add_argument("--jobs", type=int, default=0,
                   help="cases run in this many processes at once (default 0: one per available CPU, at most one "
                        "per case; results are bit-identical for any value)")
    p.add_argument("--public-steps", type=int, default=5,  # PublicConditioning's (engine.public imports torch)
                   help="KFCA-QP conditions on the global's change over the last 1, 2, 4, ... rounds: this many sign "
                        "planes (default 5; 0: off, the unconditioned rewards)")
    p.add_argument("--public-buckets", type=int, default=2,
                   help="magnitude buckets of the global's newest step (a power of two; default 2)")
    p.add_argument("--out", default="runs/fidelity", help="output folder (default runs/fidelity)")
    p.set_defaults(handler=run)
