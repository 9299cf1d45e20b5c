"""``fl.pool_next`` (pool rule 15): which disagreeing pairs wait for the round after them, and how that round ranks
them. The whole rule, held and settled through ``score_with_pool`` and ``close_round``, is compared with the naive
reference in ``tests/test_pool_naive.py``; the federation below shows what it changes."""

import dataclasses

import numpy as np
import pytest

from kfca_llm.fl.pool_next import NEXT_ROUND_MIN, next_round_ranks, open_pairs
from kfca_llm.fl.pool_store import VERDICT_GATE, PoolEntry

COORDS = 4096


def words(update: np.ndarray) -> np.ndarray:
    return np.packbits(update < 0, bitorder="little").view(np.int32).copy()


TASK = np.full(COORDS // 32, -1, dtype=np.int32)


@pytest.fixture
def round_after():
    """Round 5: honest H and flipping F, each a noisy copy of the direction ``d`` (F negated); round 6: P and Q, honest
    (noisy copies of ``d``, agreeing with each other), and R, which flips."""
    rng = np.random.default_rng(3)
    d = rng.standard_normal(COORDS)

    def honest() -> np.ndarray:
        return d + 1.5 * rng.standard_normal(COORDS)

    signs = {"H": words(honest()), "F": words(-honest())}
    rows = [PoolEntry(6, "P", words(honest())), PoolEntry(6, "Q", words(honest())), PoolEntry(6, "R", words(-honest())),
            PoolEntry(4, "S", words(honest())), PoolEntry(7, "T", words(-honest()))]
    return signs, rows


def agree(a: np.ndarray, b: np.ndarray, on: np.ndarray | None = None) -> float:
    same = np.unpackbits(a.view(np.uint8)) == np.unpackbits(b.view(np.uint8))
    return float(np.mean(same if on is None else same[on]))


def ranks(pairs, rows, signs, owner, task=TASK, horizon=10, waiting=False):
    """``next_round_ranks`` with a stand-in payment: agreement on the task bits less 1/2 (the pool passes KFCA's); the
    ranks, or with ``waiting`` the pairs whose judges come after ``horizon``."""
    words = {**signs, **{e.name: e.signs for e in rows}}
    on = np.unpackbits(task.view(np.uint8)).astype(bool)
    found, later = next_round_ranks(pairs, 5, rows, owner, task, lambda x, y: agree(words[x], words[y], on) - 0.5,
                                    horizon)
    return later if waiting else found


def test_the_round_after_ranks_the_one_paid_less_against_it_lower(round_after):
    signs, rows = round_after
    coherent = [e for e in rows if e.participant != "R"]  # P and Q agree with each other
    got = ranks([("H", "F"), ("F", "H")], coherent, signs, {"H": "H", "F": "F"})
    p, q = (e.signs for e in coherent[:2])
    h = (agree(signs["H"], p) + agree(signs["H"], q)) / 2 - 0.5
    f = (agree(signs["F"], p) + agree(signs["F"], q)) / 2 - 0.5
    assert got == {("H", "F"): pytest.approx((h, f), abs=1e-12), ("F", "H"): pytest.approx((f, h), abs=1e-12)}
    assert h > 0 > f  # only round 6 counts: S (round 4) and T (round 7) are not the round after


def test_a_round_after_of_three_whose_participants_disagree_settles_nothing(round_after):
    signs, rows = round_after
    assert ranks([("H", "F")], rows, signs, {"H": "H", "F": "F"}) == {}  # R flips: no majority


@pytest.fixture
def chain():
    """Round 5: honest H and flipping F; round 6: honest P and flipping R (they disagree); round 7: honest U and V
    (they agree); round 8: honest W and flipping X. Noisy copies of one direction ``d`` (the flipping ones negated)."""
    rng = np.random.default_rng(5)
    d = rng.standard_normal(COORDS)

    def update(sign: float) -> np.ndarray:
        return words(sign * (d + 1.5 * rng.standard_normal(COORDS)))

    signs = {"H": update(1), "F": update(-1)}
    rows = [PoolEntry(6, "P", update(1)), PoolEntry(6, "R", update(-1)), PoolEntry(7, "U", update(1)),
            PoolEntry(7, "V", update(1)), PoolEntry(8, "W", update(1)), PoolEntry(8, "X", update(-1))]
    return signs, rows


def test_where_the_round_after_disagrees_the_one_of_it_the_rounds_after_rank_higher_judges_alone(chain):
    """Pool rule 18: round 6's P and R disagree; round 7 (U and V agree) ranks P higher, so P alone judges H and F."""
    signs, rows = chain
    owner = {"H": "H", "F": "F"}
    got = ranks([("H", "F"), ("F", "H")], rows, signs, owner)
    p = rows[0].signs
    h, f = agree(signs["H"], p) - 0.5, agree(signs["F"], p) - 0.5
    assert got == {("H", "F"): pytest.approx((h, f), abs=1e-12), ("F", "H"): pytest.approx((f, h), abs=1e-12)}
    assert h > 0 > f
    # the judge is the one round 7 ranks higher: R, had U and V flipped, and the pair ranked the other way round
    flipped = [*rows[:2], *(PoolEntry(e.round, e.participant, ~e.signs) for e in rows[2:4])]
    assert ranks([("H", "F")], flipped, signs, owner)[("H", "F")] == pytest.approx(
        (agree(signs["H"], rows[1].signs) - 0.5, agree(signs["F"], rows[1].signs) - 0.5), abs=1e-12)
    # rounds 7 and 8 disagree too (V flips), and round 9 holds nobody: nothing judges
    v_flips = [*rows[:3], PoolEntry(7, "V", ~rows[3].signs), *rows[4:]]
    assert ranks([("H", "F")], v_flips, signs, owner) == {}
    # ... until round 9's two agree: they rank W above X, W ranks U above V, U ranks P above R, and P judges
    nine = [*v_flips, PoolEntry(9, "Y", rows[2].signs ^ np.int32(1)), PoolEntry(9, "Z", rows[3].signs)]
    assert ranks([("H", "F")], nine, signs, owner)[("H", "F")] == pytest.approx((h, f), abs=1e-12)


def test_a_pair_whose_judges_come_after_the_horizon_waits_for_them(chain):
    signs, rows = chain
    owner = {"H": "H", "F": "F"}
    up_to_6 = [e for e in rows if e.round <= 6]
    assert ranks([("H", "F")], up_to_6, signs, owner, horizon=6) == {}
    assert ranks([("H", "F")], up_to_6, signs, owner, horizon=6, waiting=True) == {("H", "F")}
    assert ranks([("H", "F")], rows, signs, owner, waiting=True) == frozenset()
    # a participant of the pair in a round of the chain is no judge: with F in round 7 (its update an honest one now,
    # agreeing with U), U alone judges P and R, and P the pair
    beside = [*rows[:2], PoolEntry(7, "F", rows[3].signs), rows[2]]
    assert ranks([("H", "F")], beside, signs, owner)[("H", "F")] == pytest.approx(
        (agree(signs["H"], rows[0].signs) - 0.5, agree(signs["F"], rows[0].signs) - 0.5), abs=1e-12)
    assert ranks([("H", "F")], beside, signs, owner, waiting=True) == frozenset()


def test_judges_beside_a_participant_of_the_pair_rank_it_lower_or_not_at_all(chain):
    """Pool rule 18: a judge that agrees with a participant of the pair sitting in its round is of that participant's
    kind there (an honest one's next update agrees with an honest judge, a flipper's with a flipping one): where it
    ranks that participant higher that is no evidence, and nothing ranks the pair; where it ranks it lower (an on-off
    node back to honest beside an honest judge), it does."""
    signs, rows = chain
    owner = {"H": "H", "F": "F"}
    p, r = rows[0].signs, rows[1].signs  # honest, flipping
    # round 6: F flips again beside R, which flips too: they agree, R would rank F higher
    assert ranks([("H", "F")], [PoolEntry(6, "F", ~p), rows[1]], signs, owner) == {}
    # ... and H beside the honest P: P would rank H higher, which is no evidence either
    assert ranks([("H", "F")], [PoolEntry(6, "H", p ^ np.int32(1)), rows[0]], signs, owner) == {}
    # F back to honest beside the honest P: P ranks F lower, and that ranks the pair
    got = ranks([("H", "F")], [PoolEntry(6, "F", r ^ np.int32(-1) ^ np.int32(1)), rows[0]], signs, owner)
    assert got == {("H", "F"): pytest.approx((agree(signs["H"], p) - 0.5, agree(signs["F"], p) - 0.5), abs=1e-12)}
    # the same in a chain: round 6's higher one must not sit beside round 7's judges
    assert ranks([("H", "F")], [*rows[:2], PoolEntry(7, "P", rows[2].signs), rows[3]], signs, owner) == {}


def test_the_round_after_needs_enough_participants_other_than_the_pair_and_none_of_one_sign(round_after):
    signs, rows = round_after
    assert NEXT_ROUND_MIN == 2
    assert ranks([("H", "F")], [rows[0]], signs, {"H": "H", "F": "F"}) == {}
    # the pair's own participants in the round after are not its judges, and P, which agrees with H there, ranking H
    # higher is no evidence (pool rule 18)
    own = [rows[0], PoolEntry(6, "H", signs["H"])]
    assert ranks([("H", "F")], own, signs, {"H": "H", "F": "F"}) == {}
    # an owned scorer is judged as its participant (here H, beside P)
    assert ranks([("H:copy", "F")], own, {"H:copy": signs["H"], "F": signs["F"]}, {"H:copy": "H", "F": "F"}) == {}
    zero = [rows[0], PoolEntry(6, "Z", np.zeros(COORDS // 32, dtype=np.int32))]
    assert ranks([("H", "F")], zero, signs, {"H": "H", "F": "F"}) == {}
    assert ranks([("H", "F")], rows[:2], signs, {"H": "H", "F": "F"}) != {}


def test_only_the_task_bits_count(round_after):
    signs, rows = round_after
    half = TASK.copy()
    half[: COORDS // 64] = 0
    on = np.unpackbits(half.view(np.uint8)).astype(bool)
    got = ranks([("H", "F")], rows[:2], signs, {"H": "H", "F": "F"}, half)
    p, q = rows[0].signs, rows[1].signs
    assert got[("H", "F")][0] == pytest.approx((agree(signs["H"], p, on) + agree(signs["H"], q, on)) / 2 - 0.5,
                                               abs=1e-12)
    # one sign on every task bit, noise outside the tasks: a constant report, no judge
    noise = np.random.default_rng(9).integers(-2**31, 2**31, half.size).astype(np.int32)
    ones = np.where(half != 0, np.int32(-1), noise)
    assert ranks([("H", "F")], [rows[0], PoolEntry(6, "O", ones)], signs, {"H": "H", "F": "F"}, half) == {}


def test_a_pair_another_rule_settles_does_not_wait():
    pairs = [("A", "B"), ("B", "A")]
    weak = {"A": (0.01, 0.02), "B": (-0.01, 0.02)}
    assert open_pairs(pairs, weak, weak, frozenset(), False, VERDICT_GATE) == frozenset(pairs)
    # a lineage tells them apart (pool rule 7)
    assert open_pairs(pairs, weak, weak, frozenset({"B"}), False, VERDICT_GATE) == frozenset()
    # ... but not where both turned
    assert open_pairs(pairs, weak, weak, frozenset({"A", "B"}), False, VERDICT_GATE) == frozenset(pairs)
    # the trajectory settles it (pool rule 6): the lower below 0, more than two standard errors apart
    against = {"A": (0.05, 0.01), "B": (-0.05, 0.01)}
    assert open_pairs(pairs, weak, against, frozenset(), False, VERDICT_GATE) == frozenset()
    # ... as the round is scored; settling it later, the rounds after judge first (pool rule 19), a lineage still not
    assert open_pairs(pairs, weak, against, frozenset(), False, VERDICT_GATE, settling=True) == frozenset(pairs)
    assert open_pairs(pairs, weak, against, frozenset({"B"}), False, VERDICT_GATE, settling=True) == frozenset()
    # the verdicts settle it under verdict-first only
    clear = {"A": (0.2, 0.01), "B": (-0.2, 0.01)}
    assert open_pairs(pairs, clear, weak, frozenset(), True, VERDICT_GATE) == frozenset()
    assert open_pairs(pairs, clear, weak, frozenset(), False, VERDICT_GATE) == frozenset(pairs)
    assert open_pairs(pairs, weak, weak, frozenset(), True, VERDICT_GATE) == frozenset(pairs)



def run_closed(settings, forged: bool = False) -> tuple[dict, dict]:
    """``pool_updates``' federation (client 3 flips in rounds 8, 11 and 14) scored and closed round by round, as a run
    is (``forged``: c03 recorded as paid +1 and its partner c01 as -1 up to round 7, a sleeper's record:
    ``tests/test_pool_record.py``'s forgery). Returns (round -> what it paid as it was scored, (round, scorer) -> the
    settlement that paid it later)."""
    from pool_updates import SCHEDULE, round_updates

    from kfca_llm.api import pack_updates
    from kfca_llm.engine.duplicates import DuplicateRule
    from kfca_llm.fl.peer_pool import PeerPool, score_with_pool
    from kfca_llm.fl.pool_close import ClosingRound, close_round

    pool, paid, settled = PeerPool(settings), {}, {}
    for t, clients in SCHEDULE.items():
        packer = pack_updates(round_updates(t, clients, {3: "flip"}))
        scored = score_with_pool(packer, pool, t, seed=t)
        paid[t] = dict(scored.report.rewards)
        closing = ClosingRound.scored(packer, t, scored, words=packer.words(), participants=packer.clients, seed=t,
                                      penalty="expected", bonus_fraction=0.5, duplicates="zero",
                                      duplicate_rule=DuplicateRule())
        if forged and t < 8:
            scores = {c: {"c03": 1.0, "c01": -1.0}.get(c, s) for c, s in closing.unadjusted_rewards.items()}
            closing = dataclasses.replace(closing, unadjusted_rewards=scores)
        for settlement in close_round(pool, closing):
            settled[(settlement.round, settlement.participant)] = settlement
    return paid, settled


@pytest.mark.parametrize("forged", [False, True])
def test_a_meeting_with_the_flipper_waits_for_the_round_after_which_pays_the_honest_partner(forged):
    """Each meeting of the flipper c03 with an honest partner is held as it is scored (both paid 0), and settled by the
    round after it: the partner paid > 0 and more than c03, whose record (forged: a sleeper's) counts for nothing there.
    Ranked in its round (``next_round=False``, pool rule 14), the forged record wins round 8 for the flipper."""
    from kfca_llm.fl.pool_store import PoolSettings

    paid, settled = run_closed(PoolSettings(), forged)
    for t, partner in ((8, "c01"), (11, "c06"), (14, "c09")):
        assert paid[t] == {partner: 0.0, "c03": 0.0}, t
        if t < 14:  # the run's last round has no round after it: it waits
            # paid once the pool is warm behind them (fl.pool_settle), ranked by round t + 1 whenever that is
            assert settled[(t, partner)].settled_in > t and settled[(t, "c03")].settled_in > t
            assert settled[(t, partner)].reward > 0 > settled[(t, "c03")].reward, t
    in_round, _ = run_closed(PoolSettings(next_round=False), forged)
    if forged:
        assert in_round[8]["c03"] > 0 > in_round[8]["c01"]
    else:
        assert in_round[8]["c01"] > 0 > in_round[8]["c03"]


def test_settling_the_rounds_after_judge_a_waiting_pair_before_a_trajectory_read_on_both_sides_of_it(monkeypatch):
    """Pool rule 19: the flipper's meetings, scored within the public strata, wait for the rounds after them (the
    verdicts without the strata forged to settle nothing as a round is scored). Settling, those verdicts read entries
    of both sides of the round; forged then to settle every pair for the flipper (its verdict far above its partner's,
    the partner's below 0: what ``trajectory_settles`` takes), they would pay it and fine its honest partner, as rule
    18 did. The rounds after judge first: the partner is paid > 0 and more."""
    from pool_updates import SCHEDULE, round_updates

    import kfca_llm.fl.pool_evidence as pool_evidence
    from kfca_llm.api import pack_updates
    from kfca_llm.engine.duplicates import DuplicateRule
    from kfca_llm.engine.public import PublicConditioning
    from kfca_llm.fl.peer_pool import PeerPool, PoolSettings, score_with_pool
    from kfca_llm.fl.pool_close import ClosingRound, close_round

    blind = pool_evidence.public_blind_verdicts

    def forged(plain, rows, first, window, round_, pool_keys, index):
        found = blind(plain, rows, first, window, round_, pool_keys, index)
        if not any(e.round > round_ for e in rows.values()):  # as the round is scored: settling nothing
            return {c: (0.0, 1.0) for c in found}
        return {c: (0.05, 0.001) if c == "c03" else (-0.05, 0.001) for c in found}

    def run(judged_first: bool) -> dict:
        pool, settled, steps = PeerPool(PoolSettings()), {}, []
        monkeypatch.setattr(pool_evidence, "open_pairs", lambda *a, settling=False: open_pairs(*a, settling=settling
                                                                                                 and judged_first))
        for t, clients in SCHEDULE.items():
            updates = round_updates(t, clients, {3: "flip"})
            packer = pack_updates(updates)
            scored = score_with_pool(packer, pool, t, seed=t, public=steps[-8:] or None,
                                     conditioning=PublicConditioning())
            steps.append({"w": sum(u["w"] for u in updates.values()) / len(updates)})
            for s in close_round(pool, ClosingRound.scored(packer, t, scored, words=packer.words(),
                                                           participants=packer.clients, seed=t, penalty="expected",
                                                           bonus_fraction=0.5, duplicates="zero",
                                                           duplicate_rule=DuplicateRule())):
                settled[(s.round, s.participant)] = s.reward
        return settled

    monkeypatch.setattr(pool_evidence, "public_blind_verdicts", forged)
    judged, by_trajectory = run(True), run(False)
    for t, partner in ((8, "c01"), (11, "c06")):
        assert judged[(t, partner)] > 0 > judged[(t, "c03")], t
        assert by_trajectory[(t, "c03")] > 0 > by_trajectory[(t, partner)], t  # what rule 18 paid
