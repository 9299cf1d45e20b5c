"""docs/few-peers.md opens with a worked example of a two-client round: its numbers are the real pool's.

The federation: three earlier rounds of two honest clients each (C and D, E and F, G and H), a round of an honest
client A and a sign flipper B, then a round of honest I and J; 256-coordinate float updates from a seeded numpy
generator. Each round is scored by ``score_with_pool`` and closed by ``close_round`` (default ``PoolSettings``,
unconditioned: ``public=None``), as a run would; the example's block in the page is what ``example_text`` prints for
round 4, held as it is scored and settled at the end of round 5, character for character."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from doc_pages import ROOT, markdown_table, one_block, page  # noqa: E402

from kfca_llm import score_updates  # noqa: E402
from kfca_llm.api import pack_updates  # noqa: E402
from kfca_llm.engine.duplicates import DuplicateRule  # noqa: E402
from kfca_llm.fl.peer_pool import PeerPool, PooledRound, PoolSettings, parse_pool_name, score_with_pool  # noqa: E402
from kfca_llm.fl.pool_close import ClosingRound, close_round  # noqa: E402
from kfca_llm.fl.pool_policy import record  # noqa: E402

PAGE = "docs/few-peers.md"
MARKER = "the round of A (honest) and B (flipper)"
COORDS, SEED = 256, 7
ROUNDS = [("C", "D"), ("E", "F"), ("G", "H"), ("A", "B"), ("I", "J")]
HELD, FLIPPER = 4, "B"


def federation() -> list[dict[str, np.ndarray]]:
    """Each round's two updates, gradient steps towards a target that drifts: an honest update is ``1.5 * gap + noise``
    (``gap``: the target less the global; a step of 1.5 overshoots, so an update anti-agrees with the previous round's
    and agrees with the one before), the flipper's its honest update negated, and the global moves by the round's mean
    update (FedAvg). A round of an honest update and a flipped one hardly moves it: the round after steps the way the
    honest one did."""
    rng = np.random.default_rng(SEED)
    gap = rng.standard_normal(COORDS)
    out = []
    for pair in ROUNDS:
        updates = {}
        for client in pair:
            update = 1.5 * gap + rng.standard_normal(COORDS)
            updates[client] = (-update if client == FLIPPER else update).astype(np.float32)
        gap = gap - np.mean(list(updates.values()), axis=0) + rng.standard_normal(COORDS)
        out.append(updates)
    return out


def run() -> tuple[PooledRound, PooledRound, dict, list]:
    """The federation's rounds through the real pool: round 4 as it was scored, round 4 as the settlement at the end of
    round 5 scored it again (the pool on both sides of it), the records of A and B as round 4 was scored, and round 5's
    settlements."""
    pool = PeerPool(PoolSettings())
    held = settled_round = records = None
    for t, updates in enumerate(federation(), start=1):
        packer = pack_updates({c: {"w": u} for c, u in updates.items()})
        a, b = sorted(updates)
        scored = score_with_pool(packer, pool, t, pairs=[(a, b), (b, a)], seed=t, copy_candidates=[a, b])
        if t == HELD:
            held, held_packer, records = scored, packer, {c: record(pool, c, t) for c in (a, b)}

        def settling(pool_then: PeerPool) -> None:
            nonlocal settled_round
            if t == HELD + 1:
                settled_round = score_with_pool(held_packer, pool_then, HELD, pairs=[("A", "B"), ("B", "A")],
                                                seed=HELD, copy_candidates=["A", "B"], horizon=t)

        settlements = close_round(pool, ClosingRound.scored(
            packer, t, scored, words=packer.words(), participants=[a, b], seed=t, penalty="expected",
            bonus_fraction=0.5, duplicates="zero", duplicate_rule=DuplicateRule()), on_settling=settling)
    return held, settled_round, records, settlements


def example_text() -> str:
    """The example as the page shows it: round 4's in-round payments and why it waits, round 5's ranking, and the
    settlement's pool peers, lag weights, verdicts and rewards, to 4 decimals."""
    held, scored, records, _ = run()
    updates = federation()
    report, t = scored.report, HELD
    weight = PoolSettings().weight
    a, b = ROUNDS[HELD - 1]
    i, j = ROUNDS[HELD]
    entries = [f"{i}@{HELD + 1}", f"{j}@{HELD + 1}"]
    after = {c: sum(report.pairwise[(c, e)] for e in entries) / 2 for c in (a, b)}
    between = score_updates({c: {"w": updates[HELD][c]} for c in (i, j)}, seed=HELD).pairwise[(i, j)]
    lower = a if after[a] < after[b] else b
    higher = b if lower == a else a
    lines = [f"{MARKER}, round {t} (pool_weight {weight}, pool_peers {PoolSettings().pool_peers})", "",
             f"in-round payment: {a} from {b} {held.report.pairwise[(a, b)]:+.4f}, "
             f"{b} from {a} {held.report.pairwise[(b, a)]:+.4f}",
             f"records: {a} {records[a]}, {b} {records[b]}; no lineage yet: nothing settles the pair in its round",
             f"round {t}: {a} {held.report.rewards[a]:+.4f}, {b} {held.report.rewards[b]:+.4f} (undetermined: both wait "
             f"for round {t + 1})", "",
             f"round {t + 1}: {i} and {j} agree ({i} paid {between:+.4f} against {j} on round {t}'s tasks); against "
             f"them {a} is paid {after[a]:+.4f} on average, {b} {after[b]:+.4f}",
             f"ranked lower: {lower} (s = +1: fined the disagreement); {higher}: s = -1 (read back)", "",
             f"settled at the end of round {t + 1}, the pool on both sides of round {t}:",
             "lag weights: " + ", ".join(f"lag {k}: {w:+.4f}" for k, w in sorted(scored.lag_weights.items())), "",
             f"pool peer   lag   weight   payment to {a}   payment to {b}"]
    assert scored.pool_peers[a] == scored.pool_peers[b]  # neither is the other's pool peer: the same entries
    verdict = {}
    for name in scored.pool_peers[a]:
        lag = abs(t - parse_pool_name(name)[1])
        w = scored.lag_weights.get(lag, 0.0)
        lines.append(f"{name:<9} {lag:>5} {w:>+8.4f} {report.pairwise[(a, name)]:>+14.4f} "
                     f"{report.pairwise[(b, name)]:>+14.4f}")
    for c in (a, b):
        terms = [(scored.lag_weights.get(abs(t - parse_pool_name(n)[1]), 0.0), report.pairwise[(c, n)])
                 for n in scored.pool_peers[c]]
        verdict[c] = sum(w * p for w, p in terms) / sum(abs(w) for w, _ in terms)
    lines += ["", f"z (the pool's verdict): {a} {verdict[a]:+.4f}, {b} {verdict[b]:+.4f}", ""]
    sign = {lower: 1.0, higher: -1.0}
    for c in (a, b):
        p = report.pairwise[(c, b if c == a else a)]
        lines.append(f"reward {c} = ({weight} * ({verdict[c]:+.4f}) + ({sign[c]:+.0f}) * ({p:+.4f})) / ({weight} + 1)"
                     f" = {report.rewards[c]:+.4f}")
    return "\n".join(lines) + "\n"


