"""Seeded, counter-based task partition and penalty draws shared by every kernel and backend.

Every implementation (the numpy references, the numba kernels on the CPU, the Triton kernels on the
GPU, the label mechanism) derives the bonus/penalty partition and the sampled penalty tasks from the
functions below, so that the same seed gives bit-identical integer statistics everywhere. The
checks of a round's parameters (seed, bonus fraction, penalty mode) live here too.

Contract (all arithmetic on uint32, wrapping, unless said otherwise):

* ``mix32(x)``: the "lowbias32" integer hash
  ``x ^= x >> 16; x *= 0x7FEB352D; x ^= x >> 15; x *= 0x846CA68B; x ^= x >> 16``.
* Partition of task (coordinate) ``c``: ``u = mix32(c ^ partition_key(seed))``;
  bonus if ``u < t_bonus``, penalty set M_1 if ``u < t_m1``, else penalty set M_2
  (``partition_thresholds``). No index array of size d is ever needed.
* Sampled penalty of the ordered pair (i, j) for bonus task ``c``:
  ``u1 = mix32(c ^ pair_key(seed, i, j))``, ``u2 = mix32(u1 ^ DRAW2_SALT)``,
  ``rank1 = (u1 * m1) >> 32`` and ``rank2 = (u2 * m2) >> 32`` (64-bit products), where m1/m2
  are the sizes of M_1/M_2; p1 is the rank1-th task of M_1 in increasing coordinate order, p2
  the rank2-th of M_2. This reproduces "p1 ~ U(M_1), p2 ~ U(M_2) per bonus task and peer" of the
  paper's Algorithm 1 from a counter, so any backend can regenerate the same draws.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Literal, get_args

import numpy as np

from .errors import InputError

PARTITION_SALT = 0x243F6A88
PENALTY_SALT = 0xB7E15162
DRAW2_SALT = 0x9E3779B9
MAX_CLIENTS = 1 << 16
MAX_TASKS = 1 << 32  # a task index must fit the uint32 hash

# How a pair's penalty is computed: "expected", the exact expectation over M_1 x M_2 (from counts);
# "sampled", the paper's draws (Algorithm 1), one (p1, p2) per bonus task, regenerated from counters.
Penalty = Literal["expected", "sampled"]
PENALTY_MODES: tuple[str, ...] = get_args(Penalty)

BONUS, PENALTY_1, PENALTY_2 = 0, 1, 2

_M32 = 0xFFFFFFFF


def mix32(x):
    """lowbias32 hash; accepts a Python int or a uint32 numpy array."""
    if isinstance(x, (int, np.integer)):
        x = int(x) & _M32
        x ^= x >> 16
        x = (x * 0x7FEB352D) & _M32
        x ^= x >> 15
        x = (x * 0x846CA68B) & _M32
        x ^= x >> 16
        return x
    x = np.asarray(x, dtype=np.uint32)
    x = x ^ (x >> np.uint32(16))
    x = x * np.uint32(0x7FEB352D)
    x = x ^ (x >> np.uint32(15))
    x = x * np.uint32(0x846CA68B)
    return x ^ (x >> np.uint32(16))


def check_seed(seed: int) -> int:
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or not 0 <= int(seed) <= _M32:
        raise InputError(f"seed must be an integer in [0, 2**32), got {seed!r}")
    return int(seed)


def check_bonus_fraction(bonus_fraction: float) -> float:
    if isinstance(bonus_fraction, bool) or not isinstance(bonus_fraction, (int, float, np.integer, np.floating)):
        raise InputError(f"bonus_fraction must be a number strictly between 0 and 1, got {bonus_fraction!r}")
    f = float(bonus_fraction)
    if not 0.0 < f < 1.0:
        raise InputError(f"bonus_fraction must lie strictly between 0 and 1, got {bonus_fraction!r}")
    return f


def check_penalty(penalty: str) -> str:
    """``penalty`` if it names one of ``PENALTY_MODES``, else an ``InputError`` listing them."""
    if penalty not in PENALTY_MODES:
        raise InputError(f"penalty must be one of {PENALTY_MODES}, got {penalty!r}")
    return penalty


def partition_key(seed: int) -> int:
    return mix32(check_seed(seed) ^ PARTITION_SALT)


def pair_key(seed: int, i: int, j: int) -> int:
    """Key of the sampled-penalty stream of the ordered pair (i, j) of client indices."""
    if not (0 <= i < MAX_CLIENTS and 0 <= j < MAX_CLIENTS):
        raise InputError(f"client indices must be below {MAX_CLIENTS}")
    return mix32(mix32(check_seed(seed) ^ PENALTY_SALT) ^ ((i << 16) | j))


def pair_keys(seed: int, pairs: np.ndarray) -> np.ndarray:
    """uint32 [P]: ``pair_key(seed, i, j)`` of each ordered pair of ``pairs`` ([P, 2]), vectorised."""
    pairs = np.asarray(pairs, dtype=np.int64).reshape(-1, 2)
    if pairs.size and (pairs.min() < 0 or pairs.max() >= MAX_CLIENTS):
        raise InputError(f"client indices must be below {MAX_CLIENTS}")
    stream = np.uint32(mix32(check_seed(seed) ^ PENALTY_SALT))
    return mix32(stream ^ ((pairs[:, 0] << 16) | pairs[:, 1]).astype(np.uint32))


def partition_thresholds(bonus_fraction: float) -> tuple[int, int]:
    """(t_bonus, t_m1): a task is bonus if u < t_bonus, in M_1 if u < t_m1, else in M_2."""
    f = check_bonus_fraction(bonus_fraction)
    t_bonus = min(max(int(round(f * 2**32)), 1), _M32)
    t_m1 = t_bonus + ((2**32 - t_bonus) >> 1)
    return t_bonus, t_m1


def partition_params(seed: int, bonus_fraction: float) -> tuple[int, int, int]:
    """(key, t_bonus, t_m1): the integers a kernel classifies task coordinates with (see above)."""
    return (partition_key(seed), *partition_thresholds(bonus_fraction))


def partition_classes(coords: np.ndarray, seed: int, bonus_fraction: float) -> np.ndarray:
    """Class (BONUS, PENALTY_1, PENALTY_2) of each task coordinate, as uint8."""
    coords = np.asarray(coords)
    if coords.size and (coords.min() < 0 or coords.max() > _M32):
        raise InputError("task coordinates must lie in [0, 2**32)")
    t_bonus, t_m1 = partition_thresholds(bonus_fraction)
    u = mix32(coords.astype(np.uint32) ^ np.uint32(partition_key(seed)))
    out = np.full(u.shape, PENALTY_2, dtype=np.uint8)
    out[u < np.uint32(t_m1)] = PENALTY_1
    out[u < np.uint32(t_bonus)] = BONUS
    return out


@dataclass(frozen=True)
class TaskPartition:
    """Disjoint task index sets (increasing order) of the MTPP mechanism."""

    bonus: np.ndarray
    """int64 indices of the bonus tasks M_b."""
    penalty_1: np.ndarray
    """int64 indices of the first client's penalty tasks M_1."""
    penalty_2: np.ndarray
    """int64 indices of the peer's penalty tasks M_2."""


