"""``fl.pool_reversal`` (pool rules 7 and 8): how an update relates to its participant's previous one, its lineage,
and what a turn forfeits; ``fl.pool_reward.agreement_read_back`` (rule 9), where an agreement is read back; and
``fl.pool_evidence.one_sign`` (rule 10), a submission with no report to agree with.

Synthetic sketches: every participant's update is a shared trajectory plus its own persistent data direction plus
noise, so an honest update agrees with its own previous one more than two other participants' updates do; a flipped
update negates all of it."""

import numpy as np
import pytest

from kfca_llm.fl import pool_reversal
from kfca_llm.fl.pool_reversal import agreement, credit, forfeited, has_turned, own_relation

COORDS = 2048  # 64 words: the sketch is the whole update


def words(update: np.ndarray) -> np.ndarray:
    return np.packbits(update < 0, bitorder="little").view(np.int32).copy()


WARM_UP = 4
"""Rounds of other participants (G-J) before A-F's: a relation needs pairs of others starting in
``MIN_BASELINE_ROUNDS`` rounds, so A-F's rounds 1-8 of the story below are rounds 5-12."""


@pytest.fixture
def run():
    """Rounds 1-4, two of G-J a round; rounds 5-12, two participants a round from A-F; D flips its update from its third
    participation on (a sleeper), E every other one (on-off). Returns (sketches, scores, a function drawing one more
    update)."""
    rng = np.random.default_rng(7)
    own = {c: rng.standard_normal(COORDS) for c in "ABCDEFGHIJ"}
    seen = {c: 0 for c in own}

    def update(c: str, t: int, trajectory: np.ndarray) -> np.ndarray:
        u = trajectory + 1.5 * own[c] + rng.standard_normal(COORDS)
        flipped = (c == "D" and seen[c] >= 2) or (c == "E" and seen[c] % 2 == 1)
        seen[c] += 1
        return -u if flipped else u

    sketches, scores = [], {}
    trajectory = rng.standard_normal(COORDS)
    for t, pair in enumerate(["GH", "IJ", "GI", "HJ", "AB", "CD", "EF", "AD", "BE", "CF", "DE", "AB"], start=1):
        trajectory = 0.6 * trajectory + rng.standard_normal(COORDS)
        for c in pair:
            u = update(c, t, trajectory)
            sketches.append((f"{c}@{t}", words(u)))
            scores[f"{c}@{t}"] = -0.1 if (c == "D" and t == 11) or (c == "E" and t == 9) else 0.1
    return sketches, scores, lambda c, t: words(update(c, t, 0.6 * trajectory + rng.standard_normal(COORDS)))


