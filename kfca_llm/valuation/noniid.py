"""Non-IID and the categorical-world condition (the paper's appendix of that name), and where KFCA must fail.

Five clients hold Dirichlet label-skewed shares of a classification task (concentration 0.1 = severe
skew, 100 = near IID) and run FedAvg. Every round, each client pair's reports give an empirical
delta matrix: KFCA-QP's reports are the signs of the clients' updates (label 1 = negative
coordinate, every coordinate a task). A pair *holds* when its delta has the categorical-world sign
pattern (Definition 3.1: positive diagonal, negative off-diagonal). Per round and client the sweep
records the honest KFCA-QP reward (the engine's payment) and what a single deviating client earns:
in expectation from the empirical deltas (flipping its signs, the label-permutation deviation:
sum_{a,b} delta(a, b) S(pi(a), b)) and as the engine pays it for an update of opposite signs.

KFCA-QP conditions on the public trajectory (``engine.public``: the penalty drawn within strata of the global's
steps before the round), so its expected payment is that of the *conditional* delta, sum_s pi_s delta_s over
the public strata s (pi_s: the share of tasks in s; delta_s: the delta of the reports within s). With
conditioning the sweep's QP deltas, categorical flags and expectations are those conditional deltas, what the
engine pays on (``public_steps`` 0: off, the plain deltas). KFCA-D's labels are not sign reports: unconditioned.

The failure case: each client trains on classes no other client has (one class each). Local models
then predict their own class for nearly every input, so their predictions carry no shared
information: delta -> 0 and KFCA-D's reward -> 0. That is the information-theoretic limit of every
peer-prediction mechanism without ground truth, not a defect of KFCA. The sweep reports it in words
and numbers for KFCA-D (predicted labels on the public test set) and KFCA-QP (update signs).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from ..api import FLAT_UPDATE_NAME, score_labels, score_updates
from ..engine.layout import Layout
from ..engine.public import PublicConditioning, public_planes
from ..errors import InputError
from ..mechanism import categorical_world, delta_matrix, expected_reward, kfca_score_matrix

CONCENTRATIONS = (0.1, 0.5, 1.0, 5.0, 100.0)  # the paper's Dirichlet sweep
NONIID_CLIENTS = 5
MIN_CLIENT_EXAMPLES = 10  # a Dirichlet draw that leaves a client fewer examples is drawn again
MAX_DRAWS = 1000
NEAR_ZERO = 0.01  # |delta| entries and |rewards| below this count as collapsed in the failure case's verdict


@dataclass(frozen=True)
class RoundSignals:
    """What one round of a federation gives the analysis."""

    updates: torch.Tensor
    """(n, P) the clients' updates (local model minus the round's global model), flattened."""
    predictions: np.ndarray
    """int (n, m) each local model's predicted labels on the public test inputs."""
    public: list[torch.Tensor] = field(default_factory=list)
    """the global's steps before this round (flattened like the updates), oldest first: the public trajectory."""


@dataclass(frozen=True)
class FederationRun:
    rounds: list[RoundSignals]
    accuracy: float
    """test accuracy of the final global model."""
    class_counts: list[list[int]]
    """per client, examples per class."""
    num_labels: int
    extra: dict = field(default_factory=dict)


def dirichlet_partition(labels: np.ndarray, n: int, concentration: float, seed: int,
                        min_examples: int = MIN_CLIENT_EXAMPLES) -> list[np.ndarray]:
    """Indices per client: each class's examples split by proportions ~ Dirichlet(concentration * 1_n).

    Drawn again (same generator) until every client has ``min_examples``; the draws depend only on ``seed``.
    """
    if not concentration > 0:
        raise InputError(f"the Dirichlet concentration must be positive, got {concentration!r}")
    if n * min_examples > labels.size:
        raise InputError(f"{labels.size} examples are too few for {n} clients of at least {min_examples}")
    rng = np.random.default_rng(seed)
    classes = np.unique(labels)
    for _ in range(MAX_DRAWS):
        parts: list[list[int]] = [[] for _ in range(n)]
        for c in classes:
            idx = rng.permutation(np.flatnonzero(labels == c))
            cuts = (np.cumsum(rng.dirichlet(np.full(n, concentration)))[:-1] * idx.size).astype(int)
            for client, chunk in enumerate(np.split(idx, cuts)):
                parts[client].extend(chunk.tolist())
        if min(len(p) for p in parts) >= min_examples:
            return [np.sort(np.array(p, dtype=np.int64)) for p in parts]
    raise InputError(f"no Dirichlet({concentration}) draw in {MAX_DRAWS} gave every client {min_examples} examples")


