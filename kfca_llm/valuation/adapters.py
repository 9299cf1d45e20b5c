"""Shapley values vs KFCA on adapter updates: per-round MR-SV, GTG-Shapley and KFCA-QP.

A round's game: v(S) = -(held-out loss of the global adapter plus the FedAvg-weighted updates of
coalition S), v(empty) = -(loss of the global adapter). MR-SV is its exact Shapley value (2^n loss
evaluations for the round's n clients), GTG-Shapley its guided, truncated estimate, KFCA-QP the
knowledge-free reward of the same updates (no held-out data, no loss evaluations).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass

import numpy as np
import torch

from ..api import score_updates
from ..errors import InputError
from ..tensors import StateDict
from .exact import shapley_exact
from .fidelity import distances, normalise, spearman
from .sampling import shapley_gtg
from .utility import CachedUtility

GTG_TRUNCATION = 0.001  # relative to |v(N)|: losses are O(1), so stop a permutation within 0.1%


@dataclass(frozen=True)
class RoundValuation:
    """One round's per-client values by each method (client ids in ``clients`` order)."""

    round: int
    clients: list[str]
    mr_sv: list[float]
    gtg_shapley: list[float]
    kfca_qp: list[float]
    v_empty: float
    v_grand: float
    coalitions: dict[str, int]
    """distinct coalitions (loss evaluations) per method; KFCA-QP needs none."""
    seconds: dict[str, float]
    distance_to_mr: dict[str, dict[str, float | None]]
    """method -> the fidelity distances (normalised rewards) and Spearman to MR-SV."""

    def to_dict(self) -> dict:
        return asdict(self)


def reconstruct(global_state: Mapping[str, torch.Tensor], updates: list[Mapping[str, torch.Tensor]],
                weights: np.ndarray) -> StateDict:
    """``global + sum_k weights[k] * updates[k]`` in float32."""
    return {name: g.float() + sum(float(w) * u[name].float() for w, u in zip(weights, updates) if w)
            for name, g in global_state.items()}


def value_round(global_state: Mapping[str, torch.Tensor], updates: Mapping[str, Mapping[str, torch.Tensor]],
                num_examples: Mapping[str, int], held_out_loss: Callable[[StateDict], float], *,
                round_index: int = 0, seed: int = 0) -> RoundValuation:
    """Value one round's client updates by MR-SV, GTG-Shapley and KFCA-QP (see the module docstring)."""
    import time

    clients = sorted(updates)
    if len(clients) < 2:
        raise InputError(f"need at least two clients in a round, got {len(clients)}")
    missing = [c for c in clients if c not in num_examples or num_examples[c] <= 0]
    if missing:
        raise InputError(f"clients {missing} have no positive number of examples")
    sizes = np.array([num_examples[c] for c in clients], dtype=np.float64)
    ups = [updates[c] for c in clients]

    def value(s: frozenset) -> float:
        w = np.zeros(len(clients))
        idx = sorted(s)
        w[idx] = sizes[idx] / sizes[idx].sum() if idx else 0.0
        return -float(held_out_loss(reconstruct(global_state, ups, w)))

    n = len(clients)
    shared = CachedUtility(value, n)
    start = time.perf_counter()
    mr = shapley_exact(shared, n)
    mr_s = time.perf_counter() - start
    gtg_utility = CachedUtility(value, n)  # its own evaluations, so its time is its own
    start = time.perf_counter()
    gtg = shapley_gtg(gtg_utility, n, seed=seed, truncation=GTG_TRUNCATION, max_permutations=20 * n).values
    gtg_s = time.perf_counter() - start
    start = time.perf_counter()
    report = score_updates(dict(zip(clients, ups)), seed=seed)
    kfca = np.array([report.rewards[c] for c in clients])
    kfca_s = time.perf_counter() - start
    ref, _ = normalise(mr)
    dist = {}
    for name, q in (("gtg_shapley", gtg), ("kfca_qp", kfca)):
        qn, _ = normalise(q)
        dist[name] = {**distances(ref, qn), "spearman": spearman(mr, q)}
    empty, grand = shared(frozenset()), shared(frozenset(range(n)))
    return RoundValuation(round_index, clients, mr.tolist(), gtg.tolist(), kfca.tolist(), empty, grand,
                          {"mr_sv": 1 << n, "gtg_shapley": gtg_utility.num_evaluated, "kfca_qp": 0},
                          {"mr_sv": mr_s, "gtg_shapley": gtg_s, "kfca_qp": kfca_s}, dist)


def mean_values(rounds: list[RoundValuation]) -> dict[str, dict[str, float]]:
    """method -> client -> mean value over the rounds the client took part in."""
    out: dict[str, dict[str, list[float]]] = {"mr_sv": {}, "gtg_shapley": {}, "kfca_qp": {}}
    for r in rounds:
        for method, values in (("mr_sv", r.mr_sv), ("gtg_shapley", r.gtg_shapley), ("kfca_qp", r.kfca_qp)):
            for client, v in zip(r.clients, values):
                out[method].setdefault(client, []).append(v)
    return {m: {c: float(np.mean(v)) for c, v in sorted(per.items())} for m, per in out.items()}
