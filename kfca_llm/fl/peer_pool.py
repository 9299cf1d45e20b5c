"""Peers beyond the round: scoring rounds with too few participants against earlier rounds' sign words.

Peer prediction with one peer is symmetric: at two participants per round (FlowerTune's 20 x 0.1) the
honest partner of a sign flipper is paid exactly what the flipper is. ``PeerPool`` keeps, for the last
``window`` rounds, each participant's packed sign words (1 bit per coordinate; never a float update).
A round in which some participant has fewer than ``min_peers`` in-round peers scores that participant
also against ``pool_peers`` pool entries:

* **which entries**: one per other participant (its most recent submission in the window: several
  entries of one participant are not independent peers), the most recent participants first; never the
  participant's own earlier submissions, never a participant of the current round;
* **how**: on the current round's tasks (its task mask and seeded bonus / penalty partition), the pool
  entry's sign bits read as a report on those tasks; the expected penalty uses the entry's negative counts
  on this round's penalty sets;
* **weights**: an update agrees with updates of earlier rounds by an amount, and even a sign, that depends on
  the lag: the tiny recipe's honest updates *anti*-agree with the previous round's (the global overshoots and
  turns back; mean payment -0.049, 87% of such pairs negative) and agree with those two rounds back
  (``benchmarks/ROBUSTNESS.md``). So each lag k gets a signed weight ``weight * m_k / max_j |m_j|``, where
  ``m_k`` is the median payment between pool entries k rounds apart (other participants, this round's
  partition): estimated from the pool alone, no ground truth, robust to a minority of deviators in it. A
  participant's reward is ``(sum of in-round payments + sum_k w_k * payment_k) / (in-round peers + sum |w_k|)``;
* **copies** (``fl.pool_copies``): a participant whose signs are identical or near-identical (``DuplicateRule.max_disagreement``)
  to any pool entry in the window, or, on a fixed 4,096-bit sketch of its signs, to any earlier submission of
  the run, is a copy and is not added to the pool. A copy of another participant's entry (or of several
  participants' entries, its own among them) is paid under the round's duplicate policy (at most 0 under
  ``zero`` and ``split``). An **own resubmission** (every entry it copies is its own participant's: ``stale``,
  ``lagged:K``) is scored as if there were no pool: on its in-round peers only (and the trusted reference, if
  any), exactly what the round without a pool pays it; it never meets the pool, so it cannot profit from it,
  and a stale client is paid by the same rule at every round size. With fewer than ``min_peers`` in-round
  peers (and no reference) it is undetermined;
* **undetermined**: a participant with fewer than ``min_peers`` distinct peers (in-round and pool) has no
  majority of independent peers that could outvote one deviator; the round is marked undetermined.

A round in which every participant has ``min_peers`` in-round peers is scored exactly as without a pool
(``SignPacker.score``): same rewards, bit for bit.

What the aggregation may ask of a short participant's verdict (``PooledRound.verdicts``, ``fl.aggregate``'s
weak-verdict rules): its in-round reward (the round scored without the pool, which ``score_with_pool`` computes
first), and whether the pool is still *warming up* for it: undetermined, or fewer than ``pool_peers`` distinct
pool participants of non-zero lag weight behind its reward (the first rounds of a run, when the window holds few
participants and the lag weights rest on few pairs).
"""

from __future__ import annotations

import dataclasses
import json
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from ..engine import get_backend
from ..engine.duplicates import DuplicateGroup, DuplicateRule
from ..engine.stats import PairPayment, joint_tables, pair_payments
from ..errors import InputError
from ..packer import SIGN_LABELS, SignPacker
from ..report import RewardReport
from .aggregate import WeakVerdicts
from .pool_copies import apply_pool_policy, pool_copies_of, sketch, sketch_copies_of
from .pool_weights import orientation, pool_lag_weights, pool_scores, weighted_means
from .reference import REFERENCE, check_reference_weight

POOL_SEPARATOR = "@"
"""Pool peer names are ``<participant>@<round>`` (the ledger's ``peers`` column records them)."""
OWN_RESUBMISSION = "own resubmission: scored without the pool"
POOL_RULE = 2
"""1: in-round and pool peers in one weighted mean, undetermined rounds paid; 2 (this version): in-round peers read
the way the pool's verdict says (``fl.pool_weights``), pool peers only from entries paid > 0, undetermined rewards
not paid."""
"""The note of a copy group whose scorer resubmitted only its own earlier updates (``DuplicateGroup.note``)."""


