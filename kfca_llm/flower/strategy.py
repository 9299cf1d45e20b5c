"""``KFCAStrategy``: KFCA rewards inside any Flower ServerApp (message API), wrapping another strategy.

    strategy = KFCAStrategy(FedAvg(fraction_train=0.5), ledger="rewards.sqlite")
    result = strategy.start(grid=grid, initial_arrays=arrays, num_rounds=3)

Each training round: ``configure_train`` remembers the arrays sent to each node; ``aggregate_train``
checks every reply, turns each valid one into the node's update (reply minus what it was sent),
streams the arrays one at a time into ``SignPacker`` (only packed sign bits are kept), scores the round
with KFCA-QP, writes the round to the ledger in one transaction, and hands the replies (all, the
non-negative ones, or re-weighted by reward) to the wrapped strategy.
"""

from __future__ import annotations

import hashlib
import math
import os
import uuid
from collections.abc import Iterable, Mapping
from logging import INFO, WARNING

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.common import log
from flwr.serverapp import Grid
from flwr.serverapp.exception import InconsistentMessageReplies
from flwr.serverapp.strategy import FedAvg, Strategy

from ..engine import get_backend
from ..engine.duplicates import check_duplicate_policy
from ..errors import InputError
from ..fl.seeds import KFCA, derive_seed
from ..packer import SignPacker
from ..partition import PENALTY_MODES, check_seed
from ..report import RewardReport
from ..tensors import is_float
from .ledger import FailureRow, Ledger, RewardRow

AGGREGATION_MODES = ("all", "exclude-negative", "reward-weighted")
REWARD_METRIC_PREFIX = "kfca.reward."


def sign_report_sha256(signs: np.ndarray) -> str:
    """SHA-256 of one node's packed sign report (its row of ``SignPacker.words()[0]``, little-endian)."""
    return hashlib.sha256(np.ascontiguousarray(signs, dtype="<i4").tobytes()).hexdigest()


def update_sha256(update: Mapping[str, np.ndarray]) -> str:
    """The ledger's digest of an update, recomputed from the update itself (for audits)."""
    packer = SignPacker({name: a.shape for name, a in update.items()}, ["audited", "unused"], backend="cpu")
    packer.add_many("audited", dict(update))
    return sign_report_sha256(packer.words()[0][packer.clients.index("audited")])


def _check_options(strategy, peers, seed, penalty, bonus_fraction, backend, ledger, aggregation, duplicates) -> None:
    if not isinstance(strategy, Strategy):
        raise InputError(f"strategy must be a Flower message-API Strategy (flwr.serverapp.strategy), "
                         f"got {type(strategy).__name__}")
    if peers is not None and (isinstance(peers, bool) or not isinstance(peers, (int, np.integer)) or peers < 1):
        raise InputError(f"peers must be None (every other node) or an integer >= 1, got {peers!r}")
    check_seed(seed)
    if penalty not in PENALTY_MODES:
        raise InputError(f"penalty must be one of {PENALTY_MODES}, got {penalty!r}")
    if (isinstance(bonus_fraction, bool) or not isinstance(bonus_fraction, (int, float, np.floating))
            or not 0.0 < float(bonus_fraction) < 1.0):
        raise InputError(f"bonus_fraction must be a number in (0, 1), got {bonus_fraction!r}")
    if backend != "auto":
        get_backend(backend)  # an unknown backend, or one that cannot run, says why now, not in round 1
    if ledger is not None and not isinstance(ledger, (str, os.PathLike)):
        raise InputError(f"ledger must be a file path or None, got {type(ledger).__name__}")
    check_duplicate_policy(duplicates)
    if aggregation not in AGGREGATION_MODES:
        raise InputError(f"aggregation must be one of {AGGREGATION_MODES}, got {aggregation!r}")
    if aggregation == "reward-weighted" and not isinstance(getattr(strategy, "weighted_by_key", None), str):
        raise InputError(f"aggregation='reward-weighted' scales the wrapped strategy's weight key, but "
                         f"{type(strategy).__name__} has no `weighted_by_key`")


