"""docs/few-peers.md opens with a worked example of a two-client round: its numbers are the real pool's.

The federation: three earlier rounds of two honest clients each (C and D, E and F, G and H), then a round of an honest
client A and a sign flipper B, 256-coordinate float updates from a seeded numpy generator. Each round is scored by
``score_with_pool`` and closed by ``close_round`` (default ``PoolSettings``, unconditioned: ``public=None``), as a run
would; the example's block in the page is what ``example_text`` prints for the last round, character for character."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from doc_pages import ROOT, markdown_table, one_block, page  # noqa: E402

from kfca_llm.api import pack_updates  # noqa: E402
from kfca_llm.engine.duplicates import DuplicateRule  # noqa: E402
from kfca_llm.fl.peer_pool import PeerPool, PooledRound, PoolSettings, parse_pool_name, score_with_pool  # noqa: E402
from kfca_llm.fl.pool_close import ClosingRound, close_round  # noqa: E402
from kfca_llm.fl.pool_policy import record  # noqa: E402

PAGE = "docs/few-peers.md"
MARKER = "the round of A (honest) and B (flipper)"
COORDS, SEED = 256, 7
ROUNDS = [("C", "D"), ("E", "F"), ("G", "H"), ("A", "B")]
FLIPPER = "B"


def federation() -> list[dict[str, np.ndarray]]:
    """Each round's two updates: an honest update is ``0.4 * persistent + direction + noise``, the direction turning
    back each round (``-0.5 * previous + noise``: an update anti-agrees with the previous round's, agrees with the one
    before); the flipper submits its honest update negated."""
    rng = np.random.default_rng(SEED)
    persistent, direction = rng.standard_normal(COORDS), rng.standard_normal(COORDS)
    out = []
    for pair in ROUNDS:
        direction = -0.5 * direction + rng.standard_normal(COORDS)
        updates = {}
        for client in pair:
            update = 0.4 * persistent + direction + rng.standard_normal(COORDS)
            updates[client] = (-update if client == FLIPPER else update).astype(np.float32)
        out.append(updates)
    return out


def run() -> tuple[PooledRound, PeerPool]:
    """The federation's rounds through the real pool; the last round's ``PooledRound`` and the pool it was scored on
    (before that round joined it)."""
    pool = PeerPool(PoolSettings())
    for t, updates in enumerate(federation(), start=1):
        packer = pack_updates({c: {"w": u} for c, u in updates.items()})
        a, b = sorted(updates)
        scored = score_with_pool(packer, pool, t, pairs=[(a, b), (b, a)], seed=t, copy_candidates=[a, b])
        if t == len(ROUNDS):
            return scored, pool
        close_round(pool, ClosingRound.scored(packer, t, scored, words=packer.words(), participants=[a, b], seed=t,
                                              penalty="expected", bonus_fraction=0.5, duplicates="zero",
                                              duplicate_rule=DuplicateRule()))
    raise AssertionError("unreachable")


def example_text() -> str:
    """The example as the page shows it: the last round's pool peers, lag weights, verdicts, in-round payments,
    ranking and rewards, to 4 decimals."""
    scored, pool = run()
    report, t = scored.report, len(ROUNDS)
    weight = pool.settings.weight
    a, b = ROUNDS[-1]
    lines = [f"{MARKER}, round {t} (pool_weight {weight}, pool_peers {pool.settings.pool_peers})", "",
             "lag weights: " + ", ".join(f"lag {k}: {w:+.4f}" for k, w in sorted(scored.lag_weights.items())), "",
             f"pool peer   lag   weight   payment to {a}   payment to {b}"]
    assert scored.pool_peers[a] == scored.pool_peers[b]  # neither is the other's pool peer: the same entries
    verdict = {}
    for name in scored.pool_peers[a]:
        lag = t - parse_pool_name(name)[1]
        w = scored.lag_weights.get(lag, 0.0)
        lines.append(f"{name:<9} {lag:>5} {w:>+8.4f} {report.pairwise[(a, name)]:>+14.4f} "
                     f"{report.pairwise[(b, name)]:>+14.4f}")
    for c in (a, b):
        terms = [(scored.lag_weights.get(t - parse_pool_name(n)[1], 0.0), report.pairwise[(c, n)])
                 for n in scored.pool_peers[c]]
        verdict[c] = sum(w * p for w, p in terms) / sum(abs(w) for w, _ in terms)
    lines += ["", f"z (the pool's verdict): {a} {verdict[a]:+.4f}, {b} {verdict[b]:+.4f}",
              f"records: {a} {record(pool, a, t)}, {b} {record(pool, b, t)} (first participations: ranked on z alone)",
              f"in-round payment: {a} from {b} {report.pairwise[(a, b)]:+.4f}, "
              f"{b} from {a} {report.pairwise[(b, a)]:+.4f}"]
    lower = a if verdict[a] < verdict[b] else b
    higher = b if lower == a else a
    sign = {lower: 1.0, higher: 1.0 if report.pairwise[(higher, lower)] >= 0 else -1.0}
    lines.append(f"ranked lower: {lower} (s = +1: fined the disagreement); {higher}: s = {sign[higher]:+.0f}"
                 f" ({'read back' if sign[higher] < 0 else 'the pair agrees'})")
    lines.append("")
    for c in (a, b):
        p = report.pairwise[(c, b if c == a else a)]
        lines.append(f"reward {c} = ({weight} * ({verdict[c]:+.4f}) + ({sign[c]:+.0f}) * ({p:+.4f})) / ({weight} + 1)"
                     f" = {report.rewards[c]:+.4f}")
    return "\n".join(lines) + "\n"


def test_the_page_shows_what_the_pool_computes():
    """Change a number in the page's block, or the pool's rule, and this fails."""
    assert one_block(PAGE, "text", MARKER) == example_text()


def test_the_rewards_are_the_rule_the_page_states():
    """reward = (pool_weight * z + s * in-round payment) / (pool_weight + |s|), the flipper ranked lower and fined, its
    honest partner paid the disagreement read back; nobody undetermined."""
    scored, pool = run()
    report, t, w = scored.report, len(ROUNDS), pool.settings.weight
    a, b = ROUNDS[-1]
    z = {}
    for c in (a, b):
        terms = [(scored.lag_weights.get(t - parse_pool_name(n)[1], 0.0), report.pairwise[(c, n)])
                 for n in scored.pool_peers[c]]
        z[c] = sum(lw * p for lw, p in terms) / sum(abs(lw) for lw, _ in terms)
    assert z[b] < z[a] and record(pool, a, t) is None and record(pool, b, t) is None
    assert report.pairwise[(a, b)] < 0 and report.pairwise[(b, a)] < 0
    assert abs(report.rewards[a] - (w * z[a] - report.pairwise[(a, b)]) / (w + 1)) < 1e-12
    assert abs(report.rewards[b] - (w * z[b] + report.pairwise[(b, a)]) / (w + 1)) < 1e-12
    assert report.rewards[a] > 0 > report.rewards[b] and scored.undetermined == ()


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