def task_partition(num_tasks: int, *, seed: int = 0, bonus_fraction: float = 0.5) -> TaskPartition:
    """Seeded bonus / M_1 / M_2 split of tasks 0..num_tasks-1.

    Uses ``partition_classes`` on the task indices, so it is exactly the partition the packed engine
    applies when task k is coordinate k.
    """
    if isinstance(num_tasks, bool) or not isinstance(num_tasks, (int, np.integer)) or not 0 <= num_tasks <= MAX_TASKS:
        raise InputError(f"num_tasks must be an integer in [0, 2**32], got {num_tasks!r}")
    return _cached_partition(int(num_tasks), check_seed(seed), check_bonus_fraction(bonus_fraction))


def scoring_partition(num_tasks: int, *, seed: int = 0, bonus_fraction: float = 0.5) -> TaskPartition:
    """``task_partition``, refused when a set is empty (no payment can be formed from it)."""
    part = task_partition(num_tasks, seed=seed, bonus_fraction=bonus_fraction)
    n_bonus, m1, m2 = part.bonus.size, part.penalty_1.size, part.penalty_2.size
    if min(n_bonus, m1, m2) == 0:
        raise InputError(
            f"{num_tasks} tasks are too few to form non-empty bonus and penalty sets "
            f"(bonus {n_bonus}, M_1 {m1}, M_2 {m2}) with seed {seed} and bonus_fraction {bonus_fraction}"
        )
    return part


