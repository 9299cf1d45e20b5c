"""Shapley values vs KFCA on adapter updates: one round's clients valued by every ``ROUND_METHODS`` entry.

A round's game: v(S) = -(held-out loss of the global adapter plus the FedAvg-weighted updates of
coalition S), v(empty) = -(loss of the global adapter). MR-SV is its exact Shapley value (2^n loss
evaluations for the round's n clients), GTG-Shapley its guided, truncated estimate, KFCA-QP the
knowledge-free reward of the same updates (no held-out data, no loss evaluations), conditioned on the global's
steps before the round (the public trajectory, ``engine.public``) as the federation's own scoring is.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from ..api import score_updates
from ..engine.public import PublicConditioning
from ..errors import InputError
from ..tensors import StateDict
from .exact import shapley_exact
from .metrics import distances, normalise, spearman
from .sampling import shapley_gtg
from .utility import CachedUtility

GTG_TRUNCATION = 0.001  # relative to |v(N)|: losses are O(1), so stop a permutation within 0.1%


@dataclass(frozen=True)
class RoundGame:
    """What a round method may read: the clients (sorted), their updates and the uncached game v(S)."""

    clients: list[str]
    updates: list[Mapping[str, torch.Tensor]]
    value: Callable[[frozenset], float]
    seed: int
    public: Sequence[Mapping[str, torch.Tensor]] = ()
    """the global's steps before the round (state dicts like the updates), oldest first."""
    conditioning: PublicConditioning = PublicConditioning()

    @property
    def n(self) -> int:
        return len(self.clients)


@dataclass(frozen=True)
class RoundMethod:
    name: str
    values: Callable[[RoundGame], tuple[np.ndarray, CachedUtility | None]]
    """per-client values and the utility it evaluated (None for a knowledge-free method)."""
    knowledge_free: bool = False
    """True: reads only the updates (no held-out data, no loss evaluations)."""


def _mr_sv(game: RoundGame) -> tuple[np.ndarray, CachedUtility]:
    utility = CachedUtility(game.value, game.n)
    return shapley_exact(utility, game.n), utility


def _gtg_shapley(game: RoundGame) -> tuple[np.ndarray, CachedUtility]:
    utility = CachedUtility(game.value, game.n)  # its own evaluations, so its time is its own
    est = shapley_gtg(utility, game.n, seed=game.seed, truncation=GTG_TRUNCATION, max_permutations=20 * game.n)
    return est.values, utility


def _kfca_qp(game: RoundGame) -> tuple[np.ndarray, None]:
    report = score_updates(dict(zip(game.clients, game.updates)), seed=game.seed, public=list(game.public),
                           conditioning=game.conditioning)
    return np.array([report.rewards[c] for c in game.clients]), None


REFERENCE = "mr_sv"
ROUND_METHODS: dict[str, RoundMethod] = {
    REFERENCE: RoundMethod("MR-SV", _mr_sv),
    "gtg_shapley": RoundMethod("GTG-Shapley", _gtg_shapley),
    "kfca_qp": RoundMethod("KFCA-QP", _kfca_qp, knowledge_free=True),
}
"""method key -> how it values a round; the reference (exact per-round Shapley value) comes first."""


@dataclass(frozen=True)
class RoundValuation:
    """One round's per-client values by each method (client ids in ``clients`` order)."""

    round: int
    clients: list[str]
    values: dict[str, list[float]]
    """method key (``ROUND_METHODS``) -> per-client values."""
    v_empty: float
    v_grand: float
    coalitions: dict[str, int]
    """distinct coalitions (loss evaluations) per method; a knowledge-free method needs none."""
    seconds: dict[str, float]
    distance_to_mr: dict[str, dict[str, float | None]]
    """method -> the fidelity distances (normalised rewards) and Spearman to MR-SV."""

    def to_dict(self) -> dict:
        return {"round": self.round, "clients": list(self.clients), **{k: list(v) for k, v in self.values.items()},
                "v_empty": self.v_empty, "v_grand": self.v_grand, "coalitions": dict(self.coalitions),
                "seconds": dict(self.seconds), "distance_to_mr": dict(self.distance_to_mr)}


def reconstruct(global_state: Mapping[str, torch.Tensor], updates: list[Mapping[str, torch.Tensor]],
                weights: np.ndarray) -> StateDict:
    """``global + sum_k weights[k] * updates[k]`` in float32."""
    return {name: g.float() + sum(float(w) * u[name].float() for w, u in zip(weights, updates) if w)
            for name, g in global_state.items()}


def value_round(global_state: Mapping[str, torch.Tensor], updates: Mapping[str, Mapping[str, torch.Tensor]],
                num_examples: Mapping[str, int], held_out_loss: Callable[[StateDict], float], *,
                round_index: int = 0, seed: int = 0, public: Sequence[Mapping[str, torch.Tensor]] = (),
                conditioning: PublicConditioning = PublicConditioning()) -> RoundValuation:
    """Value one round's client updates by every ``ROUND_METHODS`` entry (see the module docstring); ``public``: the
    global's steps before the round, oldest first, that KFCA-QP conditions on (``conditioning``)."""
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

    game = RoundGame(clients, ups, value, seed, public, conditioning)
    values, coalitions, seconds, utilities = {}, {}, {}, {}
    for key, method in ROUND_METHODS.items():
        start = time.perf_counter()
        values[key], utilities[key] = method.values(game)
        seconds[key] = time.perf_counter() - start
        coalitions[key] = utilities[key].num_evaluated if utilities[key] is not None else 0
    ref, _ = normalise(values[REFERENCE])
    dist = {}
    for key, q in values.items():
        if key != REFERENCE:
            qn, _ = normalise(q)
            dist[key] = {**distances(ref, qn), "spearman": spearman(values[REFERENCE], q)}
    reference = utilities[REFERENCE]
    return RoundValuation(round_index, clients, {k: v.tolist() for k, v in values.items()},
                          reference(frozenset()), reference(frozenset(range(game.n))), coalitions, seconds, dist)


def mean_values(rounds: list[RoundValuation]) -> dict[str, dict[str, float]]:
    """method -> client -> mean value over the rounds the client took part in."""
    out: dict[str, dict[str, list[float]]] = {key: {} for key in ROUND_METHODS}
    for r in rounds:
        for method, values in r.values.items():
            for client, v in zip(r.clients, values):
                out[method].setdefault(client, []).append(v)
    return {m: {c: float(np.mean(v)) for c, v in sorted(per.items())} for m, per in out.items()}
