"""Which replies the global model takes, with which weights (``aggregation_weights``), and FedAvg over them.

One rule, two front ends: ``kfca.aggregate`` of ``kfca-llm simulate`` (``fl/rounds.py``) and
``KFCAStrategy(aggregation=...)`` (``flower/strategy.py``) both call ``aggregation_weights``:

- ``"all"``: every reply at its weight (unguarded FedAvg);
- ``"exclude-negative"``: the replies paid >= 0, at their weight;
- ``"reward-weighted"``: every reply at weight x max(reward, 0) (a reply paid <= 0 drops out).

An unscored round (``rewards`` None: fewer than two replies) takes every reply. The simulator's fourth
mode, ``"honest"`` (the paper's oracle), is not a rule over replies: it averages the clients' honest
updates, which no server sees (``fl/rounds.py``).

**Weak verdicts** (``WEAK_VERDICT_RULES``, recipe key ``kfca.weak-verdict``, ``KFCAStrategy(weak_verdict=...)``).
A reply with fewer than ``min_peers`` in-round peers is paid against the peer pool too (``fl/peer_pool.py``);
while the pool is short that pooled reward is noisy, and with one in-round peer the in-round payment is the
same for both replies of a pair. What ``exclude-negative`` and ``reward-weighted`` do with such a reply:

- ``"trust-pool"``: its pooled reward alone decides (the rule before issue 29's follow-up);
- ``"exclude-undetermined"``: a reply the scoring marks undetermined (fewer than ``min_peers`` distinct peers
  in all) is left out whatever it was paid;
- ``"confirm-warm-up"``: while the pool is warming up for it (undetermined, or fewer than ``pool_peers``
  distinct pool participants of non-zero weight behind its reward) it is kept only if the mode keeps it on its
  in-round reward too (the round scored without the pool); afterwards the pooled reward alone;
- ``"confirm-always"``: the in-round test whenever the reply leaned on the pool.
- ``"round-peers-warm-up"``: while the pool is warming up for it, its in-round reward decides instead of the
  pooled one (both replies of a disagreeing pair of two are left out); afterwards the pooled reward alone.

A reply scored on ``min_peers`` in-round peers is never touched: a round in which every reply has them
aggregates exactly as under ``"trust-pool"``. ``"all"`` ignores the setting. The default was chosen by
measurement (``benchmarks/ROBUSTNESS.md``, "Weak verdicts").
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import torch

from ..errors import InputError
from ..tensors import StateDict


def _all(rewards: Mapping[str, float], weights: Mapping[str, float]) -> dict[str, float]:
    return dict(weights)


def _exclude_negative(rewards: Mapping[str, float], weights: Mapping[str, float]) -> dict[str, float]:
    return {who: w for who, w in weights.items() if rewards[who] >= 0.0}


def _reward_weighted(rewards: Mapping[str, float], weights: Mapping[str, float]) -> dict[str, float]:
    return {who: w * max(rewards[who], 0.0) for who, w in weights.items()}


SELECTION_RULES: dict[str, Callable[[Mapping[str, float], Mapping[str, float]], dict[str, float]]] = {
    "all": _all, "exclude-negative": _exclude_negative, "reward-weighted": _reward_weighted}
"""Mode -> rule (rewards, weights) -> the weights of the replies kept."""
REPLY_AGGREGATIONS: tuple[str, ...] = tuple(SELECTION_RULES)


WEAK_VERDICT_RULES: tuple[str, ...] = ("trust-pool", "exclude-undetermined", "confirm-warm-up", "confirm-always",
                                       "round-peers-warm-up")
"""What the rule does with a reply whose reward leans on the peer pool (see the module docstring)."""
DEFAULT_WEAK_VERDICT = "confirm-warm-up"


@dataclass(frozen=True)
class WeakVerdicts:
    """The replies whose reward leans on the peer pool, as the scoring returns them (``PooledRound.verdicts``)."""

    in_round_rewards: Mapping[str, float]
    """Reply -> its reward from its round's peers only (``SignPacker.score``), for every reply in ``short``."""
    short: frozenset[str] = frozenset()
    """Replies with fewer than ``min_peers`` in-round peers: their reward was computed with the pool."""
    warming: frozenset[str] = frozenset()
    """Of those, the replies the pool is still warming up for: undetermined, or fewer than ``pool_peers``
    distinct pool participants of non-zero weight behind the reward."""
    undetermined: frozenset[str] = frozenset()
    """Replies with fewer than ``min_peers`` distinct peers in all (in-round and pool)."""
    cautious: Mapping[str, float] = field(default_factory=dict)
    """Reply -> its cautious reward (``fl.pool_weights.cautious_means``), for the short replies the pool has a
    verdict on. Such a reply is kept only where that is >= 0 too: its pay may rest on its in-round peer read back,
    which a pool that ranked the pair wrong gives a deviator."""


