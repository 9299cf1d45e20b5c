"""Copy detection: clients whose reports are identical, or far closer to each other than honest clients are.

KFCA pays agreement, so a client that resubmits another's update (exactly, or with a little noise) or a
group that submits one shared update is paid for agreeing with itself. Everything here works on the
pairwise disagreement counts (tasks where two clients' reports differ), which the scorer already has:
for sign reports they come from the Gram matrices (``disagreement_counts``), so detection costs no
second pass over the packed bits.

Rules (``DuplicateRule``), for a pair with disagreement rate ``d`` over the round's T tasks:

* **identical**: ``d == 0`` (exact integer counts: the packed sign words of the two clients are equal);
* **near (absolute)**: ``d <= max_disagreement`` (default 2%: a copy with noise of 5% of the tensor's
  std flips about 1.6% of the signs; independent honest clients are nowhere near);
* **near (excess correlation + third parties)**, with at least ``min_clients`` clients in the round: the
  pair is far more correlated than what each client shares with the round, *and* the round's other
  clients see one of the two as a noisy copy of the other.

  The first test: sign agreement gives the correlation ``rho = cos(pi d)`` (Sheppard's formula, exact for
  Gaussian coordinates); honest clients follow a one-factor model ``rho_ij = lambda_i lambda_j`` (a shared
  signal plus private noise), with each ``lambda`` fitted by a median over the client's other peers
  (robust to its copy partner). The pair's *excess* is the correlation of the two private parts,
  ``(rho_ij - lambda_i lambda_j) / sqrt((1 - lambda_i^2)(1 - lambda_j^2))``: about 0 for honest pairs,
  whatever their quality, and close to 1 for a copy (0.77-0.80 for one with 20% of its signs flipped). It
  must exceed ``min_excess_correlation`` by ``min_sigma`` standard errors of ``rho``.

  The one-factor model does not always hold: honest clients that share more than the round's signal (tiny
  clients with one data generator, two hospitals with similar patients) reach excess correlations of
  0.6-0.8. The second test is calibrated on the round itself and tells them from a copy: a copy ``c``
  of ``v`` with a fraction ``f = d_vc`` of its signs changed disagrees with every third client ``k`` of the
  round as ``d_ck = f + (1 - 2f) d_vk`` (it knows nothing ``v`` does not). The *copy fit*
  ``sum_k (d_ck - d_vk) / (f sum_k (1 - 2 d_vk))`` is therefore 1 for a copy (in its better orientation)
  and far from 1 for two honest clients with shared data, whose disagreements with third parties are about
  equal (fit near 0). Flagged when the fit, ``copy_fit_sigma`` standard errors below its estimate, still
  reaches ``min_copy_fit`` (a fit too noisy to tell the two apart never flags),
  asked of at least ``min_witnesses`` third clients that agree with the source beyond chance (with two, an
  honest pair of a tiny federation fitted the copy model). Two more ways past this test, both measured
  against the same round: a pair with no witness at all (colluders on one random update agree with nobody
  else), and a pair differing on at most ``max_relative_disagreement`` (15%) of what the round's median pair
  differs on (Gaussian noise changes the signs where the source's values are small, where it agrees with
  others least, so third parties see such a copy as partly independent, fit about 0.5).
  This replaces an earlier fixed floor (pairs differing on at most 5% of the tasks), which let copies with
  more than 5% of their signs changed through.

A scale-dependent statistic (a robust z-score of ``d`` against the round's pairs) was not used: with
millions of coordinates the sampling noise of ``d`` vanishes, so such z-scores flag any structured
difference between honest clients (two strong clients agree more than two weak ones).

Small rounds: with two or three clients the one-factor model has no peer left to fit from (a copy
pair and a third client fit "two perfect clients and one noisy one" just as well), so only the
identical and absolute rules apply there. Flagged pairs are joined into groups (connected
components).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numba import prange

from ..errors import InputError
from ..kernels.numba_setup import configure_numba, serial_and_parallel
from .stats import RoundCounts

configure_numba()  # before the cache=True kernels below are defined

DUPLICATE_POLICIES = ("flag", "split", "zero")
IDENTICAL, NEAR = "identical", "near"


@dataclass(frozen=True)
class DuplicateRule:
    """Thresholds of copy detection (defaults calibrated in ``benchmarks/ROBUSTNESS.md``)."""

    max_disagreement: float = 0.02
    """A pair whose reports differ on at most this fraction of the tasks is a near duplicate."""
    min_excess_correlation: float = 0.5
    """Correlation of the two clients' private parts (after the shared signal) that makes a copy."""
    min_sigma: float = 3.0
    """The excess must clear ``min_excess_correlation`` by this many standard errors of ``rho``."""
    min_copy_fit: float = 0.75
    """Third-party test: the round's other clients see the pair as copy and source (fit 1: signs changed at random;
    about 0: clients sharing data), the fit ``copy_fit_sigma`` standard errors below its estimate reaching this."""
    copy_fit_sigma: float = 1.0
    """How many standard errors below its estimate the copy fit must still reach ``min_copy_fit``."""
    max_relative_disagreement: float = 0.15
    """... or the pair differs on at most this fraction of what the round's median pair differs on."""
    min_witnesses: int = 3
    """The third-party test needs this many other clients agreeing with the source beyond chance (1 - 2d >= 0.03)."""
    min_clients: int = 4
    """Rounds with fewer clients use only the identical and absolute rules."""
    excess_correlation: bool = True
    """False for reports whose agreement is not a sign agreement (e.g. categorical labels)."""

    def __post_init__(self):
        for name in ("max_disagreement", "min_excess_correlation", "min_copy_fit", "max_relative_disagreement"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value < 1.0:
                raise InputError(f"DuplicateRule.{name} must be a number in [0, 1), got {value!r}")
        for name in ("min_sigma", "copy_fit_sigma"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise InputError(f"DuplicateRule.{name} must be a number >= 0, got {value!r}")
        if isinstance(self.min_witnesses, bool) or not isinstance(self.min_witnesses, int) or self.min_witnesses < 1:
            raise InputError(f"DuplicateRule.min_witnesses must be an integer >= 1, got {self.min_witnesses!r}")
        if isinstance(self.min_clients, bool) or not isinstance(self.min_clients, int) or self.min_clients < 4:
            raise InputError(f"DuplicateRule.min_clients must be an integer >= 4, got {self.min_clients!r}")


@dataclass(frozen=True)
class DuplicatePair:
    client: str
    peer: str
    agreement: float
    """Fraction of the round's tasks on which the two reports agree."""
    reason: str
    """``identical`` or ``near``."""
    excess_correlation: float | None = None
    """Correlation of the two private parts (None where the round is too small to fit it)."""


@dataclass(frozen=True)
class DuplicateGroup:
    clients: tuple[str, ...]
    pairs: tuple[DuplicatePair, ...]
    note: str | None = None
    """How the group was paid when not by the round's policy (the peer pool's own resubmissions), else None."""

    def to_dict(self) -> dict:
        out = {"clients": list(self.clients),
               "pairs": [{"client": p.client, "peer": p.peer, "agreement": p.agreement, "reason": p.reason,
                          "excess_correlation": p.excess_correlation} for p in self.pairs]}
        return out if self.note is None else {**out, "note": self.note}


def check_duplicate_policy(policy: str) -> str:
    if not isinstance(policy, str) or policy not in DUPLICATE_POLICIES:
        raise InputError(f"duplicates must be one of {DUPLICATE_POLICIES}, got {policy!r}")
    return policy


def disagreement_counts(counts: RoundCounts) -> np.ndarray:
    """int64 [n, n]: tasks (all three sets) where clients i and j report differently."""
    both = counts.gram.sum(axis=0)
    negative = np.diag(both)
    return negative[:, None] + negative[None, :] - 2 * both


def find_duplicates(clients: Sequence[str], disagreements: np.ndarray, tasks: int,
                    rule: DuplicateRule = DuplicateRule()) -> tuple[DuplicateGroup, ...]:
    """Groups of clients whose reports are copies of each other (see the module docstring)."""
    n = len(clients)
    d = np.asarray(disagreements, dtype=np.int64)
    if d.shape != (n, n) or tasks <= 0:
        raise InputError(f"need an [{n}, {n}] disagreement matrix over a positive number of tasks")
    rate = d / tasks
    excess = _excess_correlation(rate, tasks) if rule.excess_correlation and n >= rule.min_clients else None
    identical = d == 0
    near = rate <= rule.max_disagreement
    if excess is not None:
        fit, fit_stderr = copy_fit(rate, tasks)
        witnesses = _witnesses(rate)
        # The lower bound: with few tasks the fit is too noisy to tell a copy (1) from clients sharing data (about 0),
        # and then it must not flag (honest pairs of one silo in the fidelity experiment's label skew, 1,350 tasks,
        # fit 0.0-0.45 with standard errors of 0.2-0.27, came within three of them of 0.75). Honest pairs of the
        # tiny federations reach fits of 0.61-0.69 with standard errors of 0.01: the bar stays at 0.75.
        fit = np.where(witnesses >= rule.min_witnesses, fit - rule.copy_fit_sigma * fit_stderr, -np.inf)
        # A pair that agrees with nobody else beyond chance (colluders on one random update) has no witness
        # to ask; its private parts are all it has.
        isolated = (witnesses == 0) & (witnesses.T == 0)
        # Gaussian noise changes the signs where the source's values are small, where it agrees with others
        # least: third parties see such a copy as partly independent (fit about 0.5), but it stays far closer
        # to its source than the round's pairs are to each other.
        close = rate <= rule.max_relative_disagreement * np.median(rate[np.triu_indices(n, 1)])
        near |= ((excess[0] - rule.min_sigma * excess[1] >= rule.min_excess_correlation)
                 & ((np.maximum(fit, fit.T) >= rule.min_copy_fit) | isolated | close))
    flagged = []
    for i, j in zip(*np.nonzero(np.triu(identical | near, k=1))):
        flagged.append(DuplicatePair(clients[i], clients[j], 1.0 - float(rate[i, j]),
                                     IDENTICAL if identical[i, j] else NEAR,
                                     None if excess is None else float(excess[0][i, j])))
    return _groups(flagged)


def apply_duplicate_policy(rewards: dict[str, float], groups: Sequence[DuplicateGroup],
                           policy: str) -> dict[str, float]:
    """Rewards after the policy: ``flag`` leaves them, ``split`` pays each group as one client (its
    mean reward shared by its members), ``zero`` pays a group nothing.

    A policy never raises a reward: a group of sign flippers keeps its negative rewards (``min`` with
    the policy's value), so copying cannot be used to soften a penalty.
    """
    check_duplicate_policy(policy)
    out = dict(rewards)
    if policy == "flag":
        return out
    for group in groups:
        members = [c for c in group.clients if c in out]
        if not members:
            continue
        share = 0.0 if policy == "zero" else float(np.mean([out[c] for c in members])) / len(members)
        for c in members:
            out[c] = min(out[c], share)
    return out


def _excess_correlation(rate: np.ndarray, tasks: int) -> tuple[np.ndarray, np.ndarray]:
    """(excess correlation, its standard error) of every pair under the one-factor model."""
    n = rate.shape[0]
    rho = np.cos(np.pi * rate)
    off = ~np.eye(n, dtype=bool)
    # Start from each client's median correlation scaled by the round's typical one, then refine
    # lambda_i = median_k rho_ik / lambda_k over informative peers (a peer with |lambda| near 0, a free
    # rider, says nothing about lambda_i; one copy partner is outvoted by the median).
    typical = np.sqrt(max(float(np.median(np.abs(rho[off]))), 1e-6))
    lam = np.median(rho[off].reshape(n, n - 1), axis=1) / typical
    lam = _REFINE_LOADINGS[n >= 400](rho, lam)  # a step costs about 3 ns x n^2; a launch 0.2-0.5 ms
    lam = np.clip(lam, -0.999, 0.999)
    private = np.sqrt(1.0 - lam ** 2)
    excess = (rho - np.outer(lam, lam)) / np.outer(private, private)
    # Binomial noise of the agreement rate, carried through rho = cos(pi d) (|d rho / d d| <= pi).
    stderr = np.pi * np.sqrt(rate * (1.0 - rate) / tasks + 1.0 / tasks ** 2) / np.outer(private, private)
    return excess, stderr


def _witnesses(rate: np.ndarray) -> np.ndarray:
    """int [s, c]: third clients k that agree with s beyond chance (1 - 2 d_sk >= 0.03), the copy fit's evidence."""
    informative = (1.0 - 2.0 * rate >= 0.03) & ~np.eye(rate.shape[0], dtype=bool)
    return informative.sum(axis=1)[:, None] - informative.astype(np.int64)


def copy_fit(rate: np.ndarray, tasks: int) -> tuple[np.ndarray, np.ndarray]:
    """(fit, its standard error) of every ordered pair (source s, copy c) from the round's third clients k:
    ``sum_k (d_ck - d_sk) / (d_sc sum_k (1 - 2 d_sk))``, 1 when c is s with a fraction d_sc of its signs changed
    at random (see the module docstring). Needs at least one third client."""
    n = rate.shape[0]
    rows = rate.sum(axis=1)  # the diagonal is 0, and d_cs = d_sc cancels in the numerator
    numerator = rows[None, :] - rows[:, None]
    denominator = rate * ((n - 2) - 2 * (rows[:, None] - rate))
    spread = rate * (1.0 - rate)
    variance = (spread.sum(axis=1)[None, :] + spread.sum(axis=1)[:, None] - 2 * spread) / tasks
    with np.errstate(divide="ignore", invalid="ignore"):
        fit = np.where(denominator > 0, numerator / denominator, -np.inf)
        stderr = np.where(denominator > 0, np.sqrt(variance) / denominator, 0.0)
    np.fill_diagonal(fit, -np.inf)
    return fit, stderr


def _refine_loadings(rho, lam):
    """Fixed point of lambda_i = median_k rho_ik / lambda_k over informative peers k != i (at most 50 steps).

    One compiled loop: as numpy calls it cost about 1.5 ms a round even for 5 clients (most of a small
    round). Every step is exact selection and IEEE arithmetic, as numpy does it (tests keep a numpy copy).
    """
    n = lam.size
    for _ in range(50):
        fit = np.zeros(n)
        for i in prange(n):
            ratios = np.empty(n)
            count = 0
            for k in range(n):
                if k != i and abs(lam[k]) >= 0.1:
                    ratios[count] = rho[i, k] / lam[k]
                    count += 1
            if count >= 2:
                fit[i] = np.median(ratios[:count])
        # Geometric damping: the plain update maps a common scale c to 1/c and oscillates.
        new = np.minimum(np.maximum(np.sign(fit) * np.sqrt(np.abs(fit * lam)), -0.999), 0.999)
        if np.all(np.abs(new - lam) <= 1e-6 + 1e-5 * np.abs(lam)):  # np.allclose(new, lam, atol=1e-6)
            break
        lam = new
    return lam


_REFINE_LOADINGS = serial_and_parallel(_refine_loadings)


def _groups(pairs: Sequence[DuplicatePair]) -> tuple[DuplicateGroup, ...]:
    parent: dict[str, str] = {}

    def root(c: str) -> str:
        while parent.setdefault(c, c) != c:
            c = parent[c]
        return c

    for p in pairs:
        a, b = root(p.client), root(p.peer)
        if a != b:
            parent[max(a, b)] = min(a, b)
    members: dict[str, list[str]] = {}
    for c in parent:
        members.setdefault(root(c), []).append(c)
    groups = []
    for root_id in sorted(members):
        group = tuple(sorted(members[root_id]))
        groups.append(DuplicateGroup(group, tuple(p for p in pairs if root(p.client) == root_id)))
    return tuple(groups)
