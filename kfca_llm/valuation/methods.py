"""Per-client rewards of a recorded federation, by every method of the paper's comparison.

Each method takes a ``ValuationProblem`` (the clients' data, the model, the recorded real run and
the public test set) and returns raw per-client rewards plus how many coalitions it evaluated.
Reconstruction-based methods (MR, GTG-Shapley, Fed-SV, TMR) value coalition S in round t by the test
accuracy of ``theta_t + sum_{i in S} |D_i| / |D_S| update_i`` (v(empty) = accuracy of theta_t);
exact SV, TMC-Shapley and Group Testing retrain: v(S) is the test accuracy of FedAvg run on S alone
from the same initialisation and seeds. CA and KFCA never look at the test labels.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from ..api import FLAT_UPDATE_NAME, score_labels, score_updates
from ..engine.public import PublicConditioning
from ..engine.stats import delta_from_joint
from ..mechanism import ca_score_matrix, joint_counts, mtpp_payment
from . import per_round
from .exact import shapley_from_table
from .group_testing import shapley_group_testing
from .cnn_federation import (ClientData, FederationConfig, FederationRecord, StackedModel, accuracy, coalition_matrix,
                         fedavg_weights, predictions, train_coalitions)
from .sampling import shapley_gtg, shapley_tmc
from .utility import CachedUtility

BETWEEN_ROUND_TRUNCATION = 0.005  # GTG: skip a round whose total gain v_t(N) - v_t(empty) is below this (accuracy)
IN_ROUND_TRUNCATION = 0.01  # GTG / TMC: stop a permutation within 1% of v(N)
# GTG: at most 10n permutations per round. The relative-change stopping rule rarely fires on
# per-round values near 0 (measured: ~400 permutations per round at n = 10, most rounds uncapped).
GTG_MAX_PERMUTATIONS_PER_CLIENT = 10
TMC_PREFETCH = 25  # TMC: permutations whose prefixes are retrained together (stacked) in one batch
MC_FRACTION, MC_REPEATS = 0.1, 5  # MC KFCA-QP: X = 10% of the coordinates, Y = 5 draws


@dataclass(frozen=True)
class ValuationProblem:
    model: StackedModel
    clients: list[ClientData]
    init: torch.Tensor
    cfg: FederationConfig
    record: FederationRecord
    test_x: torch.Tensor
    """the test inputs as the model reads them (``model.patches``), computed once"""
    test_y: torch.Tensor
    conditioning: PublicConditioning = PublicConditioning()
    """how KFCA-QP conditions on the public trajectory (the globals of ``record``); steps 0: off."""

    @property
    def n(self) -> int:
        return len(self.clients)

    def client_names(self) -> list[str]:
        return [f"client-{i:02d}" for i in range(self.n)]


@dataclass(frozen=True)
class MethodResult:
    rewards: np.ndarray
    """float64 (n,) raw rewards (Shapley values, summed per-round values or payments)."""
    coalitions: int | None = None
    """distinct coalitions whose utility was evaluated (None: the method uses no utility)."""
    extra: dict = field(default_factory=dict)


def _round_models(problem: ValuationProblem, t: int, masks: np.ndarray) -> torch.Tensor:
    member = coalition_matrix(masks, problem.n)
    weights = fedavg_weights(member, problem.record.num_examples)
    return problem.record.globals[t][None] + weights @ problem.record.updates[t]


def _round_utility(problem: ValuationProblem, t: int, *, batched: bool = False) -> CachedUtility:
    """v_t(S) = test accuracy of the round-t reconstruction of S; ``batched``: prefetched coalitions are
    reconstructed and evaluated together (stacked)."""

    def empty() -> float:
        return float(accuracy(problem.model, problem.record.globals[t][None], problem.test_x, problem.test_y)[0])

    def batch(coalitions: list[frozenset]) -> np.ndarray:
        masks = np.array([sum(1 << i for i in s) for s in coalitions if s], dtype=np.int64)
        values = iter(accuracy(problem.model, _round_models(problem, t, masks), problem.test_x, problem.test_y)
                      if masks.size else [])
        return np.array([next(values) if s else empty() for s in coalitions])

    return CachedUtility(lambda s: float(batch([s])[0]), problem.n, batch=batch if batched else None)


def _all_masks(n: int) -> np.ndarray:
    return np.arange(1, 1 << n, dtype=np.int64)


def exact_sv(problem: ValuationProblem) -> MethodResult:
    """The definition with v(S) = accuracy after retraining FedAvg on S alone (all 2^n - 1 at once)."""
    models = train_coalitions(problem.model, problem.clients, problem.init, _all_masks(problem.n), problem.cfg)
    table = np.concatenate([accuracy(problem.model, problem.init[None], problem.test_x, problem.test_y),
                            accuracy(problem.model, models, problem.test_x, problem.test_y)])
    return MethodResult(shapley_from_table(table), 1 << problem.n,
                        {"v_grand": float(table[-1]), "v_empty": float(table[0])})


def _round_exact(problem: ValuationProblem, t: int) -> tuple[np.ndarray, int]:
    """Round t's exact Shapley values of the reconstruction game (all 2^n coalitions at once)."""
    empty = accuracy(problem.model, problem.record.globals[t][None], problem.test_x, problem.test_y)
    table = np.concatenate([empty, accuracy(problem.model, _round_models(problem, t, _all_masks(problem.n)),
                                            problem.test_x, problem.test_y)])
    return shapley_from_table(table), 1 << problem.n