MASK = np.full(COORDS // 32, -1, dtype=np.int32)


def test_agreement_counts_the_task_bits_only():
    a, b = words(np.ones(COORDS)), words(-np.ones(COORDS))
    half = MASK.copy()
    half[: COORDS // 64] = 0
    assert agreement(a, a, MASK, COORDS) == 1.0 and agreement(a, b, MASK, COORDS) == 0.0
    mixed = words(np.where(np.arange(COORDS) < COORDS // 2, 1.0, -1.0))
    assert agreement(a, mixed, half, COORDS // 2) == 0.0  # the bits that agree are outside the mask


def test_an_honest_update_follows_its_own_previous_one_and_has_not_turned(run):
    sketches, scores, draw = run
    mine = draw("A", 13)
    relation = own_relation(sketches, "A", 13, mine, MASK)
    assert relation is not None and relation.previous == "A@12" and not relation.reverses
    assert not has_turned(sketches, scores.get, "A", 13, mine, MASK)


def test_a_sleeper_s_turn_reverses_its_honest_update_and_every_later_flip_follows_the_turn(run):
    sketches, scores, _ = run
    by_name = dict(sketches)
    # D: honest in rounds 2 and 4, flipped in round 7 (its round scored it -0.1: a fine, caught)
    turn = own_relation(sketches, "D", 11, by_name["D@11"], MASK)
    assert turn is not None and turn.previous == "D@8" and turn.reverses
    assert has_turned(sketches, scores.get, "D", 11, by_name["D@11"], MASK)
    # a flip after the turn follows it: turned by its lineage; the turn's negation (D honest again) reverses a turned
    # update: not turned
    assert has_turned(sketches, scores.get, "D", 13, by_name["D@11"], MASK)
    assert not has_turned(sketches, scores.get, "D", 13, ~by_name["D@11"], MASK)


def test_a_reversal_of_an_update_its_round_fined_has_not_turned(run):
    sketches, scores, _ = run
    by_name = dict(sketches)
    # E: honest in round 3, flipped in round 5 (scored -0.1), honest again in round 7: reverses a fined update
    back = own_relation(sketches, "E", 11, by_name["E@11"], MASK)
    assert back is not None and back.reverses and back.previous == "E@9"
    assert not has_turned(sketches, scores.get, "E", 11, by_name["E@11"], MASK)
    # the same flip in round 5 reversed E's round-3 update, which its round scored > 0: turned
    assert has_turned(sketches, scores.get, "E", 9, by_name["E@9"], MASK)
    # had round 3 scored E's update <= 0, the flip would be no evidence of a turn
    assert not has_turned(sketches, {**scores, "E@7": 0.0}.get, "E", 9, by_name["E@9"], MASK)


def test_no_relation_without_a_previous_update_or_enough_pairs_to_judge_by(run):
    sketches, scores, draw = run
    assert own_relation(sketches, "G", 13, draw("A", 13), MASK) is None  # G never submitted
    # no pair of others 3 rounds apart
    assert own_relation(sketches[:4], "G", 4, by_first(sketches, "G@1"), MASK) is None


def test_no_relation_where_the_pairs_of_others_start_in_too_few_rounds(run, monkeypatch):
    """A's flip in round 6 reverses its round-5 update against the pairs of others one round apart, which start in
    rounds 1-4; without round 1's submissions they start in three rounds, too few to judge by, though two pairs would
    do (``MIN_BASELINE_PAIRS``). (Pool rule 20 off: its signs' correlation alone would reverse it, the next test.)"""
    monkeypatch.setattr(pool_reversal, "ANTI_Z", float("inf"))
    sketches, _, draw = run
    before = [(name, words) for name, words in sketches if int(name.split("@")[1]) <= 5]
    flip = ~draw("A", 6)
    relation = own_relation(before, "A", 6, flip, MASK)
    assert relation is not None and relation.reverses and relation.previous == "A@5"
    later = [(name, words) for name, words in before if not name.endswith("@1")]
    assert own_relation(later, "A", 6, flip, MASK) is None
    monkeypatch.setattr(pool_reversal, "MIN_BASELINE_ROUNDS", 3)
    assert own_relation(later, "A", 6, flip, MASK).reverses


def test_signs_correlated_below_zero_reverse_where_rule_7_cannot_judge(run):
    """Pool rule 20: where the pairs of others start in too few rounds for rule 7 (one to three, as above; two pairs
    here), a flip three rounds after A's previous update, its signs correlating with that one's far below 0, reverses
    it; the honest update (correlated above 0) and unrelated signs do not; nor does a flip one round after it
    (``ANTI_ROUNDS``: a retrain on the same samples can turn back from the global's overshoot on them), nor one with no
    two pairs of others as far apart at all (an honest update early in a static run ran against its own of 6 rounds
    before by 5.2 errors)."""
    sketches, _, draw = run
    later = [(name, words) for name, words in sketches if 2 <= int(name.split("@")[1]) <= 5]
    honest = draw("A", 8)
    assert pool_reversal.sign_correlation_z(~honest, by_first(sketches, "A@5"), MASK, COORDS) < -pool_reversal.ANTI_Z
    relation = own_relation(later, "A", 8, ~honest, MASK)
    assert relation is not None and relation.reverses and relation.previous == "A@5"
    assert own_relation(later, "A", 8, honest, MASK) is None
    unrelated = words(np.random.default_rng(3).standard_normal(COORDS))
    assert own_relation(later, "A", 8, unrelated, MASK) is None
    assert pool_reversal.ANTI_ROUNDS == 3 and own_relation(later, "A", 6, ~honest, MASK) is None
    alone = [(name, words) for name, words in later if int(name.split("@")[1]) >= 4]  # no pair 3 rounds apart
    assert own_relation(alone, "A", 8, ~honest, MASK) is None


def test_sign_correlation_in_standard_errors():
    """phi times the square root of the task bits: +sqrt(bits) for the same signs, -sqrt(bits) for negated ones, at
    any share of each sign; within a few errors of 0 for unrelated signs; 0 where one side reports one sign only."""
    rng = np.random.default_rng(11)
    for share in (0.5, 0.8):
        a = words(np.where(rng.random(COORDS) < share, -1.0, 1.0))
        assert pool_reversal.sign_correlation_z(a, a, MASK, COORDS) == pytest.approx(COORDS ** 0.5)
        assert pool_reversal.sign_correlation_z(a, ~a, MASK, COORDS) == pytest.approx(-COORDS ** 0.5)
        unrelated = [pool_reversal.sign_correlation_z(a, words(rng.standard_normal(COORDS)), MASK, COORDS)
                     for _ in range(200)]
        assert abs(np.mean(unrelated)) < 0.3 and 0.8 < np.std(unrelated) < 1.2
    assert pool_reversal.sign_correlation_z(words(np.ones(COORDS)), words(rng.standard_normal(COORDS)), MASK,
                                            COORDS) == 0.0


def by_first(sketches, name):
    return dict(sketches)[name]


def test_a_reversal_needs_its_margin_of_the_signs_where_the_others_agree_alike():
    """Every pair of others agrees on exactly half the signs (spread 0, floored): an update 2% of the signs below that
    is REVERSAL_Z spreads below, yet no reversal; 3.5% below is one (its signs correlating with its previous update's
    -3.2 errors at 2,048 bits: below -RUNS_AGAINST_Z, above -ANTI_Z: the margins' reversal, not rule 20's)."""
    index = np.arange(COORDS)
    zeros, half, odd = np.zeros(COORDS, dtype=bool), index < COORDS // 2, index % 2 == 0

    def packed(bits):
        return np.packbits(bits, bitorder="little").view(np.int32).copy()

    # rounds 1-5: two others a round, all zeros in odd rounds and half set in even ones (every pair one round apart
    # agrees on half); A's round-5 update: every other sign set
    sketches = [("A@5", packed(odd))] + [(f"{c}{t}@{t}", packed(zeros if t % 2 else half)) for t in range(1, 6)
                                         for c in "XY"]

    def own_update(below: float) -> np.ndarray:  # A's round-6 update: agrees with A@5 on ``below`` less than half
        return packed(odd ^ (index < 2 * round(COORDS * (0.5 + below) / 2)))  # an even count: half the signs set

    assert own_relation(sketches, "A", 6, own_update(0.02), MASK) is None
    mine = own_update(0.035)
    assert -pool_reversal.ANTI_Z < pool_reversal.sign_correlation_z(mine, packed(odd), MASK, COORDS) < \
        -pool_reversal.RUNS_AGAINST_Z
    relation = own_relation(sketches, "A", 6, mine, MASK)
    assert relation is not None and relation.reverses


def test_a_reversal_runs_against_the_previous_update_not_only_below_the_others():
    """Pool rule 20: every pair of others one round apart agrees on 60% of the signs (spread 0, floored); A's update
    agreeing with its previous one on 56.5% is 3.5% of the signs below them, yet its signs still correlate with it
    (+5.9 errors): no reversal (as the margins alone took an honest update early in a per-round run); agreeing on 46.5%
    (-3.2 errors) is one."""
    index = np.arange(COORDS)
    odd = index % 2 == 0

    def packed(bits):
        return np.packbits(bits, bitorder="little").view(np.int32).copy()

    def differing(share):  # ``odd`` with its first ``share`` of the signs (an even count) negated: half set
        return odd ^ (index < 2 * round(COORDS * share / 2))

    sketches = [("A@5", packed(odd))] + [(f"{c}{t}@{t}", packed(odd if t % 2 else differing(0.4)))
                                         for t in range(1, 6) for c in "XY"]
    mine = packed(differing(0.435))
    assert pool_reversal.sign_correlation_z(mine, packed(odd), MASK, COORDS) > 5
    assert own_relation(sketches, "A", 6, mine, MASK) is None
    relation = own_relation(sketches, "A", 6, packed(differing(0.535)), MASK)
    assert relation is not None and relation.reverses


def test_signs_correlated_below_zero_reverse_only_below_the_pairs_of_others():
    """Pool rule 20 where the rounds turn back: two others in rounds 1 and 4, round 4's updates differing from round
    1's in 60% of the signs (their correlation -9 errors at 2,048 bits; pairs starting in one round, too few for rule
    7). A's round-7 update differing as much from its round-4 one is no reversal, though its signs run against it;
    differing in 67% (-15 errors: more than ``ANTI_Z`` below the others') is one."""
    def packed(bits):
        return np.packbits(bits, bitorder="little").view(np.int32).copy()

    index = np.arange(COORDS)
    odd = index % 2 == 0  # half the signs set in every update below: no share of a sign tilts a correlation

    def differing(update, share):  # ``update`` with its first ``share`` of the signs (an even count) negated
        return update ^ (index < 2 * round(COORDS * share / 2))

    sketches = [("X@1", packed(odd)), ("Y@1", packed(odd)), ("X@4", packed(differing(odd, 0.6))),
                ("Y@4", packed(differing(odd, 0.6))), ("A@4", packed(odd))]
    others = pool_reversal.sign_correlation_z(packed(differing(odd, 0.6)), packed(odd), MASK, COORDS)
    assert others < -2 * pool_reversal.ANTI_Z
    assert own_relation(sketches, "A", 7, packed(differing(odd, 0.6)), MASK) is None
    mine = packed(differing(odd, 0.67))
    assert pool_reversal.sign_correlation_z(mine, packed(odd), MASK, COORDS) < others - pool_reversal.ANTI_Z
    relation = own_relation(sketches, "A", 7, mine, MASK)
    assert relation is not None and relation.reverses and relation.previous == "A@4"


def test_a_reversed_update_judged_about_0_is_credited_with_the_updates_it_follows(run):
    """D@4 scored 0 by its round (say, beside a zero-submitter): D's turn in round 7 reverses it, and D@4 follows D@2,
    which its round scored > 0: the turn is caught by the credit of D@2; had D@2 scored 0 too, no turn."""
    sketches, scores, _ = run
    by_name = dict(sketches)
    follows = own_relation(sketches, "D", 8, by_name["D@8"], MASK)
    assert follows is not None and follows.previous == "D@6" and not follows.reverses
    assert credit(sketches, {**scores, "D@8": 0.0}.get, "D", "D@8", MASK) == pytest.approx(0.1)
    assert has_turned(sketches, {**scores, "D@8": 0.0}.get, "D", 11, by_name["D@11"], MASK)
    assert not has_turned(sketches, {**scores, "D@8": 0.0, "D@6": 0.0}.get, "D", 11, by_name["D@11"], MASK)
    # credit stops at a reversal: E@7 reverses E@5, so E@7's credit is its own score alone
    assert credit(sketches, scores.get, "E", "E@11", MASK) == scores["E@11"]


def test_a_turn_forfeits_the_submissions_since_the_last_turn(run, monkeypatch):
    sketches, scores, draw = run
    by_name = dict(sketches)
    # the sleeper's turn forfeits both honest submissions before it; a flip following the turn forfeits nothing
    assert forfeited(sketches, scores.get, "D", 11, by_name["D@11"], MASK) == ("D@8", "D@6")
    assert forfeited(sketches, scores.get, "D", 13, by_name["D@11"], MASK) == ()
    # the on-off attacker's flip in round 5 forfeits its round-3 update; its return in round 7 (not turned) nothing
    assert forfeited(sketches, scores.get, "E", 9, by_name["E@9"], MASK) == ("E@7",)
    assert forfeited(sketches, scores.get, "E", 11, by_name["E@11"], MASK) == ()
    # its next flip forfeits its return, and stops at the turned flip before it
    assert forfeited(sketches, scores.get, "E", 13, ~by_name["E@11"], MASK) == ("E@11",)
    # an honest update forfeits nothing; a turn of A (three honest submissions) forfeits at most FORFEIT_SUBMISSIONS
    honest = draw("A", 13)
    assert forfeited(sketches, scores.get, "A", 13, honest, MASK) == ()
    assert forfeited(sketches, scores.get, "A", 13, ~honest, MASK) == ("A@12", "A@8", "A@5")
    monkeypatch.setattr(pool_reversal, "FORFEIT_SUBMISSIONS", 2)
    assert forfeited(sketches, scores.get, "A", 13, ~honest, MASK) == ("A@12", "A@8")


def test_the_baseline_pairs_two_different_participants_never_one_with_itself(monkeypatch):
    """P, Q and R submit the same signs in rounds 1 to 5 (each agrees with itself wholly, with the others on half):
    a participant's two submissions are no pair of others. Counted, their agreement of 1 would spread the baseline
    (0.24) and hide A's reversal of 10% of the signs; the pairs of two different participants agree on exactly half
    (spread floored), against which it reverses. (Rule 20 off: its correlation alone would reverse it.)"""
    monkeypatch.setattr(pool_reversal, "ANTI_Z", float("inf"))
    idx = np.arange(COORDS)

    def packed(bits):
        return np.packbits(bits, bitorder="little").view(np.int32).copy()

    signs = {"P": idx < 0, "Q": idx < COORDS // 2, "R": idx % 2 == 0}
    sketches = [(f"{c}@{t}", packed(bits)) for t in range(1, 6) for c, bits in signs.items()]
    sketches.append(("A@5", packed(signs["R"])))
    relation = own_relation(sketches, "A", 6, packed(signs["R"] ^ (idx < 2 * round(COORDS * 0.6 / 2))), MASK)
    assert relation is not None and relation.reverses and relation.previous == "A@5"


def test_an_agreement_is_read_back_only_where_the_peer_turned_and_the_scorer_ran_against_the_trajectory():
    """Pool rule 9 (``fl.pool_reward.agreement_read_back``): an agreeing pair is read back for a scorer whose verdict
    without the strata is more than two standard errors below 0 and whose peer has turned; else, and for a disagreeing
    pair, an own resubmitter's peer or without strata (no verdict without them), the rule says nothing. A peer that ran
    against the trajectory as well but has not turned is no reason (two honest updates can both look so)."""
    from types import SimpleNamespace

    from kfca_llm.fl.pool_reward import agreement_read_back

    def ev(pay=0.1, turned=("b",), blind=(-0.03, 0.01), peer_blind=None, own=()):
        blinds = ({} if blind is None else {"a": blind}) | ({} if peer_blind is None else {"b": peer_blind})
        return SimpleNamespace(pay={("a", "b"): pay}, turned=frozenset(turned), own=frozenset(own), blind=blinds)

    assert agreement_read_back(ev(), "a", "b")
    assert agreement_read_back(ev(pay=0.0), "a", "b")  # an agreement of 0 counts as agreeing, as orientation's
    assert not agreement_read_back(ev(pay=-0.1), "a", "b")  # a disagreeing pair: ranked (rules 5-7)
    assert not agreement_read_back(ev(turned=()), "a", "b")  # the peer has not turned
    assert not agreement_read_back(ev(turned=(), peer_blind=(-0.05, 0.02)), "a", "b")  # nor when both ran against it
    assert not agreement_read_back(ev(blind=(-0.02, 0.01)), "a", "b")  # exactly two standard errors: not beyond
    assert not agreement_read_back(ev(blind=(-0.03, float("inf"))), "a", "b")  # no spread: no verdict to go by
    assert not agreement_read_back(ev(blind=None), "a", "b")  # no strata: no verdict without them
    assert not agreement_read_back(ev(own=("b",)), "a", "b")  # an own resubmission counts for nothing already


def test_one_sign_on_every_task_is_no_report():
    """Pool rule 10 (``fl.pool_evidence.one_sign``): a zero update (no sign bit set on any task) or one negative on
    every task reports nothing to agree with; one differing task bit, or bits outside the tasks, do not make it so."""
    from kfca_llm.fl.pool_evidence import one_sign

    task = np.array([-1, 0x0F0F0F0F, 0], dtype=np.int32)
    assert one_sign(np.zeros(3, np.int32), task) and one_sign(task.copy(), task)
    assert one_sign(np.array([-1, -1, -1], np.int32), task)  # set outside the tasks too: still one sign on them
    assert one_sign(np.array([0, -0x0F0F0F10, 5], np.int32), task)  # bits only outside the tasks: none on them
    assert not one_sign(np.array([1, 0, 0], np.int32), task)
    assert not one_sign(task ^ np.array([0, 1, 0], np.int32), task)


def test_a_turn_is_judged_against_the_two_updates_before_it_where_those_are_alike(monkeypatch):
    """Pool rule 14: A submitted in rounds 3 and 6 and is judged in round 8. Its update's standing against A@6 (lag 2)
    is combined with its standing against A@3 (lag 5) where A@6 was alike A@3 (lag 3: above the median of others'
    pairs): spreads summed over the square root of two, shares of the signs averaged. Each standing is stubbed
    (``_standing``: by lag), and the signs' correlation (-3.5 errors: running against the previous update, rule 20
    off), so each case is the rule's arithmetic alone."""
    sketches = [("A@3", MASK.copy()), ("A@6", MASK.copy()), ("X@1", MASK.copy()), ("Y@2", MASK.copy())]
    monkeypatch.setattr(pool_reversal, "ANTI_Z", float("inf"))
    monkeypatch.setattr(pool_reversal, "sign_correlation_z", lambda *words: -3.5)

    def relation(by_lag):
        monkeypatch.setattr(pool_reversal, "_standing", lambda others, lag, *rest: by_lag[lag])
        return own_relation(sketches, "A", 8, MASK.copy(), MASK)

    turn = relation({2: (-2.0, -0.06), 3: (0.5, 0.01), 5: (-2.0, -0.05)})  # -4 / sqrt(2) = -2.83 spreads
    assert turn is not None and turn.reverses and turn.previous == "A@6"
    assert relation({2: (-2.0, -0.06), 3: (-0.5, -0.01), 5: (-2.0, -0.05)}) is None  # A@6 not alike A@3: -2 alone
    assert relation({2: (-2.0, -0.06), 3: (0.5, 0.01), 5: None}) is None  # A@3 not judged: -2 alone
    assert relation({2: (-2.0, -0.06), 3: None, 5: (-2.0, -0.05)}) is None  # their likeness not judged
    assert relation({2: (-2.0, -0.06), 3: (0.5, 0.01), 5: (-2.0, 0.0)}) is None  # shares average -0.03: no margin
    assert relation({2: (-2.0, -0.06), 3: (0.5, 0.01), 5: (1.0, 0.01)}) is None  # A@3 alike, the update not against it
    assert relation({2: (-2.6, -0.04), 3: (-0.5, -0.01), 5: (1.0, 0.01)}).reverses  # alone, as before rule 14
    assert relation({2: (-2.6, -0.04), 3: (0.5, 0.01), 5: (1.0, 0.01)}).reverses  # alone, though combined it would not
    follows = relation({2: (2.6, 0.05), 3: (0.5, 0.01), 5: (-9.0, -0.2)})  # a follow is judged on A@6 alone
    assert follows is not None and not follows.reverses
    assert relation({2: None, 3: (0.5, 0.01), 5: (-9.0, -0.2)}) is None  # nothing without the previous one
