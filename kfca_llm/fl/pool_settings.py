"""The peer pool's sizes and weight, declared once: each one's default, bounds and name as a recipe key and a
``KFCAStrategy`` argument. ``fl.pool_store.PoolSettings`` takes its defaults from here and checks these bounds; the
recipe's ``kfca.*`` keys (``recipe_schema``), ``fl.scoring.pool_settings``, the Flower app and a checkpoint's
``fl.state.resume_settings`` derive from the same table, so no two of them can disagree (a window of 0 rounds
was once a valid ``PoolSettings`` and not a valid recipe: a pool that keeps nothing is turned off by
``min_peers = 0`` instead).

Free of numpy and the engine: validating a recipe imports it and must not import torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from numbers import Integral

from ..errors import InputError


@dataclass(frozen=True)
class PoolKey:
    """One setting: its ``KFCAStrategy`` argument, which is its recipe key as well (``kfca.<argument>``, kebab case
    in a file), its default and its bounds (pydantic's names: ``Field(default, **bounds())``)."""

    argument: str
    default: int | float
    ge: float | None = None
    gt: float | None = None
    le: float | None = None

    @property
    def integer(self) -> bool:
        return isinstance(self.default, int)

    def bounds(self) -> dict[str, float]:
        return {name: value for name, value in (("ge", self.ge), ("gt", self.gt), ("le", self.le)) if value is not None}

    def check(self, name: str, value) -> None:
        """An ``InputError`` naming ``PoolSettings``' field ``name`` where ``value`` is not of its type or bounds."""
        typed = isinstance(value, Integral) if self.integer else isinstance(value, (int, float))
        inside = typed and not isinstance(value, bool) and all((
            self.ge is None or value >= self.ge, self.gt is None or value > self.gt, self.le is None or value <= self.le))
        if not inside:
            limits = " and ".join(f"{sign} {limit:g}" for sign, limit in
                                  ((">=", self.ge), (">", self.gt), ("<=", self.le)) if limit is not None)
            kind = "an integer" if self.integer else "a number"
            raise InputError(f"peer pool: {name} must be {kind} {limits}, got {value!r}")


POOL_KEYS = {
    "min_peers": PoolKey("min_peers", 2, ge=0),
    "window": PoolKey("pool_window", 10, ge=1),
    "pool_peers": PoolKey("pool_peers", 8, ge=0),
    "weight": PoolKey("pool_weight", 0.5, gt=0.0, le=1e6),
}
"""``PoolSettings`` field -> its ``PoolKey``, in the order the recipe and ``KFCAStrategy`` list them (defaults measured
in ``benchmarks/ROBUSTNESS.md``). The own-replay limit is no recipe key: the recipe's data order decides it
(``fl.scoring.own_replay_limit``)."""


POOL_RULES = {
    1: "in-round and pool peers in one weighted mean, undetermined rounds paid",
    2: "in-round peers read the way the pool's verdict says (fl.pool_weights), pool peers only from entries paid > 0, "
       "undetermined rewards not paid; pool peers and the ranking of a disagreeing pair use the recorded scores "
       "(PeerPool.record: the window's)",
    3: "as 2, a participant's own resubmission is paid at most 0 with what the resubmitted update was paid charged "
       "back, and a participant's record is the lower of its window's and its run's",
    4: "as 3, an own resubmission is a replay within PoolSettings.own_replay_limit of the signs (default none), no "
       "longer the 2% of a copy of another's (an honest client retrained on the same samples is not charged back)",
    5: "as 4, within public strata a disagreeing pair is ranked on the lower of each one's verdict within and without "
       "them, and a participant whose reward would rest on the pool's verdict alone is undetermined while that "
       "verdict is within VERDICT_GATE standard errors of 0",
    6: "as 5, and a disagreeing pair whose verdicts without the strata settle it (fl.pool_weights.trajectory_settles: "
       "the lower below 0, VERDICT_GATE standard errors apart) is ranked on those alone, whatever the records",
    7: "as 6, a participant whose update has turned by its own lineage (fl.pool_reversal: it reverses its previous "
       "update, which had not turned and was scored > 0, or follows one that had) is ranked below a partner that has "
       "not, unless the trajectory settles the pair",
    8: "as 7, the lineage credits a reversed update with the scores of the updates it follows (fl.pool_reversal.credit), "
       "and a short participant whose update turned by reversing its previous one is paid at most 0 and forfeits "
       "what its submissions since its last turned one were paid (fl.pool_reversal.FORFEIT_SUBMISSIONS at most), "
       "charged back once; a forfeited submission settled later is paid at most 0",
    9: "as 8, within public strata an agreeing pair is read back for a participant whose verdict without the strata "
       "ran against the trajectory (more than VERDICT_GATE standard errors below 0) where its peer has turned by its "
       "own lineage (fl.pool_reward.agreement_read_back): two flipped updates that meet are fined their agreement",
    10: "as 9, a participant's record (fl.pool_policy.record) leaves out its submissions charged back (resubmitted, or "
        "forfeited by a turn), and a submission reporting one sign on every task (a zero update) is no in-round peer "
        "(fl.pool_evidence.one_sign): its partner is paid on the pool's verdict, undetermined while that is unclear",
    11: "as 10, under an own-replay limit of 0 an own resubmission repeats the values as well as every sign: its value "
        "sketch equals the earlier submission's up to their rounding slack (fl.pool_values); an honest retrain whose "
        "signs all repeat an earlier update's is scored as a fresh submission",
    12: "as 11, a participant's record (fl.pool_policy.record) is a Beta reputation of its run's submissions, how "
        "often they were scored > 0 (one scored <= 0 weighing two), no longer the lower of its window's and its run's "
        "mean score: early rounds, which pay five to ten times late ones, no longer outvote the rest",
    13: "as 12, an update's relation to its participant's previous one (fl.pool_reversal) is judged only against pairs "
        "of others starting in at least MIN_BASELINE_ROUNDS (4) rounds: early in a run, a baseline of a round or three "
        "took honest updates for turns and charged back what their previous submissions were paid",
    14: "as 13, an update reverses its participant's previous one on the evidence against that one or, where that one "
        "was alike the one before it, against both combined (fl.pool_reversal.own_relation): a sleeper's turn within "
        "noise of its last honest update is caught against its last two",
    15: "as 14, a disagreeing pair that neither the trajectory, a lineage nor (verdict-first) the verdicts settle is "
        "held undetermined and settled by the round after it (fl.pool_next): where that round's other participants "
        "agree with each other on half the tasks or more, the one of the pair that agrees less with them ranks lower, "
        "whatever the records",
    16: "as 15, the round after ranks on KFCA's payment against its participants within the public strata, and they "
        "agree where paid >= 0 (rule 15's sign agreement let a free rider replaying the global's change win), and "
        "the recipe's pool turns it off under kfca.aggregate = \"honest\" (fl.scoring.pool_settings)",
    17: "as 16, the run's last round (recorded with the setting closes_run: true) is the last chance of every round "
        "still waiting, its own included: whoever its pool determines is settled there, warm or not (a held pair "
        "with no round after it ranked on the verdicts and records), and nothing waits after it (fl.pool_settle)",
    18: "as 17, where the round after a held pair holds two participants that disagree with each other, the one of "
        "them that the rounds after it rank higher judges the pair alone (fl.pool_next.judges), and the pair waits "
        "for those rounds; the records rank it only where no round after it judges it by the last chance",
    19: "as 18, a waiting round scored again at a later horizon leaves its disagreeing pairs to the rounds after them "
        "first (fl.pool_next.open_pairs, settling): the verdicts without the strata, read then on rounds of both "
        "sides, rank a pair only where no round after judges it; the one the rounds after rank lower is paid at "
        "most 0 (fl.pool_reward.cap_judged_lower)",
    20: "as 19, an update also reverses its participant's previous one, 3 rounds or more before it (ANTI_ROUNDS), "
        "where their signs correlate more than ANTI_Z (4) standard errors below 0 and below the median of pairs of "
        "others as far apart (two at least; fl.pool_reversal.sign_correlation_z), whether or not those judge by rule "
        "7's margins (a sleeper's turn many rounds after its honest update, or where few rounds hold pairs, caught); "
        "and a reversal by those margins needs their signs correlated RUNS_AGAINST_Z (3) standard errors below 0 (an "
        "honest update that merely agreed with its previous one less than others did was taken for a turn)",
}
"""Every pooled-scoring rule a ledger may have recorded (its settings' ``pool.rule``), with what it changed: the one
registry that ``PoolSettings`` and a verifier (``flower.recompute``) read."""
POOL_RULE = max(POOL_RULES)
"""The rule this version computes: only rounds recorded under it are scored again."""


def check_pool_rule(rule) -> None:
    """An ``InputError`` unless ``rule`` is the rule this version computes, naming what the recorded one was."""
    if rule != POOL_RULE:
        known = f" ({POOL_RULES[rule]})" if isinstance(rule, int) and rule in POOL_RULES else " (no such rule)"
        shown = repr(rule)[:40]  # a hostile ledger's value is not echoed whole
        raise InputError(f"peer pool: rule {shown}{known} is not the rule this version computes ({POOL_RULE})")