def mr(problem: ValuationProblem) -> MethodResult:
    """MR (Song et al., 2019): exact per-round Shapley values of reconstructed models, summed."""
    return MethodResult(sum(_round_exact(problem, t)[0] for t in range(problem.cfg.rounds)),
                        problem.cfg.rounds * (1 << problem.n))


def tmr(problem: ValuationProblem) -> MethodResult:
    """TMR (Wei et al., 2020): MR's per-round values weighted by a decay factor, light rounds skipped."""
    out = per_round.tmr(lambda t: _round_exact(problem, t), problem.cfg.rounds, problem.n)
    return MethodResult(out.values, out.coalitions, {"rounds_computed": out.rounds_computed, **out.extra})


def fed_sv(problem: ValuationProblem) -> MethodResult:
    """Fed-SV (Wang et al., 2020): per-round group testing on reconstructed models, summed over rounds."""
    out = per_round.fed_sv([_round_utility(problem, t, batched=True) for t in range(problem.cfg.rounds)],
                            problem.n, seed=problem.cfg.seed)
    return MethodResult(out.values, out.coalitions, out.extra)


def gtg_shapley(problem: ValuationProblem) -> MethodResult:
    """GTG-Shapley (Liu et al., 2022): MR with the guided, truncated in-round estimator and rounds
    skipped when their total gain is below ``BETWEEN_ROUND_TRUNCATION``."""
    total, evaluated, skipped, permutations, converged = np.zeros(problem.n), 0, 0, 0, 0
    for t in range(problem.cfg.rounds):
        utility = _round_utility(problem, t)
        gain = utility(frozenset(range(problem.n))) - utility(frozenset())
        if abs(gain) >= BETWEEN_ROUND_TRUNCATION:
            est = shapley_gtg(utility, problem.n, seed=problem.cfg.seed + t, truncation=IN_ROUND_TRUNCATION,
                              max_permutations=GTG_MAX_PERMUTATIONS_PER_CLIENT * problem.n)
            total += est.values
            permutations += est.permutations
            converged += est.converged
        else:
            skipped += 1
        evaluated += utility.num_evaluated
    return MethodResult(total, evaluated, {"rounds_skipped": skipped, "rounds_converged": converged,
                                                  "permutations": permutations})


def _retraining_utility(problem: ValuationProblem) -> CachedUtility:
    """v(S) = test accuracy after FedAvg on S alone (exact SV's game); prefetched coalitions train together."""

    def batch(coalitions: list[frozenset]) -> np.ndarray:
        nonempty = [s for s in coalitions if s]
        values = dict.fromkeys(coalitions, float(accuracy(problem.model, problem.init[None], problem.test_x,
                                                          problem.test_y)[0]))
        if nonempty:
            masks = np.array([sum(1 << i for i in s) for s in nonempty])
            models = train_coalitions(problem.model, problem.clients, problem.init, masks, problem.cfg)
            values.update(zip(nonempty, accuracy(problem.model, models, problem.test_x, problem.test_y)))
        return np.array([values[s] for s in coalitions])

    return CachedUtility(lambda s: float(batch([s])[0]), problem.n, batch=batch)


def tmc_shapley(problem: ValuationProblem) -> MethodResult:
    """TMC-Shapley (Ghorbani and Zou, 2019) with the retraining utility of exact SV; the prefixes of
    ``TMC_PREFETCH`` permutations are retrained together, so truncation saves evaluations only."""
    utility = _retraining_utility(problem)
    utility.prefetch([frozenset(), frozenset(range(problem.n))])
    est = shapley_tmc(utility, problem.n, seed=problem.cfg.seed, truncation=IN_ROUND_TRUNCATION,
                      prefetch=TMC_PREFETCH)
    return MethodResult(est.values, est.coalitions_evaluated, {"permutations": est.permutations,
                                                               "converged": est.converged})


def group_testing(problem: ValuationProblem) -> MethodResult:
    """Group Testing (Jia et al., 2019) with the retraining utility of exact SV."""
    utility = _retraining_utility(problem)
    utility.prefetch([frozenset(), frozenset(range(problem.n))])
    est = shapley_group_testing(utility, problem.n, seed=problem.cfg.seed)
    return MethodResult(est.values, est.coalitions_evaluated,
                        {"tests": est.tests, "converged": est.converged})


def _sign_reports(update: torch.Tensor) -> np.ndarray:
    """Binary reports of an update (label 1 = negative coordinate), as in ``mechanism``."""
    return (update < 0).numpy().astype(np.int64)


