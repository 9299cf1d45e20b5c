"""A round's submissions -> KFCA rewards: one ``score_updates`` call on one seeded task partition.

Every client sends one submission (its honest update, or its attack if it is a fixed attacker) and is
scored against ``kfca.peers`` peers among the other clients' submissions. The attack-analysis client
also sends one submission per listed strategy side by side; each is scored against the same honest
peers and none is ever another client's peer.

Copy detection (``kfca.duplicates``) within the round runs among the real submissions only (every client's
one submission): the analysis client's side-by-side strategies are hypothetical alternatives of one client
(``stale`` equals its honest update in round 1), so they are never grouped with each other or with their
own client's update. Against the peer pool (rounds with too few peers, ``fl.peer_pool``) each side-by-side
submission is checked as a real one would be: a ``lagged:K`` or ``stale`` replay of the client's own pool
entry is a copy, an own resubmission, scored without the pool (on its in-round peers only) as a real lagged node
is (its reward in ``strategy_rewards``; such groups are not listed in ``duplicates``, which holds real submissions
only).
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from ..api import pack_updates
from ..engine.duplicates import DuplicateRule
from .aggregate import WeakVerdicts
from .peer_pool import PeerPool, PoolSettings, score_with_pool
from .pool_close import ClosingRound, close_round
from .pool_copies import DYNAMIC_ORDER_OWN_REPLAY_LIMIT, OWN_REPLAY_MAX_DISAGREEMENT
from .pool_settings import POOL_KEYS
from .pool_settle import Settlement
from .pool_values import value_sketch
from .reference import reference_signs
from ..errors import InputError, NoTasksError
from ..recipe import KfcaConfig, Recipe
from ..tensors import StateDict
from .records import PairRecord, wait_for_device
from .seeds import derive_seed


@dataclass(frozen=True)
class Submission:
    """One update the server receives in a round."""

    client: str
    strategy: str
    """``honest``, or the attack spec that made it."""
    update: StateDict
    num_examples: int
    analysis: bool = False
    """A side-by-side submission of the attack-analysis client (any strategy but its honest update):
    scored against honest peers, never a peer itself, averaged in only with ``kfca.aggregate = "all"``."""

    @property
    def id(self) -> str:
        return f"{self.client}/{self.strategy}" if self.analysis else self.client

    @property
    def honest(self) -> bool:
        return self.strategy == "honest"


@dataclass(frozen=True)
class RoundScores:
    strategy_rewards: dict[str, float]
    """The analysis client's strategy -> reward (its honest update included, as ``honest``)."""
    honest_rewards: dict[str, float]
    fixed_attacker_rewards: dict[str, float]
    """Rewards after the ``kfca.duplicates`` policy (as are ``honest_rewards`` and the analysis client's
    ``honest`` strategy)."""
    pairs: list[PairRecord]
    categorical_world: bool
    duplicates: list[dict]
    """Groups of copies among the real submissions (``DuplicateGroup.to_dict``), with each member's
    unadjusted reward under ``unadjusted_rewards``."""
    pack_s: float = 0.0
    """Seconds spent packing the submissions into sign bits (the rest of ``score_round`` is scoring)."""
    undetermined: list[str] = field(default_factory=list)
    """Clients paid with fewer than ``kfca.min-peers`` distinct peers (``fl.peer_pool``)."""
    pool_peers: dict[str, list[str]] = field(default_factory=dict)
    """Submission id -> the pool entries (``client@round``) it was scored against (only those that had any)."""
    strategy_copies: list[str] = field(default_factory=list)
    """The analysis client's strategies found to copy an earlier round's submission (``fl.peer_pool``)."""
    strategy_own_resubmissions: list[str] = field(default_factory=list)
    """Those of ``strategy_copies`` that copied only the client's own earlier submissions: scored without the pool
    (the others were paid under ``kfca.duplicates``)."""
    verdicts: WeakVerdicts | None = None
    """The submissions (by id) paid with the peer pool, for the aggregation's weak-verdict rule (``fl.aggregate``)."""
    settlements: list[Settlement] = field(default_factory=list)
    """Clients of earlier undetermined rounds this round's pool settled (``fl.pool_settle``)."""
    charged_back: dict[str, float] = field(default_factory=dict)
    """Fixed attacker -> what its reward was charged for resubmitting an update of its own (``fl.peer_pool``)."""


