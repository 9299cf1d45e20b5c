"""The reward-fidelity experiment (``kfca-llm fidelity``): every method against the exact Shapley value.

For each case the clients run FedAvg once (the recorded federation); every method then values the
clients from that record (exact SV and TMC-Shapley retrain coalitions from the same initialisation
and seeds). Rewards are normalised to ``q_i / sum q`` and compared with the normalised exact SV by the
paper's three distances, plus Spearman rank correlation; ``uniform`` (q_i = 1/n) is the floor a
method must beat to be informative. KFCA-QP (and MC KFCA-QP) condition each round's payment on the global's
steps before it, the public trajectory the server knows (``engine.public``; ``public_steps`` 0: off).
"""

from __future__ import annotations

import csv
import io
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import InputError
from ..report import text_table, write_atomic, write_json
from .metrics import distances, normalise, spearman

DEFAULT_METHODS = ("mr", "gtg-shapley", "tmc-shapley", "group-testing", "fed-sv", "tmr", "ca-qp", "ca-d", "kfca-qp",
                   "kfca-d", "mc-kfca-qp", "uniform")
REFERENCE = "exact-sv"


@dataclass(frozen=True)
class FidelityConfig:
    cases: tuple[str, ...] = ("iid", "label_skew", "size_skew", "label_noise", "feature_noise")
    clients: int = 10
    rounds: int = 10
    seed: int = 0
    methods: tuple[str, ...] = DEFAULT_METHODS
    data: str | None = None
    max_examples: int | None = None
    protocol: str = "auto"
    """client data: "silos" (the paper's MNIST protocol), "split" (dealt from the pool) or "auto": silos for
    28x28 images, split otherwise (the bundled digits are too few for 10,840-image clients)."""
    threads: int = 1
    jobs: int = 1
    """cases run in this many worker processes at once (each with ``threads`` torch threads)."""
    public_steps: int = 5
    public_buckets: int = 2
    """KFCA-QP's ``PublicConditioning`` on the recorded globals (the engine's default; steps 0: off, the unconditioned
    rewards bit for bit). Plain ints: this module stays torch-free until a case runs."""


def resolve_protocol(protocol: str, images) -> str:
    from .cases import PROTOCOLS

    if protocol == "auto":
        return "silos" if tuple(images.train_x.shape[1:]) == (28, 28) else "split"
    if protocol not in PROTOCOLS:
        raise InputError(f"unknown protocol {protocol!r}; choose from auto, {', '.join(PROTOCOLS)}")
    return protocol


def record_case(case: str, cfg: FidelityConfig, images):
    """Federate once for ``case``: the recorded run every method values (a ``ValuationProblem``) and the
    federation's seconds."""
    import torch

    from .cases import make_clients
    from ..engine.public import PublicConditioning
    from .cnn_federation import FederationConfig, model_for, run_federation
    from .methods import ValuationProblem

    fed_cfg = FederationConfig(rounds=cfg.rounds, seed=cfg.seed)
    protocol = resolve_protocol(cfg.protocol, images)
    clients = make_clients(images, case, cfg.clients, cfg.seed, protocol)
    model = model_for(images.train_x.shape[1:], images.num_classes, fed_cfg.channels)
    init = model.init(cfg.seed)
    start = time.perf_counter()
    record = run_federation(model, clients, init, fed_cfg)
    federation_s = time.perf_counter() - start
    problem = ValuationProblem(model, clients, init, fed_cfg, record,
                               model.patches(torch.from_numpy(images.test_x[:, None])), torch.from_numpy(images.test_y),
                               PublicConditioning(cfg.public_steps, cfg.public_buckets))
    return problem, federation_s


