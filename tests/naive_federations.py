"""The random federations of the naive-reference tests (``test_pool_naive``, ``test_pool_naive_copies``), and how the
real pool and the naive reference (``fl.pool_naive``) each pay one: honest clients, a flipper, a zero-submitter, a
stale node (its first update, resubmitted byte for byte), a copier of another client's latest update (1% of its signs
turned), a retrainer close to its own first update (1 sign to 3% of its signs turned, outside the sketch when the
update is longer than the sketch: a replay only within ``own_replay_limit``; at every other participation from its
third it rescales instead: its first update with every value scaled by a factor in [0.5, 1.5], every sign repeated
and no value, as an honest retrain late in a static data order: a replay only under a non-zero limit), a twin (its
in-round partner's update, 1% turned: an in-round copy), an old copier (another client's first update, 3% of its signs
turned outside the sketch when the update is longer than the sketch, else 1%), and an analysed client whose
side-by-side submissions the attack analysis scores (a flip of its update, its first, its update of two participations
back, its round's other participant's with 1% turned); with a trusted reference in every round, in some or in none;
updates of 256 coordinates (the sketch is the whole update) and of 8,492 (the sketch is 128 of its 266 words)."""

from dataclasses import dataclass

import numpy as np

from kfca_llm.api import pack_updates
from kfca_llm.engine.duplicates import DuplicateRule
from kfca_llm.engine.public import OFF, PublicConditioning
from kfca_llm.fl.peer_pool import PeerPool, PoolSettings, score_with_pool
from kfca_llm.fl.pool_close import ClosingRound, close_round
from kfca_llm.fl.pool_naive import naive_run
from kfca_llm.fl.pool_naive_round import sketched
from kfca_llm.fl.pool_values import value_sketch
from kfca_llm.fl.reference import reference_signs

SHORT, LONG = 256, 8492
CLIENTS = 10
ANALYST, FLIP, ZERO, STALE, COPIER, RETRAINER, TWIN, OLD_COPIER, ON_OFF = range(9)
RESCALER = RETRAINER  # the retrainer rescales at every other participation
SLEEPER = 9  # honest, or a sleeper where a federation has one
ROUNDS = 18
OWN_DIRECTION = 1.0
"""The scale of each client's own data direction in its honest updates (the shared ones are 0.4 and about 1.2, the
noise 1): a client trains on its own data, so its updates correlate with each other, and a flip runs against them by
the standard errors pool rule 20 asks for (without it, 256 coordinates left a turn within them of chance)."""


@dataclass
class Federation:
    rounds: list[dict[str, list[float]]]
    """Each round's submissions: its two participants' and the analysed client's side-by-side ones."""
    owners: list[dict[str, str]]
    references: list[list[float] | None]
    seeds: list[int]