@lru_cache(maxsize=8)
def _cached_partition(num_tasks: int, seed: int, bonus_fraction: float) -> TaskPartition:
    """One partition per round, not one per scored pair (read-only arrays: callers share them)."""
    classes = partition_classes(np.arange(num_tasks, dtype=np.int64), seed, bonus_fraction)
    sets = [np.flatnonzero(classes == c).astype(np.int64) for c in (BONUS, PENALTY_1, PENALTY_2)]
    for indices in sets:
        indices.flags.writeable = False
    return TaskPartition(*sets)


def penalty_ranks(bonus_coords: np.ndarray, seed: int, i: int, j: int, m1: int, m2: int):
    """Ranks (into M_1 and M_2, increasing coordinate order) of the sampled penalty tasks."""
    u1 = mix32(np.asarray(bonus_coords).astype(np.uint32) ^ np.uint32(pair_key(seed, i, j)))
    u2 = mix32(u1 ^ np.uint32(DRAW2_SALT))
    rank1 = (u1.astype(np.uint64) * np.uint64(m1)) >> np.uint64(32)
    rank2 = (u2.astype(np.uint64) * np.uint64(m2)) >> np.uint64(32)
    return rank1.astype(np.int64), rank2.astype(np.int64)


PEER_SALT = 0x452821E6


def sample_peers(n_clients: int, peers: int | None, seed: int) -> list[list[int]]:
    """Peers of each client: all others (``peers=None``) or ``peers`` of them drawn from the seed.

    Client i ranks every other client j by ``mix32(mix32(seed ^ PEER_SALT) ^ (i << 16 | j))`` (ties
    by j) and keeps the ``peers`` smallest: a counter-based draw that no library version can change.
    """
    pairs = peer_pairs(n_clients, peers, seed)
    per_client = len(pairs) // n_clients
    return pairs[:, 1].reshape(n_clients, per_client).tolist()


def peer_pairs(n_clients: int, peers: int | None, seed: int) -> np.ndarray:
    """int64 [n_clients * k, 2]: the ordered (client, peer) pairs of ``sample_peers``, client-major."""
    if peers is not None and (isinstance(peers, bool) or not isinstance(peers, (int, np.integer))
                              or not 1 <= peers < n_clients):
        raise InputError(f"peers must be an integer in [1, {n_clients - 1}] for {n_clients} clients, got {peers!r}")
    clients = np.arange(n_clients, dtype=np.int64)
    if peers is None:
        others = np.broadcast_to(np.arange(n_clients - 1, dtype=np.int64), (n_clients, n_clients - 1))
        chosen = others + (others >= clients[:, None])
    else:
        key = np.uint32(mix32(check_seed(seed) ^ PEER_SALT))
        chosen = np.empty((n_clients, int(peers)), dtype=np.int64)
        for first in range(0, n_clients, 1024):  # blocks of rows: memory O(1024 n), not O(n^2)
            rows = clients[first:first + 1024]
            rank = mix32(key ^ ((rows[:, None] << 16) | clients[None, :]).astype(np.uint32)).astype(np.int64)
            rank[np.arange(rows.size), rows] = 1 << 32  # never one's own peer
            order = (rank << 16) | clients  # (hash, j) as one unique integer: ties broken by j
            smallest = np.argpartition(order, int(peers) - 1, axis=1)[:, : int(peers)]
            chosen[rows] = np.sort(smallest, axis=1)
    return np.stack([np.repeat(clients, chosen.shape[1]), chosen.reshape(-1)], axis=1)
