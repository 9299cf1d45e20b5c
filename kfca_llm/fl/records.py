"""What a federation records per round and reports at the end (JSON-serialisable dataclasses)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

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

    def honest_delta(self) -> list[list[float]]:
        """Mean empirical delta matrix over the round's pairs of honest updates."""
        deltas = [p.delta for p in self.pairs if p.honest_pair]
        return np.mean(np.asarray(deltas, dtype=float), axis=0).tolist()

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> RoundRecord:
        d = dict(d)
        d["pairs"] = [PairRecord(**p) for p in d["pairs"]]
        return RoundRecord(**d)


@dataclass
class FederationResult:
    recipe: Recipe
    seed: int
    strategies: list[str]
    rounds: list[RoundRecord] = field(default_factory=list)

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
                    out.setdefault(c, []).append(r.round)
        return dict(sorted(out.items()))

    def to_report(self) -> dict[str, Any]:
        return {
            "domain": self.recipe.domain,
            "recipe": self.recipe.name,
            "seed": self.seed,
            "rounds": len(self.rounds),
            "strategies": {s: {"mean_reward": m, "per_round": [r.strategy_rewards[s] for r in self.rounds]}
                           for s, m in self.mean_strategy_rewards().items()},
            "honest_clients": {"mean_reward": self.mean_honest_reward(),
                               "per_round": [r.honest_rewards for r in self.rounds]},
            "fixed_attackers": self.fixed_attackers(),
            "duplicates": {"policy": self.recipe.kfca.duplicates, "flagged": self.flagged_clients()},
            "categorical_world": [r.categorical_world for r in self.rounds],
            "delta": [r.honest_delta() for r in self.rounds],
            "round_records": [asdict(r) for r in self.rounds],
            "config": recipe_to_dict(self.recipe),
        }
