"""Which replies the global model takes, with which weights (``aggregation_weights``), and FedAvg over them.

One rule, two front ends: ``kfca.aggregate`` of ``kfca-llm simulate`` (``fl/rounds.py``) and
``KFCAStrategy(aggregation=...)`` (``flower/strategy.py``) both call ``aggregation_weights``:

- ``"all"``: every reply at its weight (unguarded FedAvg);
- ``"exclude-negative"``: the replies paid >= 0, at their weight;
- ``"reward-weighted"``: every reply at weight x max(reward, 0) (a reply paid <= 0 drops out).

An unscored round (``rewards`` None: fewer than two replies) takes every reply. The simulator's fourth
mode, ``"honest"`` (the paper's oracle), is not a rule over replies: it averages the clients' honest
updates, which no server sees (``fl/rounds.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import torch

from ..errors import InputError
from ..tensors import StateDict


def _all(rewards: Mapping[str, float], weights: Mapping[str, float]) -> dict[str, float]:
    return dict(weights)


def _exclude_negative(rewards: Mapping[str, float], weights: Mapping[str, float]) -> dict[str, float]:
    return {who: w for who, w in weights.items() if rewards[who] >= 0.0}


def _reward_weighted(rewards: Mapping[str, float], weights: Mapping[str, float]) -> dict[str, float]:
    return {who: w * max(rewards[who], 0.0) for who, w in weights.items()}


SELECTION_RULES: dict[str, Callable[[Mapping[str, float], Mapping[str, float]], dict[str, float]]] = {
    "all": _all, "exclude-negative": _exclude_negative, "reward-weighted": _reward_weighted}
"""Mode -> rule (rewards, weights) -> the weights of the replies kept."""
REPLY_AGGREGATIONS: tuple[str, ...] = tuple(SELECTION_RULES)


def aggregation_weights(mode: str, rewards: Mapping[str, float] | None,
                        weights: Mapping[str, float]) -> dict[str, float]:
    """Reply id -> weight in the new global model, for the replies the mode keeps (weight > 0), sorted by id.

    ``rewards``: reply id -> KFCA reward (None: the round was not scored, every reply is kept);
    ``weights``: reply id -> its weight without KFCA (its number of examples). Empty: no reply is kept,
    the global model stays as it was."""
    if mode not in SELECTION_RULES:
        raise InputError(f"aggregation must be one of {REPLY_AGGREGATIONS}, got {mode!r}")
    if rewards is not None and set(rewards) != set(weights):
        raise InputError(f"rewards and weights name different replies: {sorted(set(rewards) ^ set(weights))[:5]}")
    kept = dict(weights) if rewards is None else SELECTION_RULES[mode](rewards, weights)
    return {who: float(kept[who]) for who in sorted(kept) if kept[who] > 0}


def fedavg(global_state: Mapping[str, torch.Tensor],
           updates: Sequence[tuple[str, Mapping[str, torch.Tensor], float]]) -> StateDict:
    """The new global adapter from ``(id, update, weight)`` triples (weight: number of examples, or a
    rule's weight).

    Summed in sorted id order in float32, so any input order gives the same bits."""
    total = sum(n for _, _, n in updates)
    if total <= 0:
        raise InputError("FedAvg needs at least one update with examples")
    out = {}
    for name, g in global_state.items():
        acc = torch.zeros_like(g, dtype=torch.float32)
        for _, upd, n in sorted(updates, key=lambda item: item[0]):
            acc += upd[name].float() * (n / total)
        out[name] = (g.float() + acc).to(g.dtype)
    return out
