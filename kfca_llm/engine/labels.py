"""KFCA-D's launcher: clients' labels on a shared data set (one task per example) -> integer counts.

The label counterpart of a backend: it holds one round's labels, compacted for the numba kernels of
``kfca_llm.kernels.labels.cpu``, and returns ``stats.LabelCounts``; ``stats.label_pair_payments``
turns them into floats. Labels are small next to adapter updates: there is one implementation.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..kernels.labels import cpu as labels_kernels
from ..partition import check_penalty, partition_classes, scoring_partition
from .stats import LabelCounts


class LabelRound:
    """The labels of one round, [clients, tasks], and the counts of its scored pairs.

    ``rows``: one label array per client, all of one length, every label already checked to lie in
    ``[0, num_labels)``. The partition of the tasks is fixed here (``seed``, ``bonus_fraction``); a round
    too small for non-empty bonus and penalty sets is refused with an ``InputError``.
    """

    def __init__(self, rows: Sequence[np.ndarray], num_labels: int, *, seed: int, bonus_fraction: float):
        self.num_labels = num_labels
        self.seed = seed
        self.bonus_fraction = bonus_fraction
        self.n_tasks = len(rows[0])
        self.partition = scoring_partition(self.n_tasks, seed=seed, bonus_fraction=bonus_fraction)
        self.labels = labels_kernels.compact_labels(rows, num_labels)

    def disagreements(self) -> np.ndarray:
        """int64 [n, n]: tasks where each two clients' labels differ (copy detection)."""
        return labels_kernels.label_disagreements(self.labels)

    def round_counts(self, pairs: np.ndarray, penalty: str) -> LabelCounts:
        """Counts of the ordered pairs ([P, 2] client indices), with the ``penalty`` mode's penalty matches."""
        check_penalty(penalty)
        part = self.partition
        n_bonus, m1, m2 = part.bonus.size, part.penalty_1.size, part.penalty_2.size
        classes = partition_classes(np.arange(self.n_tasks), self.seed, self.bonus_fraction)
        joints, bonus_agreements = labels_kernels.label_pair_counts(self.labels, classes, pairs, self.num_labels)
        if penalty == "expected":
            frequencies = labels_kernels.label_penalty_histograms(self.labels, classes, self.num_labels)
            matches = np.einsum("pl,pl->p", frequencies[pairs[:, 0], 0], frequencies[pairs[:, 1], 1])
            penalty_pairs = m1 * m2
        else:
            matches = labels_kernels.label_sampled_matches(self.labels, part.bonus, part.penalty_1, part.penalty_2,
                                                           pairs, self.seed)
            penalty_pairs = n_bonus
        return LabelCounts(np.array([n_bonus, m1, m2], dtype=np.int64), joints, bonus_agreements, matches,
                           penalty_pairs)
