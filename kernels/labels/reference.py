"""KFCA-D's integer counts in plain numpy: what the CPU kernels of ``labels.cpu`` must reproduce.

``labels`` is [clients, tasks] of integer labels in [0, num_labels); ``classes`` the task classes of
``kfca_llm.partition.partition_classes``; ``pairs`` ordered (client, peer) rows.
"""

from __future__ import annotations

import numpy as np

from kfca_llm.partition import BONUS, PENALTY_1, PENALTY_2, penalty_ranks


def label_disagreements(labels: np.ndarray) -> np.ndarray:
    """int64 [n, n]: tasks where each two clients' labels differ."""
    return (labels[:, None, :] != labels[None, :, :]).sum(axis=2, dtype=np.int64)


def label_pair_counts(labels: np.ndarray, classes: np.ndarray, pairs: np.ndarray,
                      num_labels: int) -> tuple[np.ndarray, np.ndarray]:
    """(joint tables [P, L, L] over every task, agreements on the bonus tasks [P]) of the ordered pairs."""
    joints, agreements = [], []
    for i, j in pairs:
        a, b = labels[i].astype(np.int64), labels[j].astype(np.int64)
        joints.append(np.bincount(a * num_labels + b, minlength=num_labels ** 2).reshape(num_labels, num_labels))
        agreements.append(np.count_nonzero((classes == BONUS) & (a == b)))
    return np.array(joints, dtype=np.int64).reshape(-1, num_labels, num_labels), np.array(agreements, dtype=np.int64)


def label_penalty_histograms(labels: np.ndarray, classes: np.ndarray, num_labels: int) -> np.ndarray:
    """int64 [n, 2, L]: each client's label counts on M_1 and M_2."""
    return np.array([[np.bincount(row[classes == s], minlength=num_labels) for s in (PENALTY_1, PENALTY_2)]
                     for row in labels.astype(np.int64)], dtype=np.int64)


def label_sampled_matches(labels: np.ndarray, bonus: np.ndarray, penalty_1: np.ndarray, penalty_2: np.ndarray,
                          pairs: np.ndarray, seed: int) -> np.ndarray:
    """int64 [P]: equal labels at the sampled penalty tasks (Algorithm 1's draws) of each ordered pair."""
    out = np.zeros(len(pairs), dtype=np.int64)
    for k, (i, j) in enumerate(pairs):
        rank1, rank2 = penalty_ranks(bonus, seed, int(i), int(j), penalty_1.size, penalty_2.size)
        out[k] = np.count_nonzero(labels[i, penalty_1[rank1]] == labels[j, penalty_2[rank2]])
    return out