class KFCAStrategy(Strategy):
    """Pays every training reply by KFCA-QP and aggregates through the wrapped strategy.

    Rewards are reported three ways: ``kfca.reward.<node id>`` in the round's aggregated train metrics,
    ``self.rewards`` (round -> {node id: reward}), and the ledger (None: no ledger). ``peers``: peers
    per node (at most the other valid nodes of the round; None: all of them). ``aggregation``:
    ``"all"`` (the wrapped strategy sees every valid reply), ``"exclude-negative"`` (replies paid < 0
    are dropped first), ``"reward-weighted"`` (the wrapped strategy's weight key is scaled by
    max(reward, 0)). A round with fewer than two valid replies is not scored (recorded as such) and
    every valid reply is aggregated.

    ``duplicates``: payment of copies found among a round's valid replies (``kfca_llm.engine.duplicates``):
    ``"zero"`` (default: a group of copies is paid nothing, since the detector cannot tell the original
    from the copy), ``"split"`` (a group is paid as one node), ``"flag"`` (recorded only). Rewards, metrics,
    ``exclude-negative`` and ``reward-weighted`` use the paid reward (a copy paid 0 gets weight 0); the
    ledger also keeps each node's unadjusted reward and its group, for review.
    """

    def __init__(self, strategy: Strategy | None = None, *, peers: int | None = None, seed: int = 0,
                 penalty: str = "expected", bonus_fraction: float = 0.5, backend: str = "auto",
                 ledger: str | os.PathLike | None = "rewards.sqlite", aggregation: str = "all",
                 duplicates: str = "zero"):
        strategy = FedAvg() if strategy is None else strategy
        _check_options(strategy, peers, seed, penalty, bonus_fraction, backend, ledger, aggregation, duplicates)
        self.strategy = strategy
        self.peers = None if peers is None else int(peers)
        self.seed = int(seed)
        self.penalty = penalty
        self.bonus_fraction = float(bonus_fraction)
        self.backend = backend
        self.aggregation = aggregation
        self.duplicates = duplicates
        self.arrayrecord_key: str = getattr(strategy, "arrayrecord_key", "arrays")
        self.weighted_by_key: str | None = getattr(strategy, "weighted_by_key", None)
        self.run_id = uuid.uuid4().hex
        self.rewards: dict[int, dict[str, float]] = {}
        self.reports: dict[int, RewardReport] = {}
        self.failures: dict[int, list[tuple[str | None, str]]] = {}
        self.ledger = None if ledger is None else Ledger(
            ledger, run_id=self.run_id, strategy=type(strategy).__name__, aggregation=aggregation,
            peers=self.peers, penalty=penalty, seed=self.seed, bonus_fraction=self.bonus_fraction,
            duplicates=duplicates)
        self._sent: dict[int, ArrayRecord] = {}

    def round_seed(self, server_round: int) -> int:
        """The KFCA seed of a round (task partition, penalty draws, peer sampling), as `kfca-llm simulate` derives it."""
        return derive_seed(self.seed, KFCA, server_round)

    def summary(self) -> None:
        log(INFO, "\t├──> KFCA rewards: peers %s, penalty %s, bonus fraction %s, seed %s, aggregation %s, "
            "copies %s", "all" if self.peers is None else self.peers, self.penalty, self.bonus_fraction, self.seed,
            self.aggregation, self.duplicates)
        log(INFO, "\t├──> ledger: %s (run %s)", self.ledger.path if self.ledger else "none", self.run_id)
        log(INFO, "\t└──> wrapped strategy: %s", type(self.strategy).__name__)
        self.strategy.summary()

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        messages = list(self.strategy.configure_train(server_round, arrays, config, grid))
        self._sent = {}
        for message in messages:
            sent = message.content.get(self.arrayrecord_key) if message.has_content() else None
            self._sent[message.metadata.dst_node_id] = sent if isinstance(sent, ArrayRecord) else arrays
        return messages

    def aggregate_train(self, server_round: int, replies: Iterable[Message]
                        ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        sent_numpy: dict[int, dict[str, np.ndarray]] = {}  # per distinct sent record (usually one)
        valid: dict[str, Message] = {}
        failures: list[tuple[str | None, str]] = []
        for reply in replies:
            node = str(reply.metadata.src_node_id)
            reason = self._check_reply(reply, node, valid, sent_numpy)
            if reason is None:
                valid[node] = reply
            else:
                failures.append((node, reason))
                log(WARNING, "KFCA: reply of node %s excluded: %s", node, reason)

        report, digests = None, {}
        if len(valid) >= 2:
            report, digests = self._score(server_round, valid, sent_numpy)
        else:
            failures.append((None, f"round not scored: {len(valid)} valid repl{'y' if len(valid) == 1 else 'ies'}, "
                                   "KFCA needs at least two"))
        chosen, why_none = self._select(valid, report)
        arrays, metrics = None, None
        if why_none is not None:
            failures.append((None, why_none))
        elif chosen:
            try:
                arrays, metrics = self.strategy.aggregate_train(server_round, chosen)
            except InconsistentMessageReplies as exc:
                failures.append((None, f"the wrapped strategy did not aggregate: {exc}"))
        self._record(server_round, valid, report, digests, failures)
        return arrays, self._metrics(metrics, report, failures)

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                           grid: Grid) -> Iterable[Message]:
        return self.strategy.configure_evaluate(server_round, arrays, config, grid)

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        return self.strategy.aggregate_evaluate(server_round, replies)

    # ------------------------------------------------------------------------------------------------

    def _sent_arrays(self, node_id: int, sent_numpy: dict[int, dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
        record = self._sent[node_id]
        if id(record) not in sent_numpy:
            sent_numpy[id(record)] = {name: array.numpy() for name, array in record.items()}
        return sent_numpy[id(record)]

    def _check_reply(self, reply: Message, node: str, valid: Mapping[str, Message],
                     sent_numpy: dict[int, dict[str, np.ndarray]]) -> str | None:
        """Why a reply cannot be scored or aggregated (None: it can). Reply contents are untrusted."""
        if reply.has_error():
            return f"the node replied with an error (code {reply.error.code}): {reply.error.reason}"
        if reply.metadata.src_node_id not in self._sent:
            return "reply from a node that was not sent a training message this round"
        if node in valid:
            return "more than one reply from this node"
        if not reply.has_content():
            return "reply has no content"
        content = reply.content
        records = sorted(content.array_records)
        if self.arrayrecord_key not in content.array_records:
            return f"no ArrayRecord under {self.arrayrecord_key!r} (found {records})"
        if len(records) != 1:
            return f"expected one ArrayRecord, found {records}"
        reason = self._check_metrics(content)
        if reason is not None:
            return reason
        sent = self._sent_arrays(reply.metadata.src_node_id, sent_numpy)
        returned = content.array_records[self.arrayrecord_key]
        missing, extra = sorted(set(sent) - set(returned)), sorted(set(returned) - set(sent))
        if missing:
            return f"arrays missing from the reply: {missing[:5]}{' ...' if len(missing) > 5 else ''}"
        if extra:
            return f"arrays the node was not sent: {extra[:5]}{' ...' if len(extra) > 5 else ''}"
        for name, expected in sent.items():
            try:
                array = returned[name].numpy()
            except Exception as exc:  # untrusted bytes: any parse failure is a bad reply, not a crash
                return f"array {name!r} cannot be read as a numpy array: {exc}"
            if array.shape != expected.shape:
                return f"array {name!r}: shape {array.shape} differs from the sent shape {expected.shape}"
            if is_float(expected) and not is_float(array):
                return f"array {name!r}: dtype {array.dtype} is not a floating-point type"
            if array.dtype != expected.dtype:
                return f"array {name!r}: dtype {array.dtype} differs from the sent dtype {expected.dtype}"
            if is_float(array) and not np.isfinite(array).all():
                return f"array {name!r} holds NaN or Inf values"
        return None

    def _check_metrics(self, content: RecordDict) -> str | None:
        if self.weighted_by_key is None:
            return None
        metric_records = list(content.metric_records.values())
        if len(metric_records) != 1:
            return f"expected one MetricRecord, found {len(metric_records)}"
        weight = metric_records[0].get(self.weighted_by_key)
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight) or weight < 0:
            return f"metric {self.weighted_by_key!r} must be a finite number >= 0, got {weight!r}"
        return None

    def _score(self, server_round: int, valid: Mapping[str, Message],
               sent_numpy: dict[int, dict[str, np.ndarray]]) -> tuple[RewardReport, dict[str, str]]:
        first = next(iter(valid.values())).metadata.src_node_id
        shapes = {name: a.shape for name, a in self._sent_arrays(first, sent_numpy).items() if is_float(a)}
        packer = SignPacker(shapes, list(valid), backend=self.backend)
        for node, reply in valid.items():
            sent = self._sent_arrays(reply.metadata.src_node_id, sent_numpy)
            returned = reply.content.array_records[self.arrayrecord_key]
            for name in shapes:
                # Deserialised again (the check pass kept nothing): one array in memory at a time.
                packer.add(node, name, returned[name].numpy() - sent[name])
        peers = None if self.peers is None else min(self.peers, len(valid) - 1)
        report = packer.score(peers=peers, seed=self.round_seed(server_round), penalty=self.penalty,
                              bonus_fraction=self.bonus_fraction, duplicates=self.duplicates)
        signs, _ = packer.words()
        digests = {node: sign_report_sha256(signs[k]) for k, node in enumerate(packer.clients)}
        return report, digests

    def _select(self, valid: Mapping[str, Message], report: RewardReport | None
                ) -> tuple[list[Message], str | None]:
        """The replies the wrapped strategy aggregates, or why it aggregates none."""
        replies = [valid[node] for node in sorted(valid)]
        if report is None or self.aggregation == "all":
            return replies, None
        if self.aggregation == "exclude-negative":
            kept = [valid[node] for node in sorted(valid) if report.rewards[node] >= 0.0]
            return kept, None if kept else "no reply was paid >= 0; the global arrays are kept"
        weighted = [self._reweighted(valid[node], report.rewards[node]) for node in sorted(valid)]
        if not any(weight > 0 for _, weight in weighted):
            return [], "no reply was paid > 0; the global arrays are kept"
        return [message for message, _ in weighted], None

    def _reweighted(self, reply: Message, reward: float) -> tuple[Message, float]:
        content = RecordDict(dict(reply.content.items()))
        (name, metrics), = content.metric_records.items()
        scaled = MetricRecord(dict(metrics.items()))
        weight = float(metrics[self.weighted_by_key]) * max(reward, 0.0)
        scaled[self.weighted_by_key] = weight
        content[name] = scaled
        return Message(content=content, metadata=reply.metadata), weight

    def _num_examples(self, reply: Message) -> int | None:
        key = self.weighted_by_key or "num-examples"
        for metrics in reply.content.metric_records.values():
            value = metrics.get(key)
            if isinstance(value, int) and not isinstance(value, bool):
                return value
            if isinstance(value, float) and value.is_integer():
                return int(value)
        return None

    def _record(self, server_round: int, valid: Mapping[str, Message], report: RewardReport | None,
                digests: Mapping[str, str], failures: list[tuple[str | None, str]]) -> None:
        self.failures[server_round] = failures
        rows = []
        if report is not None:
            self.rewards[server_round] = dict(report.rewards)
            self.reports[server_round] = report
            peers = report.peers
            group_of = {c: g.clients for g in report.duplicates for c in g.clients}
            rows = [RewardRow(self.run_id, server_round, node, float(reward), tuple(peers[node]), self.penalty,
                              self.round_seed(server_round), report.categorical_world,
                              self._num_examples(valid[node]), digests[node],
                              float(report.unadjusted_rewards[node]), group_of.get(node))
                    for node, reward in report.rewards.items()]
        if self.ledger is not None:
            self.ledger.record_round(
                server_round, seed=self.round_seed(server_round), rewards=rows,
                failures=[FailureRow(self.run_id, server_round, node, reason) for node, reason in failures],
                valid_replies=len(valid), categorical_world=None if report is None else report.categorical_world)

    def _metrics(self, metrics: MetricRecord | None, report: RewardReport | None,
                 failures: list[tuple[str | None, str]]) -> MetricRecord:
        out = MetricRecord(dict(metrics.items())) if metrics is not None else MetricRecord()
        out["kfca.scored"] = int(report is not None)
        out["kfca.failed-replies"] = sum(node is not None for node, _ in failures)
        out["kfca.copies"] = 0 if report is None else sum(len(g.clients) for g in report.duplicates)
        if report is not None:
            for node, reward in report.rewards.items():
                out[REWARD_METRIC_PREFIX + node] = float(reward)
        return out