def run_case(case: str, cfg: FidelityConfig, images, log=print) -> dict:
    """Federate once for ``case``, value the clients by every method, compare with exact SV."""
    from .methods import METHODS

    problem, federation_s = record_case(case, cfg, images)
    clients, model = problem.clients, problem.model
    results = {}
    for key in (REFERENCE, *[m for m in cfg.methods if m != REFERENCE]):
        name, method = METHODS[key]
        start = time.perf_counter()
        result = method(problem)
        seconds = time.perf_counter() - start
        results[key] = (name, result, seconds)
        log(f"  {case:<13} {name:<13} {seconds:8.2f} s")
    exact = results[REFERENCE][1]
    exact_q, _ = normalise(exact.rewards)
    methods = {}
    for key, (name, result, seconds) in results.items():
        q, how = normalise(result.rewards)
        methods[key] = {
            "name": name, "raw": result.rewards.tolist(), "normalised": q.tolist(), "normalisation": how,
            "distance": distances(exact_q, q), "spearman": spearman(exact_q, q), "variance": float(np.var(q)),
            "seconds": seconds, "coalitions": result.coalitions, **({"extra": result.extra} if result.extra else {}),
        }
    return {
        "clients": [int(c.y.numel()) for c in clients], "protocol": resolve_protocol(cfg.protocol, images),
        "parameters": model.num_parameters,
        "federation_seconds": federation_s,
        "exact_sv": {"values": exact.rewards.tolist(), **exact.extra}, "methods": methods,
    }


def summary_rows(result: dict) -> list[dict]:
    """One row per method: mean distances, Spearman and time over the cases (ranked by mean cosine)."""
    cases = result["cases"]
    keys = list(next(iter(cases.values()))["methods"])
    exact_time = np.mean([c["methods"][REFERENCE]["seconds"] for c in cases.values()])
    rows = []
    for key in keys:
        per = [c["methods"][key] for c in cases.values()]
        rho = [m["spearman"] for m in per if m["spearman"] is not None]
        seconds = float(np.mean([m["seconds"] for m in per]))
        rows.append({
            "method": key, "name": per[0]["name"],
            **{d: float(np.mean([m["distance"][d] for m in per])) for d in ("cosine", "euclidean", "max_diff")},
            "spearman": float(np.mean(rho)) if rho else None, "seconds": seconds,
            "time_vs_exact": seconds / exact_time if exact_time > 0 else None,
        })
    return sorted(rows, key=lambda r: r["cosine"])


def _csv(result: dict) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["case", "method", "cosine", "euclidean", "max_diff", "spearman", "variance", "seconds",
                     "coalitions", "normalised_rewards"])
    for case, data in result["cases"].items():
        for key, m in data["methods"].items():
            writer.writerow([case, key, f"{m['distance']['cosine']:.6g}", f"{m['distance']['euclidean']:.6g}",
                             f"{m['distance']['max_diff']:.6g}", "" if m["spearman"] is None else f"{m['spearman']:.4f}",
                             f"{m['variance']:.6g}", f"{m['seconds']:.4f}",
                             "" if m["coalitions"] is None else m["coalitions"],
                             " ".join(f"{v:.5f}" for v in m["normalised"])])
    return buffer.getvalue()


def tables(result: dict) -> str:
    """The printed summary: methods ranked by mean cosine distance, then KFCA-QP vs uniform per case."""
    fmt = lambda v, spec: "-" if v is None else format(v, spec)  # noqa: E731
    rows = [[str(rank), r["name"], fmt(r["cosine"], ".4f"), fmt(r["euclidean"], ".4f"), fmt(r["max_diff"], ".4f"),
             fmt(r["spearman"], "+.2f"), fmt(r["seconds"], ".3f"), fmt(r["time_vs_exact"], ".2g")]
            for rank, r in enumerate(summary_rows(result), 1)]
    out = text_table("distance to exact SV, mean over cases (ranked by cosine distance)",
                     ["#", "method", "1 - cos", "euclid", "max diff", "spearman", "seconds", "x exact"], rows,
                     notes=["seconds: mean per case on the same clock, the federation itself excluded; "
                            "x exact: time / exact SV's time"])
    per_case = []
    for case, data in result["cases"].items():
        m = data["methods"]
        cells = [case]
        for key in ("kfca-qp", "kfca-d", "ca-qp", "ca-d", "uniform"):
            cells.append(fmt(m[key]["distance"]["cosine"], ".4f") if key in m else "-")
        cells.append(fmt(m["kfca-qp"]["spearman"], "+.2f") if "kfca-qp" in m else "-")
        per_case.append(cells)
    out += "\n" + text_table("1 - cos to exact SV per case",
                             ["case", "KFCA-QP", "KFCA-D", "CA-QP", "CA-D", "uniform", "KFCA-QP spearman"], per_case)
    return out


