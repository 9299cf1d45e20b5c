"""What a federation records per round and reports at the end (JSON-serialisable dataclasses)."""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from .peer_pool import parse_pool_name
from ..recipe import Recipe, recipe_to_dict


@dataclass
class PairRecord:
    """One scored pair: a submission against a peer's submission."""

    submission: str
    """Score id of the submission: the client id, or ``client/spec`` for an attack-analysis submission."""
    client: str
    strategy: str
    """``honest`` or the attack spec that made the submission."""
    peer: str
    payment: float
    delta: list[list[float]]
    """Empirical 2x2 delta matrix over (negative, non-negative) reports."""
    categorical_world: bool
    honest_pair: bool
    """Both sides are honest updates (no attack on either side)."""


@dataclass
class RoundRecord:
    round: int
    learning_rate: float
    clients: list[str]
    analysis_client: str | None
    """The attack-analysis client (submits every listed strategy side by side), if the recipe lists attacks."""
    kfca_seed: int
    strategy_rewards: dict[str, float]
    """Attack spec -> reward of the analysis client's submission made by it (mean over its peers)."""
    honest_rewards: dict[str, float]
    """Honest client id -> reward of its honest update (the analysis client's is its ``honest`` one)."""
    fixed_attacker_rewards: dict[str, float]
    """Fixed attacker id -> reward of the attack it submitted."""
    fixed_attacks: dict[str, str]
    """Fixed attackers sampled this round: client id -> attack spec."""
    pairs: list[PairRecord]
    categorical_world: bool
    """Every pair of honest updates scored this round satisfies the categorical-world condition."""
    loss_before: dict[str, float]
    loss_after: dict[str, float]
    num_examples: dict[str, int]
    duplicates: list[dict[str, Any]] = field(default_factory=list)
    """Groups of copies among the round's real submissions (clients, flagged pairs, unadjusted rewards);
    the rewards above are after the recipe's ``kfca.duplicates`` policy."""
    aggregated: dict[str, float] = field(default_factory=dict)
    """Submission id -> its share of the round's FedAvg (the honest clients' for ``kfca.aggregate =
    "honest"``); a submission absent was left out."""
    heldout: dict[str, float] | None = None
    """The new global adapter on the held-out rows: ``loss``, ``accuracy`` (exact answers), ``rows`` (None:
    not evaluated)."""
    undetermined: list[str] = field(default_factory=list)
    """Clients paid with fewer than ``kfca.min-peers`` distinct peers (``fl.peer_pool``): their rewards
    cannot tell who deviated."""
    pool_peers: dict[str, list[str]] = field(default_factory=dict)
    """Submission id -> the earlier rounds' submissions (``client@round``) it was also scored against."""
    strategy_copies: list[str] = field(default_factory=list)
    """Attack specs whose submission copied an earlier round's (``fl.peer_pool``)."""
    strategy_own_resubmissions: list[str] = field(default_factory=list)
    """Those of ``strategy_copies`` that replayed only the analysis client's own earlier submissions (``lagged:K``,
    ``stale``): scored without the pool, on the round's peers; the others were paid under ``kfca.duplicates``."""
    settlements: list[dict[str, Any]] = field(default_factory=list)
    """Clients of earlier undetermined rounds this round's pool settled (``fl.pool_settle.Settlement.to_dict``); the
    settled round's ``honest_rewards`` / ``fixed_attacker_rewards`` hold the settled reward from then on."""
    charged_back: dict[str, float] = field(default_factory=dict)
    """Client -> what was charged back from its reward for resubmitting an update of its own (``fl.peer_pool``: paid
    at most 0, less what the resubmitted update had been paid; 0: charged already, or not paid)."""

    def honest_delta(self) -> list[list[float]] | None:
        """Mean empirical delta matrix over the round's pairs of honest updates (None: no such pair, e.g. one
        honest client trained beside an attacker)."""
        deltas = [p.delta for p in self.pairs if p.honest_pair]
        return np.mean(np.asarray(deltas, dtype=float), axis=0).tolist() if deltas else None

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> RoundRecord:
        d = dict(d)
        d["pairs"] = [PairRecord(**p) for p in d["pairs"]]
        return RoundRecord(**d)


@dataclass(frozen=True)
class RoundTiming:
    """Where one round's time went on the main process: wall seconds per phase, and peak device memory.

    The phases are disjoint laps of one clock; ``wall_s`` is the whole round, so the rest (making the
    attacks' submissions, a round observer such as the valuation, the held-out evaluation, waiting for
    other processes) is
    ``wall_s`` minus their sum.
    """

    train_s: float
    """Local training of this process's clients, and gathering every client's update."""
    pack_s: float
    """Packing the round's submissions into sign bits."""
    score_s: float
    """Counts, penalty, copy detection, rewards and the pair records."""
    aggregate_s: float
    """FedAvg."""
    save_s: float
    """Adapters, client updates and resume state written this round (0 without an output folder)."""
    wall_s: float
    peak_device_bytes: int | None
    """``torch.cuda.max_memory_allocated`` over the round (reset when it starts); None on the CPU."""


def aggregated_shares(weights: Mapping[str, float]) -> dict[str, float]:
    """Weights -> shares of their total (sorted ids; empty stays empty)."""
    total = sum(weights.values())
    return {who: w / total for who, w in sorted(weights.items())} if total > 0 else {}


def wait_for_device(device) -> None:
    """Wait for the work queued on a CUDA device (kernels run asynchronously), so that a clock read
    after it charges that work to the phase that queued it; nothing to wait for elsewhere."""
    if device is not None and getattr(device, "type", None) == "cuda":
        import torch

        torch.cuda.synchronize(device)