def choose_peers(candidates: Sequence[str], count: int | None, seed: int) -> list[str]:
    """``count`` peers (all when None or more than there are) drawn from ``candidates``, sorted."""
    if count is None or count >= len(candidates):
        return sorted(candidates)
    rng = np.random.default_rng(seed)
    return sorted(rng.choice(sorted(candidates), size=count, replace=False).tolist())


def pool_settings(recipe: Recipe) -> PoolSettings:
    """The recipe's pool: its ``kfca.*`` keys (``fl.pool_settings.POOL_KEYS``), the own-replay limit its clients' data
    order allows, and pool rule 15 unless ``kfca.aggregate = "honest"``: that rule reads the round after a disagreeing
    pair, which FedAvg moved with the pair's updates, and an honest-only aggregation never moves the model with a
    deviation (the round after then steps on from the honest update alone, and tells nothing of the pair)."""
    return PoolSettings(**{name: getattr(recipe.kfca, key.argument) for name, key in POOL_KEYS.items()},
                        own_replay_limit=own_replay_limit(recipe), next_round=recipe.kfca.aggregate != "honest")


def pool_arguments(settings: PoolSettings) -> dict[str, int | float]:
    """``settings`` as ``KFCAStrategy``'s keyword arguments."""
    return {**{key.argument: getattr(settings, name) for name, key in POOL_KEYS.items()},
            "own_replay_limit": settings.own_replay_limit}


def own_replay_limit(recipe: Recipe) -> float:
    """``PoolSettings.own_replay_limit`` for the recipe's data order (``train.dynamic-data-seed``)."""
    return DYNAMIC_ORDER_OWN_REPLAY_LIMIT if recipe.train.dynamic_data_seed else OWN_REPLAY_MAX_DISAGREEMENT


