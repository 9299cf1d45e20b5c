"""The peer pool's store: the last rounds' packed sign words by round and participant, their rounds' scores
(vetting and records) and the run's sketches, with the settings that say how short rounds use them
(``fl.peer_pool`` scores with it; who may be a peer, and a participant's record and reputation, are
``fl.pool_policy``'s)."""

from __future__ import annotations

import dataclasses
import json
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from ..errors import InputError
from .pool_copies import OWN_REPLAY_MAX_DISAGREEMENT, set_bits, sketch
from .pool_policy import eligible
from .pool_settings import POOL_KEYS, POOL_RULE, check_pool_rule

POOL_SEPARATOR = "@"
"""Pool peer names are ``<participant>@<round>`` (the ledger's ``peers`` column records them)."""


RANK_RULES = ("record", "verdict", "verdict-first", "reputation")
VERDICT_GATE = 2.0
"""Standard errors by which two verdicts must differ to settle a disagreeing pair alone (``rank_by="verdict-first"``)."""


@dataclass(frozen=True)
class PoolSettings:
    """How short rounds borrow peers: the sizes and the weight are declared, defaults and bounds, in
    ``fl.pool_settings.POOL_KEYS`` (the recipe's keys derive from the same table)."""

    min_peers: int = POOL_KEYS["min_peers"].default
    """A participant with fewer in-round peers is also scored against pool peers; fewer distinct peers in
    all leaves the round undetermined. 0 turns the pool off (today's scoring, never undetermined)."""
    window: int = POOL_KEYS["window"].default
    """Rounds of sign words kept."""
    pool_peers: int = POOL_KEYS["pool_peers"].default
    """Pool peers per short participant (distinct participants, most recent first)."""
    weight: float = POOL_KEYS["weight"].default
    """The weight of the pool's verdict as a whole (its weighted mean payment) against an in-round peer's 1."""
    own_replay_limit: float = OWN_REPLAY_MAX_DISAGREEMENT
    """The fraction of signs in which a submission may differ from an earlier one of its own participant and still be
    a replay of it (``fl.pool_copies``): 0 where a client may train on the same samples again (FlowerTune's static data
    order); ``DYNAMIC_ORDER_OWN_REPLAY_LIMIT`` (rule 3's 2%) is safe only where every participation trains on other
    samples (``train.dynamic-data-seed = true``). A replay is a copy by ``DuplicateRule.max_disagreement`` as well:
    a limit above that acts as it."""
    rank_by: str = "record"
    """How a disagreeing pair is settled (``fl.pool_weights.orientation``): ``"record"``, by each one's verdict plus its
    record; ``"verdict"``, by the verdicts alone (within public strata the lower verdict catches a flip in its round, and
    no record is there for a sleeper to spend; measured to let free riders win more noisy disagreements with honest
    partners); ``"verdict-first"``, by the verdicts alone where they differ by more than ``VERDICT_GATE`` standard errors
    of their difference (a participant that turns deviator cannot spend its record against a clear verdict), else as
    ``"record"``; ``"reputation"``, by each one's reputation (``fl.pool_policy.reputation``): what the pool's verdicts
    told of it, this round's and its earlier submissions', never its in-round payments, which the ranking itself
    decides."""
    next_round: bool = True
    """Whether a disagreeing pair that no other evidence settles waits for the round after it, which then ranks it
    (pool rule 15, ``fl.pool_next``): its two participants are paid a round later. False: such a pair is ranked in its
    round on the verdicts and records, as under rule 14 (tests of that ranking; a settled pair the round after cannot
    settle is ranked so too)."""
    rule: int = POOL_RULE
    """The pooled-scoring rule these settings were recorded under (``POOL_RULE``: the one this version computes;
    a ledger of an earlier rule is not rescored with this one)."""

    def __post_init__(self):
        for name, key in POOL_KEYS.items():
            key.check(name, getattr(self, name))
        if self.rank_by not in RANK_RULES:
            raise InputError(f"peer pool: rank_by must be one of {', '.join(RANK_RULES)}, got {self.rank_by!r}")
        if (isinstance(self.own_replay_limit, bool) or not isinstance(self.own_replay_limit, (int, float))
                or not 0 <= self.own_replay_limit < 0.5):
            raise InputError(f"peer pool: own_replay_limit must be a fraction in [0, 0.5), got {self.own_replay_limit!r}")
        if not isinstance(self.next_round, bool):
            raise InputError(f"peer pool: next_round must be true or false, got {repr(self.next_round)[:40]}")
        check_pool_rule(self.rule)

    @property
    def enabled(self) -> bool:
        return self.min_peers > 0

    @property
    def judges_values(self) -> bool:
        """Whether an own match on every sign must repeat the values too (pool rule 11: a limit of 0), so that the
        submissions' value sketches (``fl.pool_values``) are worth computing and keeping."""
        return self.enabled and self.own_replay_limit == 0

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def recorded_pool_settings(recorded: Mapping) -> PoolSettings:
    """The settings a ledger recorded for its run, as this version's (whatever rule they were recorded under: a
    round that needed the pool is rescored only under the rule it was paid by, which ``recompute`` checks); an
    ``InputError`` for ``rank_by="reputation"``, whose evidence the ledger's rows do not hold (a rebuilt pool would
    rank without it, and a verifier would take the difference for tampering)."""
    if recorded.get("rank_by") == "reputation":
        raise InputError("peer pool: a ledger does not record the verdicts' evidence that rank_by=\"reputation\" ranks "
                         "by; this version cannot rebuild such a run's pool")
    return PoolSettings(**{**recorded, "rule": POOL_RULE})


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