def test_the_page_shows_what_the_pool_computes():
    """Change a number in the page's block, or the pool's rule, and this fails."""
    assert one_block(PAGE, "text", MARKER) == example_text()


def test_the_rewards_are_the_rule_the_page_states():
    """Round 4's pair disagrees and nothing settles it as it is scored (no records, no lineage): both wait, paid 0
    (pool rule 15). Round 5's I and J agree with each other, A is paid more against them than the flipper B is: settled
    at the end of round 5, B is fined the disagreement and A paid it read back, reward = (pool_weight * z + s *
    in-round payment) / (pool_weight + |s|), the settlement paying what the example computes."""
    held, scored, records, settlements = run()
    t, w = HELD, PoolSettings().weight
    a, b = ROUNDS[HELD - 1]
    assert held.report.rewards == {a: 0.0, b: 0.0} and held.undetermined == (a, b)
    assert records == {a: None, b: None}
    report = scored.report
    z = {}
    for c in (a, b):
        terms = [(scored.lag_weights.get(abs(t - parse_pool_name(n)[1]), 0.0), report.pairwise[(c, n)])
                 for n in scored.pool_peers[c]]
        z[c] = sum(lw * p for lw, p in terms) / sum(abs(lw) for lw, _ in terms)
    assert report.pairwise[(a, b)] < 0 and report.pairwise[(b, a)] < 0
    assert abs(report.rewards[a] - (w * z[a] - report.pairwise[(a, b)]) / (w + 1)) < 1e-12
    assert abs(report.rewards[b] - (w * z[b] + report.pairwise[(b, a)]) / (w + 1)) < 1e-12
    assert report.rewards[a] > 0 > report.rewards[b] and scored.undetermined == ()
    paid = {s.participant: s.reward for s in settlements if s.round == HELD}
    assert paid == {a: report.rewards[a], b: report.rewards[b]}
    i, j = ROUNDS[HELD]
    updates = federation()[HELD]
    assert score_updates({c: {"w": updates[c]} for c in (i, j)}, seed=HELD).pairwise[(i, j)] >= 0
    assert sum(report.pairwise[(a, f"{c}@{HELD + 1}")] for c in (i, j)) > sum(
        report.pairwise[(b, f"{c}@{HELD + 1}")] for c in (i, j))


if __name__ == "__main__":
    print(example_text(), end="")


def test_each_rule_of_the_table_links_the_function_that_applies_it():
    """Each row of the page's table of rules names one function (``Class.method`` or a function) and links the file
    that defines it."""
    rows = markdown_table(page(PAGE), "| rule | what it does | applied by |")
    assert len(rows) >= 8
    for rule, _, applied in rows:
        (name, target), = re.findall(r"\[`([\w.]+)`\]\(([^)#]+)\)", applied)
        source = (ROOT / "docs" / target).resolve().read_text()
        *owner, function = name.split(".")
        assert re.search(rf"^\s*def {function}\(", source, re.M), f"{rule}: no {function} in {target}"
        if owner:
            assert re.search(rf"^class {owner[0]}\b", source, re.M), f"{rule}: no class {owner[0]} in {target}"