def disjoint_partition(labels: np.ndarray, n: int) -> list[np.ndarray]:
    """Client i gets every example of class i and nothing else (the failure case)."""
    classes = np.unique(labels)
    if n > classes.size:
        raise InputError(f"disjoint classes need at least as many classes ({classes.size}) as clients ({n})")
    return [np.flatnonzero(labels == classes[i]) for i in range(n)]


def class_counts(labels: np.ndarray, parts: Sequence[np.ndarray], num_labels: int) -> list[list[int]]:
    return [np.bincount(labels[p], minlength=num_labels).tolist() for p in parts]


def sign_reports(updates: torch.Tensor) -> np.ndarray:
    """KFCA-QP's binary reports as the engine forms them: label 1 where the coordinate is negative, on the
    coordinates where some client's update is non-zero (the others are no task)."""
    active = (updates != 0).any(dim=0)
    return (updates[:, active] < 0).numpy().astype(np.int64)


def flipped_signs(updates: torch.Tensor, i: int) -> torch.Tensor:
    """An update whose report is the opposite of client i's on every task (and zero off the tasks, so the
    task set stays the same): the sign-flipping deviation as the engine sees it."""
    active = (updates != 0).any(dim=0)
    return torch.where(active, torch.where(updates[i] < 0, 1.0, -1.0), 0.0)


def public_strata(steps: Sequence[torch.Tensor], conditioning: PublicConditioning) -> np.ndarray | None:
    """int64 (P,) each coordinate's public stratum as the engine forms it from the flat ``steps`` (oldest first):
    bit p = plane p of ``engine.public.public_planes``; None when nothing conditions (off, or no step yet)."""
    if not steps:
        return None
    numel = steps[0].numel()
    planes = public_planes(Layout.from_shapes({FLAT_UPDATE_NAME: (numel,)}), [{FLAT_UPDATE_NAME: s} for s in steps],
                           conditioning)
    if planes is None:
        return None
    # plane words hold bit e % 32 of word e // 32: little-endian bytes, little-endian bits
    bits = np.unpackbits(planes.host_words().astype("<i4").view(np.uint8), axis=1, bitorder="little")[:, :numel]
    return (bits.astype(np.int64) << np.arange(planes.n_planes, dtype=np.int64)[:, None]).sum(axis=0)


def conditional_delta(r1: np.ndarray, r2: np.ndarray, strata: np.ndarray | None, num_labels: int) -> np.ndarray:
    """sum_s pi_s delta_s: the delta of the reports within each public stratum, weighted by its share of the tasks
    (the plain delta when ``strata`` is None)."""
    if strata is None:
        return delta_matrix(r1, r2, num_labels)
    total = np.zeros((num_labels, num_labels))
    for s in np.unique(strata):
        within = strata == s
        total += within.mean() * delta_matrix(r1[within], r2[within], num_labels)
    return total


FLIP = np.array([1, 0])


