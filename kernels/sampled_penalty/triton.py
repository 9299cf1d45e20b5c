"""The paper's sampled penalty on the GPU (Triton): matches of the seeded (p1, p2) draws per ordered pair.

The work is fixed by the contract (``kfca_llm.partition``): one draw per bonus task c and ordered pair,
``u1 = mix32(c ^ key)``, ``u2 = mix32(u1 ^ salt)``, two ranks, and the two clients' signs at the drawn
members of M_1 and M_2. ``triton_sets.py`` counts the members of the bonus set, M_1 and M_2 per block of
words (the one host sync: the totals size the buffers). Then one of two ways, one module each:

* **per pair** (``triton_per_pair.py``; few pairs): each client's signs on M_1 and M_2 compacted once into
  bitstreams ("planes") and the bonus tasks listed once, then tiles of pairs x bonus tasks on a persistent
  grid, each draw two hashes and two lookups;
* **shared between pairs** (``triton_shared.py``; many pairs): a pair's draw for bonus task c hashes
  ``c ^ key``, so pairs whose keys agree above the coordinates' span hash the same values; each value is
  hashed and its two columns of every client's signs loaded once, and each pair only tests its bonus bit
  and two sign bits per value.

``sampled_matches`` takes the way with fewer random lookups unless told.
"""

from __future__ import annotations

import numpy as np
import torch

from ..intrinsics.triton import round_params
from .triton_per_pair import penalty_planes, per_pair_matches
from .triton_sets import plane_tile, set_offsets
from .triton_shared import MAX_SHARED_CLIENTS, lookup_pairs, penalty_columns, shared_draws_pay_off, shared_matches

__all__ = ["MAX_SHARED_CLIENTS", "draws_shared", "lookup_pairs", "penalty_columns", "penalty_planes", "sampled_matches",
           "shared_draws_pay_off"]


def draws_shared(n_clients: int, n_pairs: int, n_bonus: int, keys: np.ndarray, n_words: int) -> bool:
    """The way ``sampled_matches`` draws when not told: shared between pairs where the shared kernel takes the
    round (up to ``MAX_SHARED_CLIENTS`` clients) and it needs fewer random lookups (``shared_draws_pay_off``)."""
    return n_clients <= MAX_SHARED_CLIENTS and shared_draws_pay_off(n_pairs, n_bonus, keys, n_words)


def sampled_matches(signs: torch.Tensor, task: torch.Tensor, key: int, t_bonus: int, t_m1: int,
                    pairs, pair_keys, draw2_salt: int, shared: bool | None = None) -> torch.Tensor:
    """int64 [P] on the device: matches of the seeded (p1, p2) draws of each ordered pair (i, j).

    ``pair_keys[k]`` is the draw key of ``pairs[k]``. ``shared``: draw with values shared between pairs
    (``triton_shared``, up to ``MAX_SHARED_CLIENTS`` clients) or per pair (``triton_per_pair``); None
    chooses the one with fewer random lookups. Raises ``ValueError`` when M_1 or M_2 is empty.
    """
    pairs = np.asarray(pairs, dtype=np.int64).reshape(-1, 2)
    keys = np.asarray(pair_keys, dtype=np.int64).reshape(-1)
    device = signs.device
    n_pairs = len(pairs)
    if not n_pairs:
        return torch.zeros(0, dtype=torch.int64, device=device)
    sizes = set_offsets(signs, task, round_params(key, t_bonus, t_m1, device), plane_tile(signs)[0])
    _, n_bonus, m1, m2 = sizes
    if m1 == 0 or m2 == 0:
        raise ValueError(f"too few informative coordinates to form non-empty penalty sets (M_1 {m1}, M_2 {m2})")
    params = round_params(key, t_bonus, t_m1, device, m1, m2, draw2_salt)
    if shared is None:
        shared = draws_shared(signs.shape[0], n_pairs, n_bonus, keys, signs.shape[1])
    elif shared and signs.shape[0] > MAX_SHARED_CLIENTS:
        raise ValueError(f"shared draws take at most {MAX_SHARED_CLIENTS} clients, got {signs.shape[0]}")
    draw = shared_matches if shared else per_pair_matches
    return draw(signs, task, (key, t_bonus, t_m1), sizes, params, pairs, keys)