def federation(seed: int, rounds: int = ROUNDS, coords: int = SHORT, reference: str = "none",
               meetings: int = 0, sleeper: bool = False, chains: int = 0, own: float = OWN_DIRECTION) -> Federation:
    """Each round: two clients drawn at random, each submitting what its role says; ``reference``: "none", "all"
    (an honest update of its own every round) or "some" (in a random half of the rounds); ``meetings``: from round
    ``meetings`` on, every ``meetings``-th round the flipper and the on-off client instead (0: never); ``sleeper``:
    client ``SLEEPER``, honest otherwise, flips its update from its third on; ``chains``: from round ``chains`` on,
    every ``chains``-th round the flipper and client ``SLEEPER`` instead, and the round after it client ``ANALYST``
    and the on-off client, flipping there (a held pair whose round after disagrees with itself, pool rule 18);
    ``own``: the scale of each client's own data direction in its honest updates."""
    rng = np.random.default_rng(seed)
    persistent = rng.standard_normal(coords)
    direction = rng.standard_normal(coords)
    # each client's own data direction (its own generator: the draws of the pairs stay the seed's), so that a client's
    # updates correlate with each other more than with other clients' and a flip runs against them (pool rule 20)
    own_rng = np.random.default_rng([seed, 20])
    own_direction = {c: own * own_rng.standard_normal(coords) for c in range(CLIENTS)}
    outside = np.setdiff1d(np.arange(coords), sketched(list(range(coords)), coords))
    earlier: list[tuple[int, np.ndarray]] = []  # (client, submission) of every round so far
    mine: dict[int, list[np.ndarray]] = {}  # each client's submissions
    out = Federation([], [], [], [1000 * seed + t for t in range(1, rounds + 1)])
    for _ in range(rounds):
        direction = -0.5 * direction + rng.standard_normal(coords)

        def honest(c=None):
            return 0.4 * persistent + (0.0 if c is None else own_direction[c]) + direction + rng.standard_normal(coords)

        round_ = {}
        pair = sorted(rng.choice(CLIENTS, size=2, replace=False).tolist(), key=lambda c: c == TWIN)
        if meetings and (len(out.rounds) + 1) % meetings == 0:
            pair = [FLIP, ON_OFF]
        chained = chains and len(out.rounds) % chains == 0 and len(out.rounds)
        if chains and (len(out.rounds) + 1) % chains == 0:
            pair = [SLEEPER, FLIP]
        elif chained:
            pair = [ANALYST, ON_OFF]
        for c in pair:
            update = honest(c)
            if c == FLIP or (c == ON_OFF and (chained or len(mine.get(c, ())) % 2 == 1)) or (  # on-off: every other
                    sleeper and c == SLEEPER and len(mine.get(c, ())) >= 2):
                update = -update
            elif c == ZERO:
                update = np.zeros(coords)
            elif c == STALE and c in mine:
                update = mine[c][0]
            elif c == COPIER and any(who not in (c, ZERO) for who, _ in earlier):
                update = next(u for who, u in reversed(earlier) if who not in (c, ZERO)).copy()
                update[:coords // 100] *= -1
            elif c == RESCALER and len(mine.get(c, ())) % 2 == 0 and c in mine:
                update = mine[c][0] * rng.uniform(0.5, 1.5, coords)
            elif c == RETRAINER and c in mine:
                update = mine[c][0].copy()
                turned = outside if len(outside) else np.arange(coords)
                update[rng.choice(turned, size=rng.choice([1, 2, coords // 100, coords // 30]), replace=False)] *= -1
            elif c == TWIN and pair[0] != ZERO:
                update = round_[f"c{pair[0]}"].copy()
                update[:coords // 100] *= -1
            elif c == OLD_COPIER and any(who not in (c, ZERO) for who, _ in earlier):
                update = next(u for who, u in earlier if who not in (c, ZERO)).copy()
                turned = outside if len(outside) else np.arange(coords)
                update[rng.choice(turned, size=max(coords // 100, 3 * coords // 100 * bool(len(outside))),
                                  replace=False)] *= -1
            mine.setdefault(c, []).append(update)
            round_[f"c{c}"] = update
        earlier += [(int(name[1:]), u) for name, u in round_.items()]
        owners = {}
        if ANALYST in pair:
            own = mine[ANALYST]
            other = round_[f"c{next(c for c in pair if c != ANALYST)}"].copy()
            other[:coords // 100] *= -1  # the attack analysis' copy:NOISE of the round's other participant
            for kind, update in (("flip", -own[-1]), ("stale", own[0]), ("lagged", own[max(0, len(own) - 3)]),
                                 ("copy", other)):
                round_[f"c{ANALYST}:{kind}"] = update
                owners[f"c{ANALYST}:{kind}"] = f"c{ANALYST}"
        with_reference = reference == "all" or (reference == "some" and rng.random() < 0.5)
        out.references.append(honest().astype(np.float32).tolist() if with_reference else None)
        out.rounds.append({name: u.astype(np.float32).tolist() for name, u in sorted(round_.items())})
        out.owners.append(owners)
    return out


def real_run(fed: Federation, settings: PoolSettings, reference_weight: float,
             conditioning: PublicConditioning = OFF, closes_run: bool = True
             ) -> tuple[list[dict[str, float]], list[list[int] | None]]:
    """``score_with_pool`` and ``close_round`` round after round, the last closing the run (``closes_run``); a settled
    scorer is paid its settlement. Under
    ``conditioning`` each round is scored within the strata of the global's steps before it (a round's step: the mean
    of its two participants' updates); returned beside the rewards, each coordinate's stratum per round."""
    pool, out, strata, steps = PeerPool(settings), [], [], []
    for t, (submissions, owners, reference, seed) in enumerate(
            zip(fed.rounds, fed.owners, fed.references, fed.seeds), start=1):
        updates = {c: {"w": np.array(u, dtype=np.float32)} for c, u in submissions.items()}
        packer = pack_updates(updates)
        values = {c: value_sketch(update, packer.layout) for c, update in updates.items()}
        a, b = sorted(c for c in submissions if c not in owners)
        pairs = [(a, b), (b, a), *((s, b if owner == a else a) for s, owner in sorted(owners.items()))]
        signs = None if reference is None else reference_signs(packer, {"w": np.array(reference, dtype=np.float32)})
        planes = packer.public_planes(steps, conditioning) if conditioning.enabled and steps else None
        strata.append(None if planes is None else stratum_of_each_coordinate(planes, len(submissions[a])))
        scored = score_with_pool(packer, pool, t, pairs=pairs, seed=seed, copy_candidates=[a, b], owners=owners,
                                 reference=signs, reference_weight=reference_weight, public=planes, values=values)
        steps.append({"w": (np.array(submissions[a], dtype=np.float32) + np.array(submissions[b], dtype=np.float32)) / 2})
        out.append(dict(scored.report.rewards))
        for settled in close_round(pool, ClosingRound.scored(
                packer, t, scored, words=packer.words(), participants=[a, b], seed=seed, penalty="expected",
                bonus_fraction=0.5, duplicates="zero", duplicate_rule=DuplicateRule(), owners=owners, values=values,
                closes_run=closes_run and t == len(fed.rounds))):
            out[settled.round - 1][settled.participant] = settled.reward
    return out, strata


def stratum_of_each_coordinate(planes, length: int) -> list[int]:
    """Coordinate e's stratum: bit p is bit e % 32 of plane p's word e // 32."""
    words = planes.host_words().astype(np.int64) & 0xFFFFFFFF
    return [sum(int(words[p, e // 32] >> (e % 32) & 1) << p for p in range(words.shape[0])) for e in range(length)]


def case(seed: int, long: bool = False) -> dict:
    """The settings a seed is tried with: the window (a short one: entries leave it, the run's record and sketch still
    count), ``min_peers`` (3: a reference then determines what the peer and it alone would not), the own-replay limit,
    the reference (none, in every round, in some) and its weight."""
    reference = "none" if long else ("none", "all", "some")[seed // 4 % 3]
    return dict(window=4 if long or seed % 2 else 10, min_peers=3 if seed % 4 == 3 else 2,
                own_replay_limit=(0.0, 0.01, 0.02)[seed % 3],
                reference=reference, reference_weight=4.0 if reference == "all" else 1.0 + seed % 2 * 3.0,
                coords=LONG if long else SHORT)


def federation_of(seed: int, settings: dict) -> Federation:
    return federation(seed, coords=settings["coords"], reference=settings["reference"],
                      meetings=settings.get("meetings", 0), sleeper=settings.get("sleeper", False),
                      chains=settings.get("chains", 0), own=settings.get("own", OWN_DIRECTION))


def naive_of(fed: Federation, settings: dict, rank_by: str = "record", strata=None) -> list[dict[str, float]]:
    return naive_run(fed.rounds, fed.seeds, window=settings["window"], min_peers=settings["min_peers"], rank_by=rank_by,
                     own_replay_limit=settings["own_replay_limit"], owners=fed.owners, references=fed.references,
                     reference_weight=settings["reference_weight"], strata=strata,
                     next_round=settings.get("next_round", True), closes_run=settings.get("closes_run", True),
                     pool_peers=settings.get("pool_peers", 8))