def analyse_round(signals: RoundSignals, num_labels: int, seed: int,
                  conditioning: PublicConditioning = PublicConditioning()) -> dict:
    """Pairs' deltas and categorical flags (QP and D), honest and deviating rewards for one round; KFCA-QP's
    conditioned on ``signals.public`` (see the module docstring)."""
    n = signals.updates.shape[0]
    names = [f"client-{i}" for i in range(n)]
    reports = sign_reports(signals.updates)
    public = signals.public if conditioning.enabled else []
    strata = public_strata(public, conditioning)
    if strata is not None:
        strata = strata[(signals.updates != 0).any(dim=0).numpy()]  # the tasks' strata (as ``sign_reports``)
    pairs, expected_honest, expected_flip = [], np.zeros(n), np.zeros(n)
    for i in range(n):
        for j in range(i + 1, n):
            qp = conditional_delta(reports[i], reports[j], strata, 2)
            d = delta_matrix(signals.predictions[i], signals.predictions[j], num_labels)
            pairs.append({"pair": [i, j], "delta": qp.tolist(), "categorical": categorical_world(qp),
                          "labels_delta_abs_max": float(np.abs(d).max()), "labels_categorical": categorical_world(d)})
            for a, b, delta in ((i, j, qp), (j, i, qp.T)):
                expected_honest[a] += expected_reward(delta, [0, 1], [0, 1], kfca_score_matrix(2)) / (n - 1)
                expected_flip[a] += expected_reward(delta, FLIP, [0, 1], kfca_score_matrix(2)) / (n - 1)
    updates = dict(zip(names, signals.updates))
    # the payment rule is the subject here, not copy detection (a flipped update can mirror a peer's signs)
    steps = [{FLAT_UPDATE_NAME: s} for s in public]
    honest = score_updates(updates, seed=seed, duplicates="flag", public=steps, conditioning=conditioning).rewards
    deviated = [score_updates({**updates, names[i]: flipped_signs(signals.updates, i)}, seed=seed, duplicates="flag",
                              public=steps, conditioning=conditioning).rewards[names[i]] for i in range(n)]
    labels = score_labels(dict(zip(names, signals.predictions)), num_labels=num_labels, seed=seed).rewards
    return {"pairs": pairs, "honest_reward": [honest[c] for c in names], "deviation_reward": deviated,
            "honest_expected": expected_honest.tolist(), "deviation_expected": expected_flip.tolist(),
            "labels_reward": [labels[c] for c in names]}


def summarise(rounds: list[dict]) -> dict:
    """Counts of pairs that hold and mean rewards over rounds and clients."""
    n_pairs = len(rounds[0]["pairs"])
    holds = np.array([[p["categorical"] for p in r["pairs"]] for r in rounds])  # (rounds, pairs)
    labels_hold = np.array([[p["labels_categorical"] for p in r["pairs"]] for r in rounds])
    mean = lambda key: float(np.mean([r[key] for r in rounds]))  # noqa: E731
    return {"pairs": n_pairs, "pairs_hold_every_round": int(holds.all(axis=0).sum()),
            "pair_rounds_hold": int(holds.sum()), "pair_rounds": int(holds.size),
            "labels_pair_rounds_hold": int(labels_hold.sum()),
            "honest_reward": mean("honest_reward"), "deviation_reward": mean("deviation_reward"),
            "honest_expected": mean("honest_expected"), "deviation_expected": mean("deviation_expected"),
            "labels_reward": mean("labels_reward"),
            "max_abs_labels_delta": float(max(p["labels_delta_abs_max"] for r in rounds for p in r["pairs"])),
            "max_abs_labels_reward": float(np.max(np.abs([r["labels_reward"] for r in rounds])))}


def analyse_run(run: FederationRun, seed: int, conditioning: PublicConditioning = PublicConditioning()) -> dict:
    rounds = [{"round": t, **analyse_round(s, run.num_labels, seed + t, conditioning)}
              for t, s in enumerate(run.rounds)]
    return {"global_accuracy": run.accuracy, "class_counts": run.class_counts, **run.extra,
            "summary": summarise(rounds), "rounds": rounds}


def failure_verdict(summary: dict) -> str:
    """The failure case in words, from its numbers."""
    collapsed = summary["max_abs_labels_delta"] < NEAR_ZERO and summary["max_abs_labels_reward"] < NEAR_ZERO
    qp = (f"KFCA-QP on the update signs: {summary['pair_rounds_hold']} of {summary['pair_rounds']} pair-rounds "
          f"categorical, honest reward {summary['honest_reward']:+.4f}, a sign-flipping client "
          f"{summary['deviation_reward']:+.4f}.")
    if collapsed:
        return ("Disjoint classes: KFCA cannot work here and does not pretend to. The local models predict their "
                f"own client's class for {summary['own_class_share']:.0%} of the test inputs, so the clients' "
                "predictions share no information: the largest |delta| entry of "
                f"any pair is {summary['max_abs_labels_delta']:.4f} and the largest |KFCA-D reward| "
                f"{summary['max_abs_labels_reward']:.4f} (both -> 0). " + qp)
    return ("Disjoint classes: the predictions still share information here (largest |delta| "
            f"{summary['max_abs_labels_delta']:.4f}, largest |KFCA-D reward| {summary['max_abs_labels_reward']:.4f}); "
            "the collapse the paper predicts did not happen in this run. " + qp)


