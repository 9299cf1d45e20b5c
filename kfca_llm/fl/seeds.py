"""Derived seeds: one independent, stable stream per purpose, round and client."""

from __future__ import annotations

import numpy as np

# Purposes of derived seeds: one independent stream per use, so adding a use never shifts another.
SAMPLE, TRAIN, ATTACK, KFCA = 1, 2, 3, 4
REFERENCE_TRAIN = 5  # the server's reference client (kfca.reference-rows)
SET_ASIDE = 6  # the rows a real data set sets aside for the held-out evaluation and the reference (data.py)


def derive_seed(seed: int, *keys: int) -> int:
    """A 32-bit seed derived from ``seed`` and integer keys (numpy SeedSequence: well mixed, stable)."""
    return int(np.random.SeedSequence([int(seed), *map(int, keys)]).generate_state(1, np.uint32)[0])


def train_seed(seed: int, server_round: int, partition: int, dynamic: bool) -> int:
    """The seed of a client's local training (data order, dropout): by the round with ``train.dynamic-data-seed``,
    else the same in every round it trains (FlowerTune's default; round key 0, never a real round)."""
    return derive_seed(seed, TRAIN, server_round if dynamic else 0, partition)


def client_id(index: int) -> str:
    return f"client-{index:03d}"
