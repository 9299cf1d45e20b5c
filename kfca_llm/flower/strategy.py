"""``KFCAStrategy``: KFCA rewards inside any Flower ServerApp (message API), wrapping another strategy.

    strategy = KFCAStrategy(FedAvg(fraction_train=0.5), ledger="rewards.sqlite")
    result = strategy.start(grid=grid, initial_arrays=arrays, num_rounds=3)

Each training round: ``configure_train`` remembers the arrays sent to each node and what the grid says
of each node (its registered public key and name); ``aggregate_train`` checks every reply, maps it to a
participant identity (``identity.py``; a second node claiming a participant already in the round is
refused), turns each valid reply into the participant's update (reply minus what it was sent), packs each
participant's arrays as one batch into ``SignPacker`` (only packed sign bits are kept), scores the round with
KFCA-QP, writes the round to the ledger in one transaction (the packed signs first, with ``keep_signs``),
and hands the replies (all, the non-negative ones, or re-weighted by reward) to the wrapped strategy. With
``receipt_key``, every paid participant gets a signed receipt of the round (``receipts.py``) in the next
message its node is sent (the evaluate round's or the next training round's).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterable, Mapping
from logging import INFO, WARNING

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.common import log
from flwr.serverapp import Grid
from flwr.serverapp.exception import InconsistentMessageReplies
from flwr.serverapp.strategy import FedAvg, Result, Strategy

from .. import __version__
from ..engine.duplicates import DuplicateRule
from ..engine.public import PublicConditioning
from ..errors import InputError, NoTasksError
from ..fl.aggregate import DEFAULT_WEAK_VERDICT, REPLY_AGGREGATIONS, aggregation_weights, check_weak_verdict
from ..fl.peer_pool import PeerPool, PoolSettings
from ..fl.pool_close import copy_groups
from ..fl.pool_settle import Settlement
from ..fl.reference import DEFAULT_REFERENCE_WEIGHT, check_reference_weight, reference_signs
from ..fl.seeds import KFCA, derive_seed
from ..report import RewardReport
from ..tensors import is_float
from .audit import update_sha256
from .identity import Claim, Identity
from .ledger import Ledger, global_path
from .ledger_rows import FailureRow, Participant, RewardRow, RoundEntry, SettlementRow, sha256_hex
from .logs import ledger_round_numbers
from .options import check_conditioning, check_options, takes_keyword
from .pool_replay import CLOSES_RUN
from .receipts import ReceiptPost, load_or_create_server_key, public_hex
from .recompute import scoring_settings
from .replies import (check_reply, identify, num_examples, packed_updates, reply_weight, reweighted, sent_arrays,
                      stop_if_every_node_failed)
from .round_scoring import (REWARD_METRIC_PREFIX, PublicTrajectory, ScoredRound, arrays_to_bytes, resumed_pool,
                            round_metrics, score_round, stored_global_arrays)

AGGREGATION_MODES = REPLY_AGGREGATIONS

__all__ = ["AGGREGATION_MODES", "KFCAStrategy", "REWARD_METRIC_PREFIX", "update_sha256"]


class KFCAStrategy(Strategy):
    """Pays every training reply by KFCA-QP and aggregates through the wrapped strategy.

    Payments go to participant identities (``identity``: ``"auto"``, ``"public-key"``, ``"declared"``; see
    ``kfca_llm.flower.identity``), not to Flower node ids. Rewards are reported three ways:
    ``kfca.reward.<participant>`` in the round's aggregated train metrics, ``self.rewards`` (round ->
    {participant: reward}; ``self.node_ids`` maps them to the round's node ids), and the ledger (None: no
    ledger). ``peers``: peers per participant (at most the other valid ones of the round; None: all).
    ``aggregation``: ``"all"`` (the wrapped strategy sees every valid reply), ``"exclude-negative"``
    (replies paid < 0 are dropped first), ``"reward-weighted"`` (the wrapped strategy's weight key is
    scaled by max(reward, 0)). A round with fewer than two valid replies is not scored (recorded as such)
    and every valid reply is aggregated. ``weak_verdict``: what those two modes do with a reply paid against the
    peer pool while the pool's verdict is weak (``kfca_llm.fl.aggregate.WEAK_VERDICT_RULES``, the rule of
    ``kfca-llm simulate``'s ``kfca.weak-verdict`` too).

    ``duplicates``: payment of copies found among a round's valid replies (``kfca_llm.engine.duplicates``):
    ``"zero"`` (default), ``"split"``, ``"flag"``; the ledger also keeps each unadjusted reward and group.

    Peers beyond the round (``kfca_llm.fl.peer_pool``): a participant with fewer than ``min_peers`` other valid
    participants in its round is also scored against up to ``pool_peers`` other participants' sign words from
    the last ``pool_window`` rounds, whose verdict as a whole weighs ``pool_weight`` against an in-round peer's 1
    (the in-round peer read the way the pool's verdict says: ``fl.pool_weights``); ``min_peers=0`` scores rounds
    alone, as before the pool. A participant left with fewer than ``min_peers`` distinct peers is *undetermined*
    and not paid (ledger ``rounds.undetermined``, metric ``kfca.undetermined``, a warning in the log).
    ``own_replay_limit``: the fraction of signs in which a submission may differ from an earlier one of its own
    participant and still be resubmission of it (charged back): 0 (default) where nodes may train on the same samples
    again (FlowerTune's ``train.dynamic-data-seed = false``), up to 0.02 where they never do.

    A trusted reference (``kfca_llm.fl.reference``): ``reference`` is called once per scored round with the
    round's global arrays (a dict name -> numpy array, copies the callable may keep), and with ``server_round=t``
    when it takes that keyword (the recipes' app seeds its reference training by the round, as simulate does), and
    returns the server's update (name -> numpy array, local - global, every float tensor of the model). It is a peer of every
    participant with weight ``reference_weight`` (an in-round peer's is 1); it is never paid, aggregated or
    pooled, and a round with it is never undetermined. A misshapen or non-finite update is an ``InputError``.

    ``keep_signs``: store each round's packed sign words beside the ledger (``<ledger>.d/signs/``, named by
    SHA-256) before the round commits, so ``kfca-llm verify`` can recompute the round; the ledger records it per
    run and decides (``Ledger.keep_signs``): a resumed run keeps them as the run it continues did, and nothing is
    kept without a ledger. ``resume``: continue the ledger's last run (its scoring settings must be these: else
    ``InputError`` naming the setting); ``round_offset`` rounds are done, ``resume_arrays()`` gives the arrays the
    last one produced.

    ``receipt_key``: the server's Ed25519 private key file (PEM; created with its public half ``PATH.pub``
    when missing). Each paid participant is sent a receipt per round signed with it (ConfigRecord
    ``kfca.receipts`` of its node's next train or evaluate message, until the node replies to one), so that
    ``kfca-llm verify --receipts`` can catch a ledger rewritten after the fact. Publish ``PATH.pub``; keep
    ``PATH`` away from the ledger's folder (whoever holds it can sign a forged history).
    """

    def __init__(self, strategy: Strategy | None = None, *, peers: int | None = None, seed: int = 0,
                 penalty: str = "expected", bonus_fraction: float = 0.5, backend: str = "auto",
                 ledger: str | os.PathLike | None = "rewards.sqlite", aggregation: str = "all",
                 duplicates: str = "zero", identity: str = "auto", keep_signs: bool = False, resume: bool = False,
                 receipt_key: str | os.PathLike | None = None, min_peers: int = PoolSettings.min_peers,
                 pool_window: int = PoolSettings.window, pool_peers: int = PoolSettings.pool_peers,
                 pool_weight: float = PoolSettings.weight, own_replay_limit: float = PoolSettings.own_replay_limit,
                 reference: Callable[[dict[str, np.ndarray]], Mapping[str, np.ndarray]] | None = None,
                 reference_weight: float = DEFAULT_REFERENCE_WEIGHT, weak_verdict: str = DEFAULT_WEAK_VERDICT,
                 public_steps: int = PublicConditioning.steps,
                 public_buckets: int = PublicConditioning.magnitude_buckets):
        strategy = FedAvg() if strategy is None else strategy
        check_options(strategy, peers, seed, penalty, bonus_fraction, backend, ledger, aggregation, duplicates,
                      identity)
        self.weak_verdict = check_weak_verdict(weak_verdict)
        self.conditioning = check_conditioning(public_steps, public_buckets, penalty)
        self._trajectory = PublicTrajectory(self.conditioning)
        if resume and ledger is None:
            raise InputError("resume needs a ledger (it continues the ledger's last run)")
        if receipt_key is not None and ledger is None:
            raise InputError("receipts name the ledger's rounds: receipt_key needs a ledger")
        self._server_key = None if receipt_key is None else load_or_create_server_key(receipt_key)
        self.receipt_key = None if self._server_key is None else public_hex(self._server_key.public_key())
        """The public half of the receipt key (64 hex digits), as the ledger records it."""
        self.strategy = strategy
        self.peers = None if peers is None else int(peers)
        self.seed = int(seed)
        self.penalty = penalty
        self.bonus_fraction = float(bonus_fraction)
        self.backend = backend
        self.aggregation = aggregation
        self.duplicates = duplicates
        self.duplicate_rule = DuplicateRule()
        self.identity = identity
        self.pool = PeerPool(PoolSettings(min_peers=min_peers, window=pool_window, pool_peers=pool_peers,
                                          weight=pool_weight, own_replay_limit=own_replay_limit))
        if reference is not None and not callable(reference):
            raise InputError(f"reference must be a callable (global arrays -> update), got {type(reference).__name__}")
        self.reference = reference
        self._reference_takes_round = reference is not None and takes_keyword(reference, "server_round")
        self.reference_weight = check_reference_weight(reference_weight)
        self.arrayrecord_key: str = getattr(strategy, "arrayrecord_key", "arrays")
        self.weighted_by_key: str | None = getattr(strategy, "weighted_by_key", None)
        self.settings = scoring_settings(peers=self.peers, penalty=penalty, bonus_fraction=self.bonus_fraction,
                                         duplicates=duplicates, duplicate_rule=self.duplicate_rule,
                                         aggregation=aggregation, seed=self.seed, identity=identity,
                                         weak_verdict=None if aggregation == "all" else self.weak_verdict,
                                         pool=self.pool.settings.to_dict(),
                                         reference_weight=None if reference is None else self.reference_weight,
                                         public=self.conditioning if self.conditioning.enabled else None)
        self.rewards: dict[int, dict[str, float]] = {}
        self.node_ids: dict[int, dict[str, str]] = {}
        self.reports: dict[int, RewardReport] = {}
        self.undetermined: dict[int, tuple[str, ...]] = {}
        """Round -> participants paid with fewer than ``min_peers`` distinct peers (scored rounds only)."""
        self.settlements: dict[int, list[Settlement]] = {}
        """Round -> the earlier undetermined rounds' participants it settled (``fl.pool_settle``), and the run's last
        round's own."""
        self.last_round: int | None = None
        """The (ledger) round that closes the run: its pool settles every participant still waiting that it
        determines, its own round's included (pool rule 17). Set by ``start`` from ``num_rounds``."""
        self.failures: dict[int, list[tuple[str | None, str]]] = {}
        self.ledger = None if ledger is None else Ledger(
            ledger, run_id=uuid.uuid4().hex, strategy=type(strategy).__name__, package_version=__version__,
            settings=self.settings, keep_signs=bool(keep_signs), resume=resume,
            receipt_key=self.receipt_key)
        self.run_id = self.ledger.run_id if self.ledger else uuid.uuid4().hex
        self.round_offset = self.ledger.next_round - 1 if self.ledger else 0
        if self.round_offset and self.pool.settings.enabled:
            self.pool = resumed_pool(self.ledger.path, self.settings, self.run_id, self.round_offset,
                                     self.pool.settings)
        self._pins: dict[str, Participant] = self.ledger.participants() if self.ledger else {}
        self._last_node: dict[str, str] = self.ledger.last_node_ids() if self.ledger else {}
        self._sent: dict[int, ArrayRecord] = {}
        self._claims: dict[int, Claim] = {}
        self._post = None if self._server_key is None else ReceiptPost(self._server_key)

    @property
    def keep_signs(self) -> bool:
        """Whether each round's packed sign words are stored beside the ledger: as its run records it."""
        return self.ledger is not None and self.ledger.keep_signs

    def round_seed(self, server_round: int) -> int:
        """The KFCA seed of a (ledger) round: task partition, penalty draws, peer sampling, as `kfca-llm simulate`."""
        return derive_seed(self.seed, KFCA, server_round)

    def resume_arrays(self) -> ArrayRecord | None:
        """The arrays the resumed run's last committed round produced (None: nothing to resume from)."""
        if self.ledger is None or self.round_offset == 0:
            return None
        sha = self.ledger.last_global_sha256()
        if sha is None:
            return None
        return stored_global_arrays(self.ledger.path, sha)

    def start(self, grid: Grid, initial_arrays: ArrayRecord, num_rounds: int = 3, *args, **kwargs) -> Result:
        """``Strategy.start``; its round headers give the ledger's round (a resumed run's first is
        ``round_offset + 1``) and its last round closes the run (``last_round``)."""
        self.last_round = self.round_offset + int(num_rounds)
        with ledger_round_numbers(self.round_offset):
            return super().start(grid, initial_arrays, num_rounds, *args, **kwargs)

    def summary(self) -> None:
        log(INFO, "\t├──> KFCA rewards: peers %s, penalty %s, bonus fraction %s, seed %s, aggregation %s, "
            "copies %s, identity %s", "all" if self.peers is None else self.peers, self.penalty, self.bonus_fraction,
            self.seed, self.aggregation, self.duplicates, self.identity)
        pool = self.pool.settings
        log(INFO, "\t├──> peer pool: %s", "off (min_peers 0)" if not pool.enabled else
            f"min peers {pool.min_peers}, window {pool.window} rounds, {pool.pool_peers} pool peers, weight {pool.weight}")
        log(INFO, "\t├──> ledger: %s (run %s%s)", self.ledger.path if self.ledger else "none", self.run_id,
            f", resumed after round {self.round_offset}" if self.round_offset else "")
        log(INFO, "\t└──> wrapped strategy: %s", type(self.strategy).__name__)
        self.strategy.summary()

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        messages = self._with_receipts(
            self.strategy.configure_train(server_round + self.round_offset, arrays, config, grid))
        self._sent = {}
        self._trajectory.sent(arrays, [message.metadata.dst_node_id for message in messages])
        for message in messages:
            sent = message.content.get(self.arrayrecord_key) if message.has_content() else None
            self._sent[message.metadata.dst_node_id] = sent if isinstance(sent, ArrayRecord) else arrays
        # What the SuperLink knows of each node: its registered public key and name (flwr >= 1.2x's NodeInfo).
        self._claims = {info.node_id: Claim(str(info.node_id), bytes(info.public_key), str(info.name))
                        for info in grid.get_nodes()}
        return messages

    def aggregate_train(self, server_round: int, replies: Iterable[Message]
                        ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        t = server_round + self.round_offset
        sent_numpy: dict[int, dict[str, np.ndarray]] = {}  # per distinct sent record (usually one)
        valid: dict[str, Message] = {}
        failures: list[tuple[str | None, str]] = []
        replies = list(replies)
        stop_if_every_node_failed(t, replies)
        if self._post is not None:
            self._post.delivered(replies)
        for reply in replies:
            node = str(reply.metadata.src_node_id)
            reason = check_reply(reply, node, valid, self._sent, sent_numpy, self.arrayrecord_key, self.weighted_by_key)
            if reason is None:
                valid[node] = reply
            else:
                failures.append((node, reason))
                log(WARNING, "KFCA: reply of node %s excluded: %s", node, reason)
        identities, refused = identify(valid, self._claims, self.identity, self._pins, self._last_node)
        for node, reason in refused:
            failures.append((node, reason))
            log(WARNING, "KFCA: reply of node %s refused: %s", node, reason)
        paid = {identities[node].participant: valid[node] for node in identities}

        scored = None
        if len(paid) >= 2:
            try:
                scored = self._score(t, paid, sent_numpy)
            except NoTasksError as exc:  # every valid reply is zero where it matters: nothing to score, nothing to stop
                failures.append((None, f"round not scored: {exc}"))
                log(WARNING, "KFCA: round %s not scored: %s", t, exc)
        else:
            failures.append((None, f"round not scored: {len(paid)} valid repl{'y' if len(paid) == 1 else 'ies'}, "
                                   "KFCA needs at least two"))
        chosen, why_none = self._select(paid, scored)
        arrays, metrics = None, None
        if why_none is not None:
            failures.append((None, why_none))
        elif chosen:
            try:
                arrays, metrics = self.strategy.aggregate_train(t, chosen)
            except InconsistentMessageReplies as exc:
                failures.append((None, f"the wrapped strategy did not aggregate: {exc}"))
        self._record(t, paid, identities, scored, failures, arrays)
        return arrays, round_metrics(metrics, scored, failures)

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                           grid: Grid) -> Iterable[Message]:
        return self._with_receipts(self.strategy.configure_evaluate(server_round + self.round_offset, arrays, config,
                                                                     grid))

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        replies = list(replies)
        if self._post is not None:
            self._post.delivered(replies)
        return self.strategy.aggregate_evaluate(server_round + self.round_offset, replies)

    # ------------------------------------------------------------------------------------------------

    def _with_receipts(self, messages: Iterable[Message]) -> list[Message]:
        messages = list(messages)
        return messages if self._post is None else self._post.attach(messages, self._last_node)

    def _score(self, server_round: int, paid: Mapping[str, Message],
               sent_numpy: dict[int, dict[str, np.ndarray]]) -> ScoredRound:
        first = next(iter(paid.values())).metadata.src_node_id
        shapes = {name: a.shape for name, a in sent_arrays(self._sent, first, sent_numpy).items() if is_float(a)}
        packer, values = packed_updates(paid, self._sent, sent_numpy, shapes, self.arrayrecord_key, self.backend,
                                        sketch_values=self.pool.settings.judges_values)
        peers = None if self.peers is None else min(self.peers, len(paid) - 1)
        nodes = [reply.metadata.src_node_id for reply in paid.values()]
        reference = None
        if self.reference is not None and self.reference_weight > 0:
            global_arrays = {name: array.copy() for name, array in sent_arrays(self._sent, first, sent_numpy).items()}
            update = (self.reference(global_arrays, server_round=server_round) if self._reference_takes_round
                      else self.reference(global_arrays))
            reference = reference_signs(packer, update)
        return score_round(packer, self.pool, server_round, peers=peers, seed=self.round_seed(server_round),
                           penalty=self.penalty, bonus_fraction=self.bonus_fraction, duplicates=self.duplicates,
                           duplicate_rule=self.duplicate_rule, reference=reference,
                           reference_weight=self.reference_weight, keep_signs=self.keep_signs,
                           public=self._trajectory.steps(shapes), conditioning=self.conditioning,
                           gaps=self._trajectory.gaps(nodes), changes=self._trajectory.changes(nodes),
                           values=values, closes_run=server_round == self.last_round)

    def _select(self, paid: Mapping[str, Message], scored: ScoredRound | None
                ) -> tuple[list[Message], str | None]:
        """The replies the wrapped strategy aggregates (in node-id order), or why it aggregates none.

        Which replies, with which weights: ``kfca_llm.fl.aggregate.aggregation_weights`` (the rule of
        ``kfca-llm simulate`` too); a reply whose weight the rule changed carries the new weight under the
        wrapped strategy's weight key."""
        order = sorted(paid, key=lambda who: str(paid[who].metadata.src_node_id))
        weights = {who: reply_weight(paid[who], self.weighted_by_key) for who in order}
        kept = aggregation_weights(self.aggregation, None if scored is None else scored.report.rewards, weights,
                                   verdicts=None if scored is None else scored.pooled.verdicts,
                                   weak_verdict=self.weak_verdict)
        if not kept:
            return [], (f"no reply was paid {'>=' if self.aggregation == 'exclude-negative' else '>'} 0 (weak "
                        f"verdicts: {self.weak_verdict}); the global arrays are kept")
        return [paid[who] if kept[who] == weights[who] else reweighted(paid[who], self.weighted_by_key, kept[who])
                for who in order if who in kept], None

    def _record(self, server_round: int, paid: Mapping[str, Message], identities: Mapping[str, Identity],
                scored: ScoredRound | None, failures: list[tuple[str | None, str]], arrays: ArrayRecord | None) -> None:
        self.failures[server_round] = failures
        node_of = {identity.participant: node for node, identity in identities.items()}
        rows = []
        if scored is not None:
            report = scored.report
            self.rewards[server_round] = dict(report.rewards)
            self.node_ids[server_round] = {p: node_of[p] for p in report.rewards}
            self.reports[server_round] = report
            self.undetermined[server_round] = scored.pooled.undetermined
            self.settlements[server_round] = list(scored.settlements)
            peers = report.peers
            group_of = copy_groups(report)  # what closing the round read (fl.pool_close)
            rows = [RewardRow(self.run_id, server_round, who, node_of[who], float(reward), tuple(peers[who]),
                              num_examples(paid[who], self.weighted_by_key), scored.digests[who],
                              float(report.unadjusted_rewards[who]), group_of.get(who))
                    for who, reward in report.rewards.items()]
        participant_of = {node: identity.participant for node, identity in identities.items()}
        failure_rows = [FailureRow(self.run_id, server_round, node, reason, participant_of.get(node))
                        for node, reason in failures]
        new = [Participant(i.participant, i.label, i.key_fingerprint, self.run_id, server_round, node, "")
               for node, i in identities.items() if i.participant not in self._pins]
        settled = [] if scored is None else [
            SettlementRow(self.run_id, t.round, t.participant, t.settled_in, t.reward, t.peers, t.unadjusted_reward)
            for t in scored.settlements]
        if self.ledger is not None:
            global_arrays = None
            if arrays is not None:
                data = arrays_to_bytes(arrays)
                global_arrays = (sha256_hex(data), data)
            previous = self.ledger.last_global_sha256()
            digest = self.ledger.record_round(RoundEntry(
                round=server_round, seed=self.round_seed(server_round),
                settings={**self.settings, CLOSES_RUN: True} if scored is not None and server_round == self.last_round
                else self.settings,
                valid_replies=len(paid), categorical_world=None if scored is None else bool(scored.report.categorical_world),
                rewards=rows, failures=failure_rows, layout=None if scored is None else scored.layout,
                task_sha256=None if scored is None else scored.task_sha256,
                signs=scored.signs if scored is not None and self.keep_signs else None,
                global_arrays=global_arrays, new_participants=new,
                undetermined=None if scored is None else scored.pooled.undetermined,
                reference_sha256=None if scored is None else scored.reference_sha256,
                public=None if scored is None else scored.public,
                values_sha256=None if scored is None else scored.values_sha256,
                settlements=settled))
            if self._post is not None:
                self._post.issue([*rows, *settled], digest)
            if global_arrays is not None and previous not in (None, global_arrays[0]):
                # Only the newest round's arrays are needed to resume (they are not part of the audit).
                global_path(self.ledger.path, previous).unlink(missing_ok=True)
        self._pins.update({p.participant: p for p in new})
        self._last_node.update({row.participant: row.node_id for row in rows})