def check_weak_verdict(rule: str) -> str:
    if rule not in WEAK_VERDICT_RULES:
        raise InputError(f"weak verdict rule must be one of {WEAK_VERDICT_RULES}, got {rule!r}")
    return rule


def _weak(rule: str, verdicts: WeakVerdicts) -> tuple[frozenset[str], frozenset[str], frozenset[str]]:
    """(replies left out whatever they were paid, replies that must also pass on their in-round reward, replies
    judged on their in-round reward instead of the pooled one)."""
    none = frozenset()
    if rule == "exclude-undetermined":
        return verdicts.undetermined, none, none
    if rule == "confirm-warm-up":
        return none, verdicts.warming, none
    if rule == "confirm-always":
        return none, verdicts.short, none
    if rule == "round-peers-warm-up":
        return none, none, verdicts.warming
    return none, none, none


def aggregation_weights(mode: str, rewards: Mapping[str, float] | None, weights: Mapping[str, float], *,
                        verdicts: WeakVerdicts | None = None, weak_verdict: str = DEFAULT_WEAK_VERDICT
                        ) -> dict[str, float]:
    """Reply id -> weight in the new global model, for the replies the mode keeps (weight > 0), sorted by id.

    ``rewards``: reply id -> KFCA reward (None: the round was not scored, every reply is kept);
    ``weights``: reply id -> its weight without KFCA (its number of examples); ``verdicts``: the replies paid
    with the peer pool, which ``weak_verdict`` (``WEAK_VERDICT_RULES``) may leave out (None: no reply leaned on
    the pool). Empty: no reply is kept, the global model stays as it was."""
    if mode not in SELECTION_RULES:
        raise InputError(f"aggregation must be one of {REPLY_AGGREGATIONS}, got {mode!r}")
    check_weak_verdict(weak_verdict)
    if rewards is not None and set(rewards) != set(weights):
        raise InputError(f"rewards and weights name different replies: {sorted(set(rewards) ^ set(weights))[:5]}")
    if rewards is None:
        return {who: float(weights[who]) for who in sorted(weights) if weights[who] > 0}
    out = confirm = in_round_only = frozenset()
    if verdicts is not None and mode != "all":
        out, confirm, in_round_only = _weak(weak_verdict, verdicts)
        out |= {who for who, value in verdicts.cautious.items() if value < 0 and who not in in_round_only}
        # An undetermined reply is not paid (0), but its round still scored it: that is what the model can go by.
        rewards = {who: verdicts.in_round_rewards[who] if who in in_round_only or who in verdicts.undetermined else r
                   for who, r in rewards.items()}
    kept = SELECTION_RULES[mode](rewards, weights)
    if out or confirm:
        confirm = sorted(confirm & set(kept))
        # The mode's own rule on the in-round rewards: a reply it would not keep on them is left out.
        in_round = SELECTION_RULES[mode]({who: verdicts.in_round_rewards[who] for who in confirm},
                                         {who: weights[who] for who in confirm}) if confirm else {}
        kept = {who: w for who, w in kept.items()
                if who not in out and (who not in confirm or in_round.get(who, 0.0) > 0)}
    return {who: float(kept[who]) for who in sorted(kept) if kept[who] > 0}


def fedavg(global_state: Mapping[str, torch.Tensor],
           updates: Sequence[tuple[str, Mapping[str, torch.Tensor], float]]) -> StateDict:
    """The new global adapter from ``(id, update, weight)`` triples (weight: number of examples, or a
    rule's weight).

    Summed in sorted id order in float32, so any input order gives the same bits."""
    total = sum(n for _, _, n in updates)
    if total <= 0:
        raise InputError("FedAvg needs at least one update with examples")
    out = {}
    for name, g in global_state.items():
        acc = torch.zeros_like(g, dtype=torch.float32)
        for _, upd, n in sorted(updates, key=lambda item: item[0]):
            acc += upd[name].float() * (n / total)
        out[name] = (g.float() + acc).to(g.dtype)
    return out