def _warm_up() -> None:
    """Compile / load the engine's numba kernels once, so no method's time includes JIT compilation."""
    from ..api import FLAT_UPDATE_NAME, score_labels, score_updates

    rng = np.random.default_rng(0)
    updates = {"a": rng.normal(size=64).astype(np.float32), "b": rng.normal(size=64).astype(np.float32)}
    score_updates(updates)
    score_updates(updates, public=[{FLAT_UPDATE_NAME: rng.normal(size=64)}])  # the conditioned path's kernels
    score_labels({"a": rng.integers(0, 3, 64), "b": rng.integers(0, 3, 64)}, num_labels=3)


def _case_in_worker(case: str, cfg: FidelityConfig, images) -> dict:
    import torch

    torch.set_num_threads(cfg.threads)
    _warm_up()
    return run_case(case, cfg, images, print)


def run_fidelity(cfg: FidelityConfig, out: str | Path, log=print) -> dict:
    """Run every case, write ``fidelity.json``, ``fidelity.csv`` and the figures to ``out``."""
    import torch

    from ..engine.public import PublicConditioning
    from .methods import METHODS

    PublicConditioning(cfg.public_steps, cfg.public_buckets)  # its checks, before minutes of retraining
    unknown = [m for m in cfg.methods if m not in METHODS]
    if unknown:
        raise InputError(f"unknown method(s) {unknown}; choose from {', '.join(METHODS)}")
    threads_before = torch.get_num_threads()
    torch.set_num_threads(cfg.threads)
    try:
        return _run(cfg, out, log)
    finally:
        torch.set_num_threads(threads_before)


def _run(cfg: FidelityConfig, out: str | Path, log) -> dict:
    from .cases import load_images
    from .figures import plot_distance_vs_time, plot_rewards, plot_variance

    wall = time.perf_counter()
    _warm_up()
    images = load_images(cfg.data, seed=cfg.seed, max_examples=cfg.max_examples)
    log(f"{images.name}: {len(images.train_y)} training / {len(images.test_y)} test images, "
        f"{cfg.clients} clients, {cfg.rounds} rounds, {cfg.threads} torch thread(s), {cfg.jobs} job(s)")
    result = {"data": images.name, "protocol": resolve_protocol(cfg.protocol, images), "clients": cfg.clients,
              "rounds": cfg.rounds, "seed": cfg.seed,
              "public_steps": cfg.public_steps, "public_buckets": cfg.public_buckets,
              "threads": cfg.threads, "jobs": cfg.jobs, "cases": {}}
    jobs = min(cfg.jobs, len(cfg.cases))
    if jobs > 1:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        # spawn: a fresh interpreter per worker (torch's thread pools do not survive fork)
        with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
            futures = [pool.submit(_case_in_worker, case, cfg, images) for case in cfg.cases]
            for case, future in zip(cfg.cases, futures):
                result["cases"][case] = future.result()
    else:
        for case in cfg.cases:
            result["cases"][case] = run_case(case, cfg, images, log)
    result["wall_seconds"] = time.perf_counter() - wall
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    result["summary"] = summary_rows(result)
    write_json(out / "fidelity.json", result)
    write_atomic(out / "fidelity.csv", _csv(result))
    plot_distance_vs_time(result, out / "fidelity_distance_vs_time.png")
    plot_variance(result, out / "fidelity_variance.png")
    plot_rewards(result, out / "fidelity_rewards.png")
    return result