class PeerPool:
    """The last ``window`` rounds' sign words, by round and participant (see the module docstring)."""

    def __init__(self, settings: PoolSettings = PoolSettings()):
        self.settings = settings
        self._rounds: OrderedDict[int, dict[str, np.ndarray]] = OrderedDict()
        self._sketches: list[tuple[str, np.ndarray]] = []
        self._words: int | None = None
        self._scores: dict[str, float | None] = {}
        """Pool name -> its round's score of it before copies and the undetermined rule (``unadjusted_rewards``;
        None: not recorded), run-long (a float a submission, as the sketches): only entries of the window scored > 0
        (or not recorded) become pool peers, a deviator's entries stay for copy detection and lag weights only; every
        scored submission not charged back since counts in its participant's record (``fl.pool_policy.record``)."""
        self.pending: dict[int, object] = {}
        """Round -> its ``fl.pool_settle.PendingRound``: undetermined rounds waiting to be settled."""
        self._paid: dict[str, float] = {}
        """Pool name -> what its submission was paid, net of a charge-back (run-long, as the sketches): what a
        participant resubmitting it, or turning against it, forfeits (``charge_of``)."""
        self._charged: set[str] = set()
        """Pool names of submissions charged back (their participant resubmitted them, or forfeited them by turning
        against them, ``fl.pool_reversal``): charged once, settled at most 0."""
        self._evidence: dict[str, float] = {}
        """Pool name -> what its round's verdict told of it (``fl.pool_weights.evidence_of``; missing: the pool had no
        verdict on it), run-long: what a reputation is built from (``fl.pool_policy.reputation``)."""
        self._values: dict[str, np.ndarray] = {}
        """Pool name -> its submission's value sketch (``fl.pool_values``; missing: none was given), run-long as the
        sketches: what tells an own replay from a retrain with the same signs (pool rule 11)."""

    def entries(self, before_round: int, extra: int = 0, horizon: int | None = None) -> list[PoolEntry]:
        """Entries of the ``window`` (+ ``extra``) rounds before ``before_round``, newest round first, then by name;
        with a ``horizon`` (a later round settling ``before_round``, ``fl.pool_settle``), also the rounds after it up
        to the horizon and the window, nearest round first (the later of two equally near), then by name."""
        low = before_round - self.settings.window - extra
        high = before_round - 1 if horizon is None else min(horizon, before_round + self.settings.window)
        rounds = [t for t in reversed(self._rounds) if low <= t <= high and t != before_round]
        if horizon is not None:
            rounds.sort(key=lambda t: (abs(t - before_round), -t))
        return [PoolEntry(t, who, words) for t in rounds for who, words in sorted(self._rounds[t].items())]

    def candidates(self, before_round: int, participant: str, exclude: Sequence[str],
                   horizon: int | None = None) -> list[PoolEntry]:
        """The pool peers of a short participant: the first ``pool_peers`` of the ``fl.pool_policy.eligible`` entries
        (the draw is the hook a benchmark overrides to draw otherwise among them)."""
        return eligible(self, before_round, participant, exclude, horizon)[:self.settings.pool_peers]

    def score_of(self, name: str) -> float | None:
        """Entry ``name``'s score in its round (None: not recorded)."""
        return self._scores.get(name)

    def run_scores(self, participant: str) -> dict[int, float | None]:
        """Round -> ``participant``'s score in it, for every submission of the run the pool recorded and did not charge
        back (``mark_charged``: what was taken back vouches for nothing), in the order they were added."""
        return {entry[1]: score for name, score in self._scores.items()
                if (entry := parse_pool_name(name)) is not None and entry[0] == participant
                and name not in self._charged}

    def run_evidence(self, participant: str) -> dict[int, float]:
        """Round -> what its verdict told of ``participant``'s submission, where the pool had a verdict on it."""
        return {entry[1]: value for name, value in self._evidence.items()
                if (entry := parse_pool_name(name)) is not None and entry[0] == participant}

    def values_of(self, name: str) -> np.ndarray | None:
        """Entry ``name``'s value sketch (None: none kept)."""
        return self._values.get(name)

    def add_round(self, round_: int, signs: Mapping[str, np.ndarray],
                  scores: Mapping[str, float] | None = None, paid: Mapping[str, float] | None = None,
                  evidence: Mapping[str, float] | None = None, values: Mapping[str, np.ndarray] | None = None) -> None:
        """Keep a round's sign words (call after scoring it, leaving out copies), its scores of them (the report's
        ``unadjusted_rewards``; missing: not recorded), what they were paid (``rewards``; missing: 0), their
        verdicts' evidence (``PooledRound.evidence``; missing: none) and their value sketches (``fl.pool_values``;
        missing: none); old rounds drop out."""
        if not signs:
            return
        widths = {int(np.asarray(w).shape[-1]) for w in signs.values()}
        if len(widths) != 1 or (self._words is not None and widths != {self._words}):
            self._rounds.clear()  # another layout: earlier words are not comparable (a new model)
            self.pending.clear()
            self._sketches.clear()
            self._scores.clear()
            self._paid.clear()
            self._charged.clear()
            self._evidence.clear()
            self._values.clear()
        self._words = widths.pop()
        self._rounds[int(round_)] = {who: np.ascontiguousarray(w, dtype=np.int32).copy() for who, w in signs.items()}
        self._scores.update({pool_name(who, round_): (scores or {}).get(who) for who in signs})
        self._sketches += [(pool_name(who, round_), sketch(w)) for who, w in sorted(signs.items())]
        self._paid.update({pool_name(who, round_): float((paid or {}).get(who, 0.0)) for who in signs})
        self._evidence.update({pool_name(who, round_): float(evidence[who]) for who in signs if who in (evidence or {})})
        self._values.update({pool_name(who, round_): np.array(values[who], dtype=np.float64)
                             for who in signs if who in (values or {})})
        # One round more than the window: lag weights up to the window's oldest round need pairs that far apart.
        for t in [t for t in self._rounds if t < round_ - self.settings.window]:
            del self._rounds[t]

    def sketches(self) -> list[tuple[str, np.ndarray]]:
        """(pool name, sketch words) of every submission of the run that joined the pool, in the order they joined."""
        return list(self._sketches)

    def rescore(self, name: str, score: float) -> None:
        """Record a later score of an entry (a settled round's, ``fl.pool_settle``)."""
        if name in self._scores:
            self._scores[name] = float(score)

    def settle_paid(self, name: str, reward: float) -> None:
        """Record what a settlement paid an entry (``fl.pool_settle``)."""
        if name in self._paid:
            self._paid[name] = float(reward)

    def charge_of(self, names: Sequence[str]) -> float:
        """What resubmitting or forfeiting ``names`` (earlier submissions of one participant) charges back: what each
        was paid, if more than 0, unless it was charged already."""
        return sum(max(self._paid.get(n, 0.0), 0.0) for n in sorted(set(names)) if n not in self._charged)

    def charged(self, name: str) -> bool:
        """Whether entry ``name`` was charged back (a settlement of it is paid at most 0)."""
        return name in self._charged

    def mark_charged(self, names: Sequence[str]) -> None:
        """``names`` were resubmitted or forfeited and charged back (``charge_of``): their net payment is at most 0 from
        now on."""
        for name in names:
            self._paid[name] = min(self._paid.get(name, 0.0), 0.0)
            self._charged.add(name)

    def sketch_copies(self, words: np.ndarray, task: np.ndarray, before_round: int, max_disagreement: float
                      ) -> list[tuple[str, float]]:
        """(entry, agreement) of earlier submissions older than the window whose sketch ``words`` matches."""
        mask, mine = sketch(task), sketch(words)
        bits = set_bits(mask)
        if bits == 0:
            return []
        low = before_round - self.settings.window
        out = []
        for name, other in self._sketches:
            if parse_pool_name(name)[1] >= low:
                continue  # in the window: compared on every bit
            differ = set_bits((mine ^ other) & mask)
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
        for k, values in enumerate(self._values.values()):
            arrays[f"values.{k}"] = values
        return arrays, {"entries": json.dumps(entries), "sketches": json.dumps([n for n, _ in self._sketches]),
                        "values": json.dumps(list(self._values)),
                        "scores": json.dumps(self._scores), "paid": json.dumps(self._paid),
                        "resubmitted": json.dumps(sorted(self._charged)), "evidence": json.dumps(self._evidence)}

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
        pool._paid = {str(k): float(v) for k, v in json.loads(metadata.get("paid", "{}")).items()}
        # "resubmitted": the key's name since rule 3 (rule 8 charges forfeited entries under it too)
        pool._charged = set(map(str, json.loads(metadata.get("resubmitted", "[]"))))
        pool._evidence = {str(k): float(v) for k, v in json.loads(metadata.get("evidence", "{}")).items()}
        pool._sketches = [(name, np.asarray(arrays[f"sketch.{k}"], dtype=np.int32))
                          for k, name in enumerate(json.loads(metadata["sketches"]))]
        pool._values = {str(name): np.asarray(arrays[f"values.{k}"], dtype=np.float64)
                        for k, name in enumerate(json.loads(metadata.get("values", "[]")))}
        return pool
