"""Cached cooperative-game utilities: every coalition is evaluated at most once.

Players are ``0..n-1``; a coalition is a ``frozenset`` of player indices. A utility is either a
callable on such a frozenset or a mapping from frozensets to floats.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

import numpy as np

from ..errors import InputError

Coalition = frozenset
Utility = Callable[[frozenset], float] | Mapping


class CachedUtility:
    """A utility that remembers its values; ``num_evaluated`` counts distinct coalitions evaluated.

    ``batch`` (optional) evaluates many coalitions in one call (e.g. stacked models trained at
    once); ``prefetch`` uses it for the coalitions not cached yet.
    """

    def __init__(self, utility: Utility, n: int,
                 batch: Callable[[list[frozenset]], Iterable[float]] | None = None):
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
            raise InputError(f"the number of players must be a positive integer, got {n!r}")
        if not (callable(utility) or isinstance(utility, Mapping)):
            raise InputError("a utility must be a callable on frozensets or a mapping frozenset -> float")
        self.n = int(n)
        self._utility = utility
        self._batch = batch
        self._values: dict[frozenset, float] = {}

    @property
    def num_evaluated(self) -> int:
        return len(self._values)

    def _check(self, coalition: Iterable[int]) -> frozenset:
        s = frozenset(int(i) for i in coalition)
        if any(not 0 <= i < self.n for i in s):
            raise InputError(f"coalition {sorted(s)} has players outside 0..{self.n - 1}")
        return s

    def _store(self, s: frozenset, value) -> float:
        value = float(value)
        if not np.isfinite(value):
            raise InputError(f"utility of coalition {sorted(s)} is not finite ({value})")
        self._values[s] = value
        return value

    def __call__(self, coalition: Iterable[int]) -> float:
        s = self._check(coalition)
        if s in self._values:
            return self._values[s]
        if isinstance(self._utility, Mapping):
            if s not in self._utility:
                raise InputError(f"the utility mapping has no value for coalition {sorted(s)}")
            return self._store(s, self._utility[s])
        return self._store(s, self._utility(s))

    def prefetch(self, coalitions: Iterable[Iterable[int]]) -> None:
        """Evaluate the uncached coalitions among ``coalitions`` with one batch call (if any)."""
        if self._batch is None:
            return
        todo = list(dict.fromkeys(s for s in map(self._check, coalitions) if s not in self._values))
        if todo:
            for s, value in zip(todo, self._batch(todo), strict=True):
                self._store(s, value)


def as_cached(utility: Utility | CachedUtility, n: int) -> CachedUtility:
    """Wrap ``utility`` unless it already is a ``CachedUtility`` (whose cache is then shared)."""
    if isinstance(utility, CachedUtility):
        if utility.n != n:
            raise InputError(f"the cached utility has {utility.n} players, not {n}")
        return utility
    return CachedUtility(utility, n)