def score_round(submissions: Sequence[Submission], *, analysis_client: str | None, kfca: KfcaConfig,
                kfca_seed: int, pool: PeerPool | None = None, round_: int = 0, reference: StateDict | None = None,
                public: Sequence[StateDict] = (), gaps: Sequence[int] = (),
                changes: Mapping[int, StateDict] | None = None, closes_run: bool = False) -> RoundScores:
    """Score a round's submissions (see the module docstring); with a ``pool``, clients with too few peers
    borrow earlier rounds' submissions (``fl.peer_pool``) and the round's real submissions join the pool;
    ``reference``: the server's reference update (``fl.reference``), a peer of every submission with weight
    ``kfca.reference-weight``; ``public``: the global adapter's recent steps the server sent (oldest first), the
    public trajectory the in-round penalty is conditioned on (``kfca.public-steps``; pool peers are not), with
    ``gaps`` the participants' reception gaps (``engine.public.public_spans``) and ``changes`` the global's change
    over those longer than the steps (``engine.public.public_planes``); ``closes_run``: the run's last round,
    which settles every earlier undetermined round its pool can (``fl.pool_settle``)."""
    participants = {s.client: s for s in submissions if not s.analysis}
    if len(participants) != sum(not s.analysis for s in submissions):
        raise InputError("a client sent more than one submission outside the attack analysis")
    if any(s.analysis and s.client != analysis_client for s in submissions):
        raise InputError("only the attack-analysis client sends side-by-side submissions")
    ids = sorted(participants)
    by_id = {s.id: s for s in submissions}
    pairs: list[tuple[str, str]] = []
    for position, cid in enumerate(ids):
        if cid != analysis_client:
            others = [c for c in ids if c != cid]
            pairs += [(cid, peer) for peer in choose_peers(others, kfca.peers, derive_seed(kfca_seed, position))]
    analysed = [s for s in submissions if s.client == analysis_client]
    if analysed:
        others = [c for c in ids if c != analysis_client]
        honest_others = [c for c in others if participants[c].honest] or others
        peers = choose_peers(honest_others, kfca.peers, derive_seed(kfca_seed, ids.index(analysis_client)))
        pairs += [(s.id, peer) for s in analysed for peer in peers]

    updates = {cid: participants[cid].update for cid in ids}
    updates.update({s.id: s.update for s in submissions if s.analysis})
    started = time.perf_counter()
    packer = pack_updates(updates)
    wait_for_device(packer.buffers.device)
    pack_s = time.perf_counter() - started
    signs = None if reference is None or not kfca.reference_weight else reference_signs(packer, reference)
    values = ({c: value_sketch(update, packer.layout) for c, update in updates.items()}
              if pool is not None and pool.settings.judges_values else {})
    planes = packer.public_planes(public, kfca.conditioning, gaps, changes) if public else None
    try:
        pooled = score_with_pool(packer, pool, round_, pairs=pairs, seed=kfca_seed, penalty=kfca.penalty,
                                 bonus_fraction=kfca.bonus_fraction, duplicates=kfca.duplicates, copy_candidates=ids,
                                 owners={s.id: s.client for s in analysed}, reference=signs,
                                 reference_weight=kfca.reference_weight, public=planes, values=values)
    except NoTasksError as exc:
        return _unscorable(round_, exc, analysed, participants, pack_s)
    report = pooled.report
    settlements = [] if pool is None else close_round(pool, ClosingRound.scored(
        packer, round_, pooled, words=packer.words(), participants=ids, seed=kfca_seed, penalty=kfca.penalty,
        bonus_fraction=kfca.bonus_fraction, duplicates=kfca.duplicates, duplicate_rule=DuplicateRule(),
        owners={s.id: s.client for s in analysed}, values=values, closes_run=closes_run))
    # Pool pairs (peer ``client@round``) are never honest pairs: the pool does not know who attacked then.
    records = [PairRecord(submission=c, client=by_id[c].client, strategy=by_id[c].strategy, peer=p,
                          payment=float(report.pairwise[(c, p)]),
                          delta=np.asarray(report.pair_delta[(c, p)], dtype=float).tolist(),
                          categorical_world=bool(report.pair_categorical_world[(c, p)]),
                          honest_pair=p in participants and by_id[c].honest and participants[p].honest)
               for c, p in report.pairwise]

    reward = report.rewards  # each submission's mean payment over its peers, after the duplicate policy
    return RoundScores(
        strategy_rewards={s.strategy: reward[s.id] for s in analysed},
        honest_rewards={cid: reward[cid] for cid in ids if participants[cid].honest},
        fixed_attacker_rewards={cid: reward[cid] for cid in ids if not participants[cid].honest},
        pairs=records,
        categorical_world=all(r.categorical_world for r in records if r.honest_pair),
        duplicates=[{**g.to_dict(), "unadjusted_rewards": {c: report.unadjusted_rewards[c] for c in g.clients
                                                           if c in report.unadjusted_rewards}}  # not pool entries
                    for g in report.duplicates if not any(c in by_id and by_id[c].analysis for c in g.clients)],
        pack_s=pack_s, undetermined=list(pooled.undetermined),
        strategy_copies=[s.strategy for s in analysed if any(s.id in g.clients for g in pooled.pool_copies)],
        strategy_own_resubmissions=[s.strategy for s in analysed if s.id in pooled.own_resubmissions],
        pool_peers={c: peers for c, peers in pooled.pool_peers.items() if peers}, verdicts=pooled.verdicts,
        settlements=settlements, charged_back=dict(pooled.charged_back))


def _unscorable(round_: int, reason: NoTasksError, analysed: Sequence[Submission],
                participants: Mapping[str, Submission], pack_s: float) -> RoundScores:
    """A round with no informative coordinate (every submission zero there: zero attackers sampled together): KFCA
    cannot form its task sets, so every submission is paid 0, nobody joins the pool, and the round is undetermined
    for all (``KFCAStrategy`` records such a round as not scored); the run goes on."""
    warnings.warn(f"round {round_} not scored, every submission paid 0: {reason}", stacklevel=3)
    return RoundScores(strategy_rewards={s.strategy: 0.0 for s in analysed},
                       honest_rewards={c: 0.0 for c, s in sorted(participants.items()) if s.honest},
                       fixed_attacker_rewards={c: 0.0 for c, s in sorted(participants.items()) if not s.honest},
                       pairs=[], categorical_world=True, duplicates=[], pack_s=pack_s,
                       undetermined=sorted(participants))
