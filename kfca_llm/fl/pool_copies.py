"""Copy detection across rounds for the peer pool (``fl.peer_pool``): a submission identical or near-identical to a
pool entry of the window (the absolute rule on every bit), or, on a fixed 4,096-bit sketch, to any earlier
submission of the run (its own included: ``stale``), is a copy; the round's duplicate policy pays it as a group whose
other members were paid already.

A match with an earlier submission of the scorer's *own* participant is a replay only where the two agree on every
sign (``PoolSettings.own_replay_limit``, default ``OWN_REPLAY_MAX_DISAGREEMENT``, ``fl.pool_evidence.own_replays_only``;
on the sketch beyond the window, every sketch bit; a dynamic data order may loosen it to 2%) and, under that default,
on their sampled values (``fl.pool_values``, pool rule 11): a client that trains again on the same samples
(FlowerTune's static data order, ``train.dynamic-data-seed = false``) from a newer global lands close to its earlier
update, often within the 2% that tells a copy of *another* participant, in our recipes never on all of its signs
(``benchmarks/honest_repeats.py``), in Flower's own app on all of them late in the schedule, never on its values.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import numpy as np

from ..engine.duplicates import DuplicateGroup, DuplicatePair, DuplicateRule, apply_duplicate_policy, disagreement_counts, find_duplicates

SKETCH_WORDS = 128
OWN_REPLAY_MAX_DISAGREEMENT = 0.0
"""The default fraction of signs in which a submission may differ from an earlier one of its own participant and still
be a replay of it (``PoolSettings.own_replay_limit``): none (a copy of another participant's:
``DuplicateRule.max_disagreement``, 2%). Retrained on the same samples at FlowerTune's learning rates, an honest
client's updates came within 3 of 32,768 signs of each other late in training (lag 1; 448 of 1,864 pairs within 2%),
so any looser limit takes honest repeats for replays sooner or later; a replay of an update's bytes differs in none
(benchmarks/ROBUSTNESS.md, "Honest repeats")."""
DYNAMIC_ORDER_OWN_REPLAY_LIMIT = 0.02
"""The limit where clients train on other samples at every participation (``train.dynamic-data-seed = true``): their
updates of different rounds were at least 25% apart (benchmarks/ROBUSTNESS.md), so rule 3's 2% also catches a replay
with a few signs turned."""


def sketch(words: np.ndarray) -> np.ndarray:
    """A fixed sample of ``SKETCH_WORDS`` words (4,096 sign bits) spread over the update: the long memory of
    copy detection (512 bytes a submission)."""
    words = np.asarray(words, dtype=np.int32)
    stride = max(1, words.size // SKETCH_WORDS)
    return np.ascontiguousarray(words[::stride][:SKETCH_WORDS])


def set_bits(words: np.ndarray) -> int:
    """How many bits of the int32 ``words`` are set (a mask's task bits, the signs two sketches differ in)."""
    return int(np.unpackbits(np.ascontiguousarray(words).view(np.uint8)).sum())


def sketch_copies_of(signs: np.ndarray, clients: Sequence[str], checked: set[str],
                     matches: Callable[[np.ndarray], list[tuple[str, float]]]) -> tuple[DuplicateGroup, ...]:
    """Groups of a submission and the submissions older than the window its sketch copies (``matches``: the pool's
    ``sketch_copies`` for this round: (entry, agreement) of each earlier submission the words match)."""
    out = []
    for k, client in enumerate(clients):
        if client not in checked:
            continue
        found = matches(signs[k])
        if found:
            pairs = tuple(DuplicatePair(client, name, agreement, "near") for name, agreement in found)
            out.append(DuplicateGroup(tuple(sorted({client, *(name for name, _ in found)})), pairs))
    return tuple(out)


def pool_copies_of(counts, names: Sequence[str], n_round: int, checked: set[str], rule: DuplicateRule
                   ) -> tuple[DuplicateGroup, ...]:
    """Groups of one participant and the pool entries it copies (identical or absolute rule only: the
    one-factor model of in-round detection does not hold across rounds)."""
    disagreements = disagreement_counts(counts)
    tasks = int(counts.sizes.sum())
    absolute = dataclasses.replace(rule, min_clients=max(len(names) + 1, rule.min_clients))
    out = []
    pool_rows = list(range(n_round, len(names)))
    for i, client in enumerate(names[:n_round]):
        if client not in checked:
            continue
        chosen = [i, *pool_rows]
        found = find_duplicates([names[k] for k in chosen], disagreements[np.ix_(chosen, chosen)], tasks, absolute)
        pairs = tuple(p for g in found if client in g.clients for p in g.pairs if client in (p.client, p.peer))
        if pairs:
            members = sorted({client, *(p.peer if p.client == client else p.client for p in pairs)})
            out.append(DuplicateGroup(tuple(members), pairs))
    return tuple(out)


def apply_pool_policy(rewards: dict[str, float], in_round: Sequence[DuplicateGroup],
                      pool_copies: Sequence[DuplicateGroup], policy: str) -> dict[str, float]:
    """The round's policy on in-round groups; a copy of a pool entry is paid as the policy pays a group whose
    other members were paid already: zero under ``zero`` and ``split`` (its share went to the entry's round),
    unchanged under ``flag``."""
    out = apply_duplicate_policy(rewards, in_round, policy)
    if policy == "flag":
        return out
    for group in pool_copies:
        for client in group.clients:
            if client in out:
                out[client] = min(out[client], 0.0)
    return out