@dataclass(frozen=True)
class NonIIDConfig:
    concentrations: tuple[float, ...] = CONCENTRATIONS
    clients: int = NONIID_CLIENTS
    rounds: int = 10
    seed: int = 0
    data: str | None = None
    max_examples: int | None = None
    threads: int = 1
    """torch threads (one: the small models gain nothing from more, and a second core is better left free)."""
    public_steps: int = 5
    public_buckets: int = 2
    """KFCA-QP's conditioning on the global's steps (the engine's default; steps 0: off, the plain deltas)."""

    def __post_init__(self):
        self.conditioning  # its checks, before any training

    @property
    def conditioning(self) -> PublicConditioning:
        return PublicConditioning(self.public_steps, self.public_buckets)


@dataclass(frozen=True)
class SweepTask:
    """A federation the sweep can partition: its data's name, training labels and how to run it."""

    name: str
    labels: np.ndarray
    run: Callable[[list[np.ndarray]], FederationRun]


def digits_task(cfg: NonIIDConfig) -> SweepTask:
    """The paper's small CNN family on the bundled digits (or ``cfg.data``), FedAvg as in the fidelity run."""
    from .cases import load_images
    from .cnn_federation import ClientData, FederationConfig, accuracy, model_for, predictions, run_federation

    images = load_images(cfg.data, seed=cfg.seed, max_examples=cfg.max_examples)
    fed = FederationConfig(rounds=cfg.rounds, seed=cfg.seed)
    model = model_for(images.train_x.shape[1:], images.num_classes, fed.channels)
    test_x = model.patches(torch.from_numpy(images.test_x[:, None]))
    test_y = torch.from_numpy(images.test_y)
    history = cfg.conditioning.history

    def run(parts: list[np.ndarray]) -> FederationRun:
        clients = [ClientData(torch.from_numpy(images.train_x[p][:, None]), torch.from_numpy(images.train_y[p]))
                   for p in parts]
        record = run_federation(model, clients, model.init(cfg.seed), fed)
        rounds = [RoundSignals(u, predictions(model, g[None] + u, test_x), record.public_steps(t, history))
                  for t, (g, u) in enumerate(zip(record.globals, record.updates))]
        return FederationRun(rounds, float(accuracy(model, record.final[None], test_x, test_y)[0]),
                             class_counts(images.train_y, parts, images.num_classes), images.num_classes,
                             {"parameters": model.num_parameters})

    return SweepTask(images.name, images.train_y, run)


def run_sweep(cfg: NonIIDConfig, task: SweepTask, log=print) -> dict:
    """The Dirichlet sweep and the disjoint-classes failure case on one federation ``task``."""
    name, labels, run = task.name, task.labels, task.run
    parts = disjoint_partition(labels, cfg.clients)  # checked first: the failure case needs a class per client
    result = {"data": name, "clients": cfg.clients, "rounds": cfg.rounds, "seed": cfg.seed,
              "public_steps": cfg.public_steps, "public_buckets": cfg.public_buckets, "levels": []}
    for alpha in cfg.concentrations:
        start = time.perf_counter()
        level = analyse_run(run(dirichlet_partition(labels, cfg.clients, alpha, cfg.seed)), cfg.seed, cfg.conditioning)
        s = level["summary"]
        log(f"  Dirichlet {alpha:>6g}: accuracy {level['global_accuracy']:.3f}, {s['pairs_hold_every_round']}/"
            f"{s['pairs']} pairs categorical in every round ({s['pair_rounds_hold']}/{s['pair_rounds']} pair-rounds), "
            f"honest {s['honest_reward']:+.4f}, deviator {s['deviation_reward']:+.4f} "
            f"({time.perf_counter() - start:.1f} s)")
        result["levels"].append({"concentration": alpha, **level})
    failure_run = run(parts)
    own = [labels[p[0]] for p in parts]  # client i's only class
    failure = analyse_run(failure_run, cfg.seed, cfg.conditioning)
    failure["summary"]["own_class_share"] = float(np.mean([np.mean(r.predictions[i] == own[i])
                                                           for r in failure_run.rounds for i in range(cfg.clients)]))
    failure["verdict"] = failure_verdict(failure["summary"])
    log("  " + failure["verdict"])
    result["disjoint"] = failure
    result["pairs_hold"] = sum(level["summary"]["pairs_hold_every_round"] for level in result["levels"])
    result["pairs_total"] = sum(level["summary"]["pairs"] for level in result["levels"])
    return result