@dataclass(frozen=True)
class PoolSettings:
    """How short rounds borrow peers (defaults measured in ``benchmarks/ROBUSTNESS.md``)."""

    min_peers: int = 2
    """A participant with fewer in-round peers is also scored against pool peers; fewer distinct peers in
    all leaves the round undetermined. 0 turns the pool off (today's scoring, never undetermined)."""
    window: int = 10
    """Rounds of sign words kept."""
    pool_peers: int = 8
    """Pool peers per short participant (distinct participants, most recent first)."""
    weight: float = 0.5
    """The weight of the pool's verdict as a whole (its weighted mean payment) against an in-round peer's 1."""
    rule: int = POOL_RULE
    """The pooled-scoring rule these settings were recorded under (``POOL_RULE``: the one this version computes;
    a ledger of an earlier rule is not rescored with this one)."""

    def __post_init__(self):
        for name in ("min_peers", "window", "pool_peers"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
                raise InputError(f"peer pool: {name} must be an integer >= 0, got {value!r}")
        if isinstance(self.weight, bool) or not isinstance(self.weight, (int, float)) or not 0 < self.weight <= 1e6:
            raise InputError(f"peer pool: weight must be a number > 0, got {self.weight!r}")
        if self.rule != POOL_RULE:
            raise InputError(f"peer pool: rule {self.rule!r} is not the rule this version computes ({POOL_RULE})")

    @property
    def enabled(self) -> bool:
        return self.min_peers > 0

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def recorded_pool_settings(recorded: Mapping) -> tuple[PoolSettings, object]:
    """The settings a ledger recorded for its run, as this version's, and the rule they were recorded under (1:
    recorded before the rule was): a round that needed the pool is rescored only under the rule it was paid by."""
    rule = recorded.get("rule", 1)
    return PoolSettings(**{**recorded, "rule": POOL_RULE}), rule


def pool_name(participant: str, round_: int) -> str:
    return f"{participant}{POOL_SEPARATOR}{int(round_)}"


def parse_pool_name(name: str) -> tuple[str, int] | None:
    """(participant, round) of a pool peer name; None for an in-round peer."""
    participant, sep, tail = name.rpartition(POOL_SEPARATOR)
    return (participant, int(tail)) if sep and participant and tail.isdigit() else None


@dataclass(frozen=True)
class PoolEntry:
    round: int
    participant: str
    signs: np.ndarray
    """int32 packed sign words of the participant's submission against its own round's global."""

    @property
    def name(self) -> str:
        return pool_name(self.participant, self.round)


@dataclass(frozen=True)
class PooledRound:
    """A round's report and what the pool did for it."""

    report: RewardReport
    pool_peers: dict[str, list[str]]
    """Participant -> the pool entries it was scored against (empty when the round had enough peers)."""
    undetermined: tuple[str, ...]
    """Participants with fewer than ``min_peers`` distinct peers: their reward cannot tell who deviated."""
    pool_copies: tuple[DuplicateGroup, ...] = ()
    """Groups of a participant and the pool entries it copies (also in ``report.duplicates``); an own
    resubmission's carry the note ``OWN_RESUBMISSION``."""
    lag_weights: dict[int, float] = dataclasses.field(default_factory=dict)
    """Lag (rounds back) -> the signed weight of a pool peer that old (see the module docstring)."""
    in_round_rewards: dict[str, float] = dataclasses.field(default_factory=dict)
    """Scorer -> its reward from its round's peers only (``SignPacker.score``'s report, before the pool)."""
    short: tuple[str, ...] = ()
    """Scorers with fewer than ``min_peers`` in-round peers (their reward was computed with the pool)."""
    warming: tuple[str, ...] = ()
    """Of ``short``, those the pool is still warming up for (see the module docstring)."""

    @property
    def used_pool(self) -> bool:
        return any(self.pool_peers.values())

    @property
    def verdicts(self) -> WeakVerdicts:
        """What ``fl.aggregate.aggregation_weights`` needs to apply a weak-verdict rule."""
        return WeakVerdicts({c: self.in_round_rewards[c] for c in self.short}, frozenset(self.short),
                            frozenset(self.warming), frozenset(self.undetermined))

    @property
    def own_resubmissions(self) -> tuple[str, ...]:
        """Scorers that copied only their own earlier submissions: scored without the pool."""
        return tuple(sorted({c for g in self.pool_copies if g.note == OWN_RESUBMISSION for c in g.clients
                             if c in self.report.rewards}))


class PeerPool:
    """The last ``window`` rounds' sign words, by round and participant (see the module docstring)."""

    def __init__(self, settings: PoolSettings = PoolSettings()):
        self.settings = settings
        self._rounds: OrderedDict[int, dict[str, np.ndarray]] = OrderedDict()
        self._sketches: list[tuple[str, np.ndarray]] = []
        self._words: int | None = None
        self._scores: dict[str, float | None] = {}
        """Pool name -> its round's score of it before copies and the undetermined rule (``unadjusted_rewards``;
        None: not recorded): only entries scored > 0 (or not recorded) become pool peers; a deviator's entries stay
        for copy detection and lag weights only."""

    def entries(self, before_round: int, extra: int = 0) -> list[PoolEntry]:
        """Entries of the ``window`` (+ ``extra``) rounds before ``before_round``, newest round first, then by name."""
        low = before_round - self.settings.window - extra
        return [PoolEntry(t, who, words) for t, members in reversed(self._rounds.items()) if low <= t < before_round
                for who, words in sorted(members.items())]

    def candidates(self, before_round: int, participant: str, exclude: Sequence[str]) -> list[PoolEntry]:
        """Up to ``pool_peers`` entries: each other participant's most recent one its round did not score <= 0, most
        recent first."""
        seen, out = set(exclude) | {participant}, []
        for entry in self.entries(before_round):
            score = self._scores.get(entry.name)
            if entry.participant not in seen and (score is None or score > 0):
                seen.add(entry.participant)
                out.append(entry)
        return out[:self.settings.pool_peers]

    def add_round(self, round_: int, signs: Mapping[str, np.ndarray],
                  scores: Mapping[str, float] | None = None) -> None:
        """Keep a round's sign words (call after scoring it, leaving out copies) and its scores of them (the report's
        ``unadjusted_rewards``; missing: not recorded); old rounds drop out."""
        if not signs:
            return
        widths = {int(np.asarray(w).shape[-1]) for w in signs.values()}
        if len(widths) != 1 or (self._words is not None and widths != {self._words}):
            self._rounds.clear()  # another layout: earlier words are not comparable (a new model)
            self._sketches.clear()
            self._scores.clear()
        self._words = widths.pop()
        self._rounds[int(round_)] = {who: np.ascontiguousarray(w, dtype=np.int32).copy() for who, w in signs.items()}
        self._scores.update({pool_name(who, round_): (scores or {}).get(who) for who in signs})
        self._sketches += [(pool_name(who, round_), sketch(w)) for who, w in sorted(signs.items())]
        # One round more than the window: lag weights up to the window's oldest round need pairs that far apart.
        for t in [t for t in self._rounds if t < round_ - self.settings.window]:
            for who in self._rounds.pop(t):
                self._scores.pop(pool_name(who, t), None)

    def sketch_copies(self, words: np.ndarray, task: np.ndarray, before_round: int, max_disagreement: float
                      ) -> list[tuple[str, float]]:
        """(entry, agreement) of earlier submissions older than the window whose sketch ``words`` matches."""
        mask, mine = sketch(task), sketch(words)
        bits = int(np.unpackbits(mask.view(np.uint8)).sum())
        if bits == 0:
            return []
        low = before_round - self.settings.window
        out = []
        for name, other in self._sketches:
            if parse_pool_name(name)[1] >= low:
                continue  # in the window: compared on every bit
            differ = int(np.unpackbits(((mine ^ other) & mask).view(np.uint8)).sum())
            if differ <= max_disagreement * bits:
                out.append((name, 1.0 - differ / bits))
        return out


    def to_arrays(self) -> tuple[dict[str, np.ndarray], dict[str, str]]:
        """(arrays, metadata) that ``from_arrays`` turns back into this pool (a resumed run continues with it)."""
        arrays, entries = {}, []
        for t, members in self._rounds.items():
            for who, words in sorted(members.items()):
                arrays[f"words.{len(entries)}"] = words
                entries.append([t, who])
        for k, (name, bits) in enumerate(self._sketches):
            arrays[f"sketch.{k}"] = bits
        return arrays, {"entries": json.dumps(entries), "sketches": json.dumps([n for n, _ in self._sketches]),
                        "scores": json.dumps(self._scores)}

    @classmethod
    def from_arrays(cls, settings: PoolSettings, arrays: Mapping[str, np.ndarray], metadata: Mapping[str, str]
                    ) -> PeerPool:
        pool = cls(settings)
        for k, (t, who) in enumerate(json.loads(metadata["entries"])):
            words = np.asarray(arrays[f"words.{k}"], dtype=np.int32)
            pool._rounds.setdefault(int(t), {})[who] = words
            pool._words = words.shape[-1]
        pool._rounds = OrderedDict(sorted(pool._rounds.items()))
        pool._scores = {str(k): None if v is None else float(v) for k, v in json.loads(metadata.get("scores", "{}")).items()}
        pool._sketches = [(name, np.asarray(arrays[f"sketch.{k}"], dtype=np.int32))
                          for k, name in enumerate(json.loads(metadata["sketches"]))]
        return pool


def score_with_pool(packer: SignPacker, pool: PeerPool | None, round_: int, *, peers: int | None = None,
                    pairs: Sequence[tuple[str, str]] | None = None, seed: int, penalty: str = "expected",
                    bonus_fraction: float = 0.5, duplicates: str = "zero",
                    duplicate_rule: DuplicateRule = DuplicateRule(),
                    copy_candidates: Sequence[str] | None = None,
                    owners: Mapping[str, str] | None = None, reference: np.ndarray | None = None,
                    reference_weight: float = 1.0) -> PooledRound:
    """Score a packed round, borrowing pool peers for participants with fewer than ``min_peers`` peers.

    ``pairs`` / ``peers``: the in-round pairs, as ``SignPacker.score`` takes them. Scorers are the clients
    of ``pairs`` (all clients with ``peers``); ``copy_candidates`` (None: all) are the real participants.
    ``owners`` maps a scorer that is not a participant (the attack analysis' side-by-side submissions) to the
    participant whose pool peers it gets; such a scorer is checked against the pool for copies and paid as a
    real submission would be (a ``lagged:K`` replay of its owner's pool entry is an own resubmission, as a real
    lagged node's is), but never joins the pool nor decides an undetermined round. Scorers neither real nor owned
    are scored on their in-round pairs only. A scorer whose every pool copy is its owner's own earlier
    submission (a real ``stale`` node; the analysis client's ``stale`` and ``lagged:K`` replays) is scored as
    ``score_with_pool`` with no pool scores it (see the module docstring). ``reference``: the packed sign words
    of a trusted reference update (``fl.reference``), a peer of every scorer with weight ``reference_weight``
    (0: ignored).
    """
    report = packer.score(peers=peers, pairs=pairs, seed=seed, penalty=penalty, bonus_fraction=bonus_fraction,
                          duplicates=duplicates, duplicate_rule=duplicate_rule, copy_candidates=copy_candidates)
    reference_weight = check_reference_weight(reference_weight)
    if reference is not None and reference_weight > 0:
        reference = np.asarray(reference)
        if reference.dtype != np.int32 or reference.shape != (packer.words()[0].shape[1],):
            raise InputError(f"the reference's sign words have shape {reference.shape} ({reference.dtype}); this "
                             f"round's are ({packer.words()[0].shape[1]},) int32", client=REFERENCE)
    else:
        reference = None
    in_round_rewards = dict(report.rewards)
    pool_on = pool is not None and pool.settings.enabled
    if not pool_on and reference is None:
        return PooledRound(report, {c: [] for c in report.rewards}, (), in_round_rewards=in_round_rewards)
    real = set(packer.clients if copy_candidates is None else map(str, copy_candidates))
    in_round = report.peers
    owner = {c: c for c in real} | dict(owners or {})
    short = [c for c in sorted(report.rewards)
             if pool_on and c in owner and len(set(in_round[c])) < pool.settings.min_peers]
    if not short and reference is None:
        return PooledRound(report, {c: [] for c in report.rewards}, (), in_round_rewards=in_round_rewards)
    chosen = {c: pool.candidates(round_, owner[c], exclude=sorted(real)) for c in short}
    # Every entry of the window and the round before it: copy detection covers them all, lag weights need them.
    rows = {e.name: e for e in pool.entries(round_, extra=1)} if short else {}
    if not rows and reference is None:
        undetermined = tuple(c for c in short if c in real)
        report = dataclasses.replace(report, rewards={c: 0.0 if c in short else r for c, r in report.rewards.items()})
        return PooledRound(report, {c: [] for c in report.rewards}, undetermined, in_round_rewards=in_round_rewards,
                           short=tuple(short), warming=_warming(short, {}, undetermined, pool.settings))
    return _score_pooled(packer, pool, round_, report, rows, chosen, real, owner, seed=seed, penalty=penalty,
                         bonus_fraction=bonus_fraction, duplicates=duplicates, duplicate_rule=duplicate_rule,
                         reference=reference, reference_weight=reference_weight)


def _score_pooled(packer: SignPacker, pool: PeerPool, round_: int, round_report: RewardReport,
                  rows: Mapping[str, PoolEntry], chosen: Mapping[str, list[PoolEntry]], real: set[str],
                  owner: Mapping[str, str], *,
                  seed: int, penalty: str, bonus_fraction: float, duplicates: str, duplicate_rule: DuplicateRule,
                  reference: np.ndarray | None, reference_weight: float) -> PooledRound:
    signs, task = packer.words()
    names = [*packer.clients, *rows, *([REFERENCE] if reference is not None else [])]
    index = {name: k for k, name in enumerate(names)}
    # The pooled rows on the CPU backend (host words; the bits are what they are on any backend, and every
    # backend counts them to the same integers), on this round's task mask and partition.
    cpu = get_backend("cpu")
    buffers = cpu.allocate(len(names), packer.layout)
    n_words = signs.shape[1]
    buffers.signs[:len(packer.clients), :n_words] = signs
    for k, entry in enumerate(rows.values(), start=len(packer.clients)):
        if entry.signs.shape != (n_words,):
            raise InputError(f"pool entry {entry.name} has {entry.signs.shape[-1]} sign words, this round {n_words}")
        buffers.signs[k, :n_words] = entry.signs
    if reference is not None:
        buffers.signs[index[REFERENCE], :n_words] = reference
    buffers.task[:n_words] = task
    counts = cpu.round_counts(buffers, seed, bonus_fraction)

    pool_copies, lag_weights = (), {}
    if rows:
        pool_names = names[:len(packer.clients) + len(rows)]
        pool_copies = pool_copies_of(counts, pool_names, len(packer.clients), set(owner), duplicate_rule)
        pool_copies += sketch_copies_of(signs, names[:len(packer.clients)], set(owner), lambda words: pool.sketch_copies(
            words, task, round_, duplicate_rule.max_disagreement))
        lag_weights = pool_lag_weights(counts, list(rows.values()), len(packer.clients), round_, pool.settings.window)
    own = _own_resubmissions(pool_copies, owner)
    pool_copies = tuple(dataclasses.replace(g, note=OWN_RESUBMISSION) if own & set(g.clients) else g
                        for g in pool_copies)
    in_round_keys = list(round_report.pairwise)
    pool_keys = [(client, e.name) for client, entries in chosen.items() if client not in own for e in entries]
    lag_of = {e.name: lag_weights.get(round_ - e.round, 0.0) for e in rows.values()}
    reference_keys = [(client, REFERENCE) for client in sorted(round_report.rewards)] if reference is not None else []
    keys = [*in_round_keys, *pool_keys, *reference_keys]
    index_pairs = np.array([(index[c], index[p]) for c, p in keys], dtype=np.int64)
    matches = cpu.sampled_matches(buffers, seed, bonus_fraction, index_pairs) if penalty == "sampled" else None
    payment, bonus, penalty_agreement = pair_payments(counts, index_pairs, matches)
    pay = dict(zip(keys, payment.tolist()))
    terms_of: dict[str, list[tuple[float, float]]] = {}
    for key in pool_keys:
        terms_of.setdefault(key[0], []).append((lag_of[key[1]], pay[key]))
    verdict = pool_scores(terms_of)
    # An own resubmission's pool term: 0 at the pool's weight, where the pool could have judged it.
    own_pool = {c: pool.settings.weight for c in own
                if c in chosen and any(lag_of.get(e.name, 0.0) for e in chosen[c])}

    def peer_verdict(peer: str) -> float | None:
        return None if peer in own or peer not in verdict else verdict[peer][0]

    weights = [1.0 if c not in verdict or (p not in chosen and p not in own)
               else orientation(pay[(c, p)], verdict[c][0], peer_verdict(p)) for c, p in in_round_keys]
    weights += [lag_of[p] * pool.settings.weight / verdict[c][1] if c in verdict else 0.0 for c, p in pool_keys]
    weights += [reference_weight] * len(reference_keys)
    terms = dict(zip(keys, map(PairPayment, payment.tolist(), bonus.tolist(), penalty_agreement.tolist())))
    joints = dict(zip(keys, joint_tables(counts, index_pairs)))
    groups = (*round_report.duplicates, *pool_copies)
    report = RewardReport.from_pairs(terms, joints, seed=seed, penalty=penalty, bonus_fraction=bonus_fraction,
                                     backend=round_report.backend, labels=SIGN_LABELS, tasks=round_report.tasks,
                                     duplicates=groups, duplicate_policy=duplicates)
    unadjusted = weighted_means(keys, payment, weights, own_pool)
    paid = apply_pool_policy(unadjusted, round_report.duplicates, [g for g in pool_copies if g.note is None], duplicates)
    weighted: dict[str, set[str]] = {c: {"(pool)"} for c in own_pool}
    for (client, peer), weight in zip(keys, weights):
        if weight != 0.0:
            named = parse_pool_name(peer)
            weighted.setdefault(client, set()).add(named[0] if named else peer)
    # Fewer distinct peers than min_peers: no majority that could outvote a deviator, so the reward is not paid.
    # A trusted reference tells an honest participant from a deviator at any round size.
    unsure = set() if reference is not None else {c for c in chosen if len(weighted.get(c, ())) < pool.settings.min_peers}
    paid |= {c: 0.0 for c in unsure}
    report = dataclasses.replace(report, unadjusted_rewards=unadjusted, rewards=paid)
    undetermined = tuple(sorted(c for c in unsure if c in real))
    # An own resubmission never meets the pool: nothing stands behind its reward but its round.
    support = {c: 0 if c in own else len({e.participant for e in entries if lag_weights.get(round_ - e.round, 0.0)})
               for c, entries in chosen.items()}
    # A trusted reference tells an honest participant from a deviator at any round size: nothing warms up.
    warming = () if reference is not None else _warming(list(chosen), support, undetermined, pool.settings)
    return PooledRound(report, {c: [] if c in own else [e.name for e in chosen.get(c, [])] for c in report.rewards},
                       undetermined, pool_copies, lag_weights, in_round_rewards=dict(round_report.rewards),
                       short=tuple(chosen), warming=warming)


def _warming(short: Sequence[str], support: Mapping[str, int], undetermined: Sequence[str],
             settings: PoolSettings) -> tuple[str, ...]:
    """The short scorers the pool is still warming up for: undetermined, or fewer than ``pool_peers`` distinct
    pool participants of non-zero weight (``support``) behind the reward."""
    return tuple(c for c in short if c in undetermined or support.get(c, 0) < settings.pool_peers)


def _own_resubmissions(pool_copies: Sequence[DuplicateGroup], owner: Mapping[str, str]) -> set[str]:
    """Scorers every pool copy of which is an earlier submission of their owner (a group of a scorer and entries
    of another participant, or of several, is not: it is paid under the duplicate policy)."""
    own, other = set(), set()
    for group in pool_copies:
        for client in (c for c in group.clients if c in owner):
            entries = [parse_pool_name(m) for m in group.clients if m != client]
            (own if all(e is not None and e[0] == owner[client] for e in entries) else other).add(client)
    return own - other