def ca_rewards(reports: list[np.ndarray], num_labels: int, seed: int) -> np.ndarray:
    """CA (Shnayder et al.): score 1{delta > 0} with delta estimated from all ordered pairs' reports."""
    n = len(reports)
    joint = sum(joint_counts(reports[i], reports[j], num_labels) for i in range(n) for j in range(n) if i != j)
    score = ca_score_matrix(delta_from_joint(joint))
    return np.array([np.mean([mtpp_payment(reports[i], reports[j], score, seed=seed, pair=(i, j))
                              for j in range(n) if j != i]) for i in range(n)])


def ca_qp(problem: ValuationProblem) -> MethodResult:
    """CA-QP: CA on the signs of the updates (every coordinate a task), summed over rounds."""
    return MethodResult(sum(ca_rewards([_sign_reports(u) for u in problem.record.updates[t]], 2,
                                       problem.cfg.seed + t) for t in range(problem.cfg.rounds)))


def _local_predictions(problem: ValuationProblem, t: int) -> np.ndarray:
    local = problem.record.globals[t][None] + problem.record.updates[t]
    return predictions(problem.model, local, problem.test_x)


def ca_d(problem: ValuationProblem) -> MethodResult:
    """CA-D: CA on the local models' predicted labels on the public test set, summed over rounds."""
    num_labels = int(problem.model.num_classes)
    return MethodResult(sum(ca_rewards(list(_local_predictions(problem, t)), num_labels, problem.cfg.seed + t)
                            for t in range(problem.cfg.rounds)))


def _kfca_qp_round(problem: ValuationProblem, t: int, coordinates: torch.Tensor | None = None) -> np.ndarray:
    """KFCA-QP on round t's updates (only ``coordinates`` of them when given), conditioned on the global's steps
    before round t (the same coordinates)."""
    names = problem.client_names()
    updates = problem.record.updates[t]
    steps = problem.record.public_steps(t, problem.conditioning.history)
    if coordinates is not None:
        updates, steps = updates[:, coordinates], [s[coordinates] for s in steps]
    report = score_updates(dict(zip(names, updates)), seed=problem.cfg.seed + t,
                           public=[{FLAT_UPDATE_NAME: s} for s in steps], conditioning=problem.conditioning)
    return np.array([report.rewards[c] for c in names])


def kfca_qp(problem: ValuationProblem) -> MethodResult:
    """KFCA-QP (our engine, ``score_updates``) on each round's updates, summed over rounds."""
    return MethodResult(sum(_kfca_qp_round(problem, t) for t in range(problem.cfg.rounds)))


def kfca_d(problem: ValuationProblem) -> MethodResult:
    """KFCA-D (``score_labels``) on the local models' predicted test labels, summed over rounds."""
    names = problem.client_names()
    total = np.zeros(problem.n)
    for t in range(problem.cfg.rounds):
        report = score_labels(dict(zip(names, _local_predictions(problem, t))),
                              num_labels=int(problem.model.num_classes), seed=problem.cfg.seed + t)
        total += np.array([report.rewards[c] for c in names])
    return MethodResult(total)


def mc_kfca_qp(problem: ValuationProblem) -> MethodResult:
    """MC KFCA-QP: KFCA-QP on X random coordinates, Y times, averaged; summed over rounds."""
    rng = np.random.default_rng(problem.cfg.seed)
    size = problem.model.num_parameters
    x = max(int(MC_FRACTION * size), 16)
    total = np.zeros(problem.n)
    for t in range(problem.cfg.rounds):
        draws = [_kfca_qp_round(problem, t, torch.from_numpy(rng.choice(size, x, replace=False)))
                 for _ in range(MC_REPEATS)]
        total += np.mean(draws, axis=0)
    return MethodResult(total, extra={"coordinates": x, "repeats": MC_REPEATS})


def uniform(problem: ValuationProblem) -> MethodResult:
    """Reference: equal split (no information at all)."""
    return MethodResult(np.full(problem.n, 1.0 / problem.n))


METHODS: dict[str, tuple[str, Callable[[ValuationProblem], MethodResult]]] = {
    "exact-sv": ("Exact SV", exact_sv),
    "mr": ("MR", mr),
    "gtg-shapley": ("GTG-Shapley", gtg_shapley),
    "tmc-shapley": ("TMC-Shapley", tmc_shapley),
    "group-testing": ("Group Testing", group_testing),
    "fed-sv": ("Fed-SV", fed_sv),
    "tmr": ("TMR", tmr),
    "ca-qp": ("CA-QP", ca_qp),
    "ca-d": ("CA-D", ca_d),
    "kfca-qp": ("KFCA-QP", kfca_qp),
    "kfca-d": ("KFCA-D", kfca_d),
    "mc-kfca-qp": ("MC KFCA-QP", mc_kfca_qp),
    "uniform": ("uniform", uniform),
}
"""method key -> (display name, function); exact SV always runs (it is the reference)."""

__all__ = ["METHODS", "MethodResult", "ValuationProblem", "ca_rewards"]