def noniid_table(result: dict) -> str:
    """The sweep as a table (one row per concentration, then the disjoint case) and the failure verdict."""
    from ..report import text_table

    rows = []
    for level in [*result["levels"], {"concentration": "disjoint", **result["disjoint"]}]:
        s = level["summary"]
        alpha = level["concentration"]
        rows.append([alpha if isinstance(alpha, str) else f"{alpha:g}", f"{level['global_accuracy']:.3f}",
                     f"{s['pairs_hold_every_round']}/{s['pairs']}", f"{s['pair_rounds_hold']}/{s['pair_rounds']}",
                     f"{s['honest_reward']:+.4f}", f"{s['deviation_reward']:+.4f}", f"{s['honest_expected']:+.4f}",
                     f"{s['deviation_expected']:+.4f}", f"{s['labels_reward']:+.4f}"])
    notes = [f"pairs categorical in every round over the sweep: {result['pairs_hold']} of {result['pairs_total']}",
             "honest / deviator: mean KFCA-QP reward paid by the engine to honest clients and to one client that "
             "flips every sign; E(...): the same from the empirical deltas; KFCA-D: mean reward of the local "
             "models' predicted test labels",
             (f"KFCA-QP conditioned on the global's steps ({result['public_steps']} sign planes x "
              f"{result['public_buckets']} magnitude buckets): deltas, flags and E(...) within the public strata"
              if result.get("public_steps") else "KFCA-QP unconditioned (public steps 0)"),
             result["disjoint"]["verdict"]]
    return text_table(f"non-IID sweep: {result['data']}, {result['clients']} clients, {result['rounds']} rounds",
                      ["Dirichlet", "accuracy", "pairs hold", "pair-rounds", "honest", "deviator", "E(honest)",
                       "E(deviator)", "KFCA-D"], rows, notes)


def run_noniid(cfg: NonIIDConfig, out, task: SweepTask | None = None, log=print, stem: str = "noniid") -> dict:
    """The sweep on ``task`` (default: the digits federation); writes ``<stem>.json`` and ``<stem>.png`` to ``out``."""
    from pathlib import Path

    from ..report import write_json
    from .figures import plot_noniid

    if cfg.clients < 2:
        raise InputError(f"the sweep needs at least two clients, got {cfg.clients}")
    wall = time.perf_counter()
    threads_before = torch.get_num_threads()
    torch.set_num_threads(cfg.threads)
    try:
        task = task if task is not None else digits_task(cfg)
        result = _sweep_logged(cfg, task, log)
    finally:
        torch.set_num_threads(threads_before)
    result["wall_seconds"] = time.perf_counter() - wall
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / f"{stem}.json", result)
    plot_noniid(result, out / f"{stem}.png")
    return result


def _sweep_logged(cfg: NonIIDConfig, task: SweepTask, log) -> dict:
    log(f"{task.name}: {cfg.clients} clients, {cfg.rounds} rounds, Dirichlet "
        f"{', '.join(f'{a:g}' for a in cfg.concentrations)}, {cfg.threads} torch thread(s)")
    return run_sweep(cfg, task, log)