class RoundClock:
    """Laps of one round's phases on ``device`` (a torch device), and its peak memory on CUDA."""

    def __init__(self, device):
        self.device = device
        self._cuda = getattr(device, "type", None) == "cuda"
        if self._cuda:
            import torch

            torch.cuda.reset_peak_memory_stats(device)
        self.started = self._last = self._now()

    def _now(self) -> float:
        wait_for_device(self.device)
        return time.perf_counter()

    def lap(self) -> float:
        """Seconds since the previous lap (or the start)."""
        now = self._now()
        elapsed, self._last = now - self._last, now
        return elapsed

    def timing(self, *, train_s: float, pack_s: float, score_s: float, aggregate_s: float,
               save_s: float) -> RoundTiming:
        peak = None
        if self._cuda:
            import torch

            peak = int(torch.cuda.max_memory_allocated(self.device))
        return RoundTiming(train_s=train_s, pack_s=pack_s, score_s=score_s, aggregate_s=aggregate_s, save_s=save_s,
                           wall_s=self._now() - self.started, peak_device_bytes=peak)


def timing_note(timings: list[Mapping[str, Any]]) -> str:
    """One line for a summary: mean seconds per phase over the timed rounds, and the peak device memory."""
    def mean(key: str) -> float:
        return float(np.mean([t[key] for t in timings]))

    line = (f"time per round (mean of {len(timings)}): training {mean('train_s'):.3g} s, packing "
            f"{mean('pack_s'):.3g} s, scoring {mean('score_s'):.3g} s, aggregating {mean('aggregate_s'):.3g} s, "
            f"saving {mean('save_s'):.3g} s, of {mean('wall_s'):.3g} s")
    peaks = [t["peak_device_bytes"] for t in timings if t["peak_device_bytes"] is not None]
    return line + (f"; peak device memory {max(peaks) / 2**30:.3g} GiB" if peaks else "")


@dataclass
class FederationResult:
    recipe: Recipe
    seed: int
    strategies: list[str]
    rounds: list[RoundRecord] = field(default_factory=list)
    timings: dict[int, RoundTiming] = field(default_factory=dict)
    """Round -> where its time went: the rounds run by this process (not those resumed from disk). Kept
    apart from the records, which two runs of one seed reproduce bit for bit."""

    def mean_strategy_rewards(self) -> dict[str, float]:
        """Attack spec -> mean reward over rounds."""
        return {s: float(np.mean([r.strategy_rewards[s] for r in self.rounds])) for s in self.strategies}

    def mean_honest_reward(self) -> float:
        values = [v for r in self.rounds for v in r.honest_rewards.values()]
        return float(np.mean(values)) if values else math.nan

    def fixed_attackers(self) -> dict[str, dict[str, Any]]:
        """Fixed attacker id -> spec, mean reward and per-round rewards (None where not sampled)."""
        specs = {cid: spec for r in self.rounds for cid, spec in r.fixed_attacks.items()}
        out = {}
        for cid, spec in sorted(specs.items()):
            per_round = [r.fixed_attacker_rewards.get(cid) for r in self.rounds]
            seen = [v for v in per_round if v is not None]
            out[cid] = {"spec": spec, "mean_reward": float(np.mean(seen)) if seen else math.nan,
                        "per_round": per_round}
        return out

    def flagged_clients(self) -> dict[str, list[int]]:
        """Client id -> the rounds in which it was in a group of copies (sorted by id)."""
        out: dict[str, list[int]] = {}
        for r in self.rounds:
            for group in r.duplicates:
                for c in group["clients"]:
                    if parse_pool_name(c) is None:  # an earlier round's entry the client copied is not flagged again
                        out.setdefault(c, []).append(r.round)
        return dict(sorted(out.items()))

    def heldout(self) -> dict[str, Any] | None:
        """The global adapter's held-out loss and exact-answer accuracy after each round (None: not evaluated)."""
        if not self.rounds or any(r.heldout is None for r in self.rounds):
            return None
        return {"rows": self.rounds[0].heldout["rows"], "loss": [r.heldout["loss"] for r in self.rounds],
                "accuracy": [r.heldout["accuracy"] for r in self.rounds]}

    def to_report(self) -> dict[str, Any]:
        return {
            "domain": self.recipe.domain,
            "recipe": self.recipe.name,
            "seed": self.seed,
            "rounds": len(self.rounds),
            "strategies": {s: {"mean_reward": m, "per_round": [r.strategy_rewards[s] for r in self.rounds],
                               "copy_rounds": [r.round for r in self.rounds if s in r.strategy_copies],
                               "own_resubmission_rounds": [r.round for r in self.rounds
                                                           if s in r.strategy_own_resubmissions]}
                           for s, m in self.mean_strategy_rewards().items()},
            "honest_clients": {"mean_reward": self.mean_honest_reward(),
                               "per_round": [r.honest_rewards for r in self.rounds]},
            "fixed_attackers": self.fixed_attackers(),
            "duplicates": {"policy": self.recipe.kfca.duplicates, "flagged": self.flagged_clients()},
            "categorical_world": [r.categorical_world for r in self.rounds],
            "heldout": self.heldout(),
            "undetermined_rounds": [r.round for r in self.rounds if r.undetermined],
            "delta": [r.honest_delta() for r in self.rounds],
            "timing": [asdict(self.timings[r.round]) if r.round in self.timings else None for r in self.rounds],
            "round_records": [asdict(r) for r in self.rounds],
            "config": recipe_to_dict(self.recipe),
        }
