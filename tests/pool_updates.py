"""Updates of a two-participants-per-round federation, shared by the peer-pool and reference tests.

Updates share a persistent direction (what honest updates of nearby rounds share) plus a per-round one and
each client's own noise, so earlier rounds' honest updates agree with today's beyond chance. A module beside
the tests (imported as ``pool_updates``), not ``tests.test_peer_pool``: an installed top-level ``tests``
package (trl 0.8.1 ships one) would shadow ours.
"""

import numpy as np

SHAPE = (48, 64)
PERSISTENT = np.random.default_rng(99).standard_normal(SHAPE)


def honest(client: int, t: int) -> dict[str, np.ndarray]:
    this_round = np.random.default_rng(1000 + t).standard_normal(SHAPE)
    own = np.random.default_rng(7919 * client + t).standard_normal(SHAPE)
    return {"w": (0.6 * PERSISTENT + 0.6 * this_round + own).astype(np.float32)}


def round_updates(t: int, clients, deviations=None) -> dict[str, dict[str, np.ndarray]]:
    out = {}
    for c in clients:
        update = honest(c, t)
        kind = (deviations or {}).get(c)
        if kind == "flip":
            update = {"w": -update["w"]}
        elif kind == "zero":
            update = {"w": np.zeros(SHAPE, np.float32)}
        elif callable(kind):
            update = kind(t)
        out[f"c{c:02d}"] = update
    return out


# 10 clients, two per round, client 3 flips whenever it trains (rounds 8, 11, 14: beside 1, 6, 9).
SCHEDULE = {t: ((2 * t) % 10, (2 * t + 1) % 10) for t in range(1, 8)} | {8: (1, 3), 9: (0, 4), 10: (5, 7),
                                                                         11: (3, 6), 12: (2, 8), 13: (0, 5),
                                                                         14: (3, 9)}
