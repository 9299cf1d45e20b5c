"""FedAvg over a round's updates: ``global + sum_i n_i update_i / sum_i n_i``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from ..errors import InputError
from ..tensors import StateDict


def fedavg(global_state: Mapping[str, torch.Tensor],
           updates: Sequence[tuple[str, Mapping[str, torch.Tensor], int]]) -> StateDict:
    """The new global adapter from ``(id, update, num_examples)`` triples.

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
