"""The cross-round reward: a round that needs the pool (or meets a trusted reference) is paid in these steps, each
applied once, in this order (``fl.peer_pool.score_with_pool`` runs them; the module docstring there says why each
rule is what it is):

1. **gather** (``fl.pool_evidence.gather_evidence``): the pair counts, pool copies and own resubmitters, the pairs
   scored and their payments, the lag weights, the pool's verdicts with their errors, those without the public strata,
   and the participants whose update has turned by their own lineage (``fl.pool_reversal``);
2. **rank** (``rank_pairs``): each in-round pair's two ranks: the verdict (within public strata the lower of the one
   within and the one without them) plus the record, or the reputation, or the verdict alone, as ``rank_by`` says; a
   pair the verdicts settle (``"verdict-first"``) is ranked on those; a pair of which one participant has turned by
   its lineage and the other not, the turned one lower; within public strata a pair the trajectory settles on the
   verdicts without the strata, whatever came before; and, settling a waiting round, each of its disagreeing pairs
   (the trajectory's too: pool rule 19) on the round after it where that round settles it, or on the one of it the
   rounds after it rank higher (``fl.pool_next``, pool rules 15 and 18);
3. **orient** (``orient_weights``): each pair's weight: an in-round peer read the way the ranks say (an agreeing pair
   as it is, unless pool rule 9 reads it back: ``agreement_read_back``; a peer reporting one sign on every task
   weighs 0, pool rule 10), a pool peer at its lag's weight over the verdict's, the trusted reference at its weight;
4. **pay** (``pay_weighted_means``): the weighted mean of each scorer's payments (an own resubmission's pool term 0),
   then the round's duplicate policy on in-round copies and copies of pool entries;
5. **hold the unsure** (``hold_unsure``): a short scorer with fewer than ``min_peers`` distinct weighted peers, or
   within public strata paid on a pool verdict alone that stands within ``VERDICT_GATE`` standard errors of 0, is
   paid 0 (``unpaid``; a real participant undetermined), never with a trusted reference, never one step 6 charges
   (its reward is known); and so, as its round is scored, is a scorer of a disagreeing pair that nothing of step 2
   settles (**held**: it waits for the round after it, pool rule 15);
6. **charge back** (``charge_back``): a participant that resubmitted its own earlier entries (none under the duplicate
   policy ``flag``), or whose update turned against its own earlier ones (pool rule 8, ``fl.pool_reversal``), is paid
   at most 0, less what those entries were paid (once);
7. **cap the charged** (``cap_charged``): a submission charged back since (settled late, ``fl.pool_settle``) is paid
   at most 0;
8. **cap the judged lower** (``cap_judged_lower``): settling, the one of a waiting pair that the rounds after it
   ranked lower is paid at most 0 (pool rule 19);
9. **warming** (``warming``): the short scorers undetermined or with fewer than ``pool_peers`` distinct pool
   participants of non-zero lag weight behind their reward, and, settling, those of a held pair whose judges come in
   a round after the horizon (pool rule 18) (none with a trusted reference).

Steps 5 to 8 overwrite what step 4 paid after its duplicate policy: an undetermined reward is 0 whatever that policy
paid, and a charge-back is never split or zeroed by it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ..engine.stats import PairPayment, joint_tables
from ..packer import SIGN_LABELS
from ..report import Pair, RewardReport
from .pool_copies import apply_pool_policy
from .pool_evidence import PoolEvidence, PooledScoring, against_trajectory
from .pool_policy import record, reputation
from .pool_store import VERDICT_GATE, PeerPool, PoolSettings, parse_pool_name, pool_name
from .pool_weights import (evidence_of, lower_verdicts, orientation, trajectory_settles, verdict_settles,
                           weighted_means)

Ranks = dict[Pair, tuple[float, float | None]]
"""In-round pair of a scorer the pool has a verdict on -> (its rank, its peer's; None: the pool has none)."""


def rank_pairs(ev: PoolEvidence, pool: PeerPool | None, horizon: int | None) -> tuple[Ranks, dict[str, float]]:
    """Step 2: the ranks of each in-round pair, and the verdicts' evidence (``evidence_of``) the pool keeps of its real
    participants (under ``rank_by="reputation"`` only: a ledger does not record it)."""
    # Who the pool ranks lower in a disagreeing pair: this round's verdict plus, for a real participant, its recent
    # record (an analysis scorer's owner's record is an honest submission's, not the strategy's). Within public strata
    # the verdict ranked is the lower of the one within them and the one without them, each with its error: neither
    # following the trajectory (a free rider) nor running against it (a flip) then ranks high.
    ranked = lower_verdicts({c: (z, ev.errors[c]) for c, (z, _) in ev.verdict.items()}, ev.blind)
    evidence = {c: evidence_of(*ranked[c]) for c in ev.verdict}
    rank_by = pool.settings.rank_by if pool is not None else "record"  # (no pool: a reference alone, no verdicts)
    if rank_by == "reputation":  # the verdicts' evidence, this round's and the participant's earlier ones
        rank = {c: reputation(pool, c, ev.round, t, horizon) if c in ev.real else t for c, t in evidence.items()}
    elif rank_by == "verdict":  # no record a sleeper could spend
        rank = {c: z for c, (z, _) in ranked.items()}
    else:
        rank = {c: z + ((record(pool, c, ev.round, horizon) if c in ev.real else None) or 0.0)
                for c, (z, _) in ranked.items()}
    if rank_by == "verdict-first":  # a clear difference of verdicts settles alone
        clear = {(c, p) for c, p in ev.in_round_keys if c in ev.verdict and p in ev.verdict and p not in ev.own
                 and verdict_settles(ranked[c], ranked[p], VERDICT_GATE)}
        rank_of = {(c, p): ((ranked[c][0], ranked[p][0]) if (c, p) in clear else (rank[c], rank.get(p)))
                   for c, p in ev.in_round_keys if c in ev.verdict}
    else:
        rank_of = {(c, p): (rank[c], rank.get(p)) for c, p in ev.in_round_keys if c in ev.verdict}
    # A participant whose update has turned by its own lineage (pool rule 7) is ranked below a partner that has not.
    rank_of |= {(c, p): (-1.0, 0.0) if c in ev.turned else (0.0, -1.0) for c, p in rank_of
                if p in ev.verdict and p not in ev.own and (c in ev.turned) != (p in ev.turned)}
    # Within public strata, a pair the trajectory settles is ranked on the verdicts without the strata alone, whatever
    # the records: one of them clearly ran against the way the pool moved (a flip; a sleeper's or an on-off
    # attacker's record cannot buy it back).
    blind = ev.blind
    rank_of |= {(c, p): (blind[c][0], blind[p][0]) for c, p in rank_of if c in blind and p in blind
                and p not in ev.own and trajectory_settles(blind[c], blind[p], VERDICT_GATE)}
    # A held pair that the round after it settles (pool rule 15, settling only) is ranked on that round alone: the one
    # paid less against the next round's participants deviated, whatever the records.
    rank_of |= ev.next_round
    return rank_of, {c: t for c, t in evidence.items() if c in ev.real and rank_by == "reputation"}


def orient_weights(ev: PoolEvidence, rank_of: Ranks, pool: PeerPool | None, reference_weight: float) -> list[float]:
    """Step 3: each pair's weight, in ``ev.keys``' order."""
    pay = ev.pay
    weights = [1.0 if c not in ev.verdict or (p not in ev.chosen and p not in ev.own)
               else 0.0 if p in ev.constant  # one sign on every task: no report to agree with (pool rule 10)
               else -1.0 if agreement_read_back(ev, c, p)
               else orientation(pay[(c, p)], rank_of[(c, p)][0], None if p in ev.own else rank_of[(c, p)][1])
               for c, p in ev.in_round_keys]
    weights += [ev.lag_of[p] * pool.settings.weight / ev.verdict[c][1] if c in ev.verdict else 0.0
                for c, p in ev.pool_keys]
    return weights + [reference_weight] * len(ev.reference_keys)


def agreement_read_back(ev: PoolEvidence, scorer: str, peer: str) -> bool:
    """Pool rule 9: whether an agreeing in-round pair is read back for ``scorer`` (fined the agreement): its peer has
    turned by its own lineage (``fl.pool_reversal``: a flipped update, by its participant's earlier ones) and the
    scorer's own verdict without the public strata ran against the trajectory (``fl.pool_evidence.against_trajectory``):
    two flipped updates that meet agree, and the lineage and the trajectory both say so. Without public strata, or
    where either says nothing, the agreement counts as it is. The trajectory alone is not enough, even where both of
    the pair ran against it: where free riders replaying the global's change fill the pool, two honest updates that
    agree can both look as if they ran against it (benchmarks/ROBUSTNESS.md, pool rule 10)."""
    return (ev.pay[(scorer, peer)] >= 0.0 and peer in ev.turned and peer not in ev.own
            and against_trajectory(ev.blind.get(scorer)))


def pay_weighted_means(ev: PoolEvidence, weights: Sequence[float], duplicates: str
                       ) -> tuple[dict[str, float], dict[str, float]]:
    """Step 4: (each scorer's weighted mean payment, what it is paid under the duplicate policy ``duplicates``)."""
    unadjusted = weighted_means(ev.keys, ev.payment, weights, ev.own_pool)
    paid = apply_pool_policy(unadjusted, ev.round_report.duplicates, [g for g in ev.pool_copies if g.note is None],
                             duplicates)
    return unadjusted, paid


def hold_unsure(ev: PoolEvidence, weights: Sequence[float], paid: Mapping[str, float], pool: PeerPool | None,
                scoring: PooledScoring) -> tuple[dict[str, float], set[str]]:
    """Step 5: (``paid`` with the unsure short scorers paid 0, those scorers)."""
    weighted: dict[str, set[str]] = {c: {"(pool)"} for c in ev.own_pool}
    for (client, peer), weight in zip(ev.keys, weights):
        if weight != 0.0:
            named = parse_pool_name(peer)
            weighted.setdefault(client, set()).add(named[0] if named else peer)
    # Fewer distinct peers than min_peers: no majority that could outvote a deviator, so the reward is not paid.
    # A trusted reference tells an honest participant from a deviator at any round size. Within public strata, nor
    # where the pool's verdict alone would pay it (no in-round peer counted) and stands within VERDICT_GATE standard
    # errors of 0: there an honest update's verdict across rounds can be as weak as noise, and a payment of noise is no
    # evidence (the in-round peer an own resubmission or a constant report, say).
    counted = {c for (c, _), weight in zip(ev.in_round_keys, weights) if weight != 0.0}
    # Pool rule 15: as the round is scored, a scorer whose disagreeing pair nothing else settles waits for the round
    # after it (fl.pool_next).
    held = {c for c, _ in ev.held} if scoring.horizon is None else set()
    unsure = set() if scoring.reference is not None else {
        c for c in ev.chosen if c not in ev.resubmitted and c not in ev.forfeited and (
            c in held or len(weighted.get(c, ())) < pool.settings.min_peers or (
                scoring.planes is not None and c in ev.verdict and c not in counted
                and not abs(ev.verdict[c][0]) > VERDICT_GATE * ev.errors[c]))}
    return paid | {c: 0.0 for c in unsure}, unsure


def charge_back(ev: PoolEvidence, paid: Mapping[str, float], pool: PeerPool | None
                ) -> tuple[dict[str, float], dict[str, float], dict[str, float]]:
    """Step 6: (``paid`` with each own resubmitter and each forfeiting participant paid at most 0 less its charge, the
    resubmissions' charges, the forfeits' charges): what the resubmitted or forfeited submissions were paid is charged
    back, once (``PeerPool.charge_of``); its reward is known then, never undetermined."""
    charged_back = {c: pool.charge_of(names) for c, names in ev.resubmitted.items()}
    forfeit = {c: pool.charge_of(names) for c, names in ev.forfeited.items()}
    return (paid | {c: min(paid[c], 0.0) - charge for c, charge in (charged_back | forfeit).items()}, charged_back,
            forfeit)


def cap_judged_lower(ev: PoolEvidence, paid: Mapping[str, float]) -> dict[str, float]:
    """Step 8: ``paid`` with the one of a waiting pair that the rounds after it ranked lower (``ev.next_round``) paid
    at most 0 (pool rule 19): settling, its verdict reads the rounds after it too, and such verdicts paid flippers more
    than their honest partners, whom the rounds after ranked higher (``fl.pool_next``)."""
    return paid | {c: min(paid[c], 0.0) for (c, _), (mine, theirs) in ev.next_round.items() if mine < theirs}


def cap_charged(ev: PoolEvidence, paid: Mapping[str, float], pool: PeerPool | None) -> dict[str, float]:
    """Step 7: ``paid`` with a submission charged back since (its participant resubmitted or forfeited it; settled
    late, ``fl.pool_settle``) paid at most 0."""
    return paid | {c: min(paid[c], 0.0) for c in paid
                   if pool is not None and c in ev.real and pool.charged(pool_name(c, ev.round))}


def warming(short: Sequence[str], support: Mapping[str, int], undetermined: Sequence[str],
            settings: PoolSettings) -> tuple[str, ...]:
    """Step 8: the short scorers the pool is still warming up for: undetermined, or fewer than ``pool_peers`` distinct
    pool participants of non-zero weight (``support``) behind the reward."""
    return tuple(c for c in short if c in undetermined or support.get(c, 0) < settings.pool_peers)


def pair_report(ev: PoolEvidence, scoring: PooledScoring) -> RewardReport:
    """The report of every pair scored (its rewards before the rules: the caller sets what the steps paid)."""
    keys = ev.keys
    terms = dict(zip(keys, map(PairPayment, ev.payment.tolist(), ev.bonus.tolist(), ev.penalty_agreement.tolist())))
    joints = dict(zip(keys, joint_tables(ev.counts, ev.index_pairs)))
    return RewardReport.from_pairs(terms, joints, seed=scoring.seed, penalty=scoring.penalty,
                                   bonus_fraction=scoring.bonus_fraction, backend=ev.round_report.backend,
                                   labels=SIGN_LABELS, tasks=ev.round_report.tasks,
                                   duplicates=(*ev.round_report.duplicates, *ev.pool_copies),
                                   duplicate_policy=scoring.duplicates)
