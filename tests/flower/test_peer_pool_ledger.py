"""The ledger of the pooled KFCAStrategy run (``pooled_strategy_run``): ``kfca-llm verify`` recomputes its pooled
rounds and settlements, a ledger of an earlier pool rule or an edited one is never a false match, each settlement gets
a receipt, ``kfca-llm ledger`` shows the balances."""

import json
import sys

import pytest

pytest.importorskip("flwr", reason="Flower is the optional extra kfca-llm[flower] (make install installs it)")

from flower_local import pid  # noqa: E402
from pooled_strategy_run import FLIPPER, ROUNDS, run  # noqa: E402

sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[1]))
from helpers import reseal  # noqa: E402

from kfca_llm.cli import main  # noqa: E402
from kfca_llm.flower import read_ledger  # noqa: E402
from kfca_llm.flower.ledger_rows import ledger_summary  # noqa: E402


@pytest.mark.parametrize("rule", [1, 2, 3])
def test_a_ledger_of_an_earlier_pool_rule_is_unverifiable_where_the_pool_paid_never_a_false_mismatch(pooled, tmp_path,
                                                                                                    rule):
    """Rounds paid under pool rule 1 (one weighted mean of in-round and pool peers; recorded no ``rule``), rule 2
    (own resubmissions paid their agreement, never charged back) or rule 3 (an own submission within 2% of the signs
    charged back as a resubmission): this version's rule would pay them differently, which must not read as
    tampering."""
    import json
    import shutil
    import sqlite3

    from kfca_llm.fl.pool_store import POOL_RULE
    from kfca_llm.flower.audit import verify_ledger

    _, _, ledger = pooled
    old = tmp_path / f"rule{rule}.sqlite"
    shutil.copy(ledger, old)
    shutil.copytree(f"{ledger}.d", f"{old}.d")
    with sqlite3.connect(old) as conn:
        for run_id, t, settings in conn.execute("SELECT run_id, round, settings FROM rounds").fetchall():
            settings = json.loads(settings)
            assert settings["pool"].pop("rule") == POOL_RULE == 20
            if rule > 1:
                settings["pool"]["rule"] = rule
            conn.execute("UPDATE rounds SET settings = ? WHERE run_id = ? AND round = ?", (json.dumps(settings), run_id, t))
    reseal(old)
    check = verify_ledger(old)
    assert check.chain_errors == [] and len(check.rounds) == ROUNDS
    from kfca_llm.fl.pool_settings import POOL_RULES

    # the verifier names the recorded rule and what it was, from the one registry of rules
    assert all(r.status == "unverifiable" and f"peer pool: rule {rule} ({POOL_RULES[rule][:20]}" in r.detail
               for r in check.rounds)


def test_pooled_rounds_verify_from_the_ledger_and_a_changed_pool_entry_is_never_a_false_match(pooled, tmp_path,
                                                                                            capsys):
    _, _, ledger = pooled
    assert main(["verify", str(ledger)]) == 0
    assert f"{ROUNDS} match, 0 mismatch, 0 unverifiable" in capsys.readouterr().out
    # A pool entry's sign file altered: the rounds that drew on it cannot be recomputed (never a match).
    contents = read_ledger(ledger)
    first = [r for r in contents.rewards if r.round == 1][0]
    from kfca_llm.flower.ledger import signs_path

    path = signs_path(ledger, first.sign_sha256)
    original = path.read_bytes()
    try:
        path.write_bytes(original[:-4] + bytes(4))
        main(["verify", str(ledger)])
        out = capsys.readouterr().out
        assert "0 mismatch" in out and f"{ROUNDS} match" not in out
    finally:
        path.write_bytes(original)


def test_ledger_cli_shows_rounds_mean_standard_error_and_whether_distinguishable(pooled, capsys):
    _, _, ledger = pooled
    summary = ledger_summary(read_ledger(ledger))
    flipper = next(s for s in summary if s["participant"] == pid(FLIPPER))
    assert flipper["std_error"] > 0 and flipper["mean"] < 0
    assert main(["ledger", str(ledger), "--csv"]) == 0
    header = capsys.readouterr().out.splitlines()[0]
    assert header == ("participant,label,node_ids,total,rounds,mean,std_error,distinguishable_from_zero,"
                      "undetermined_rounds,settled_rounds")


def _copy_ledger(ledger, target):
    import shutil

    shutil.copy(ledger, target)
    shutil.copytree(f"{ledger}.d", f"{target}.d")
    return target


def test_settlements_verify_and_a_forged_moved_or_deleted_one_is_caught(pooled, tmp_path):
    import sqlite3

    from kfca_llm.flower.audit import verify_ledger

    _, _, ledger = pooled
    check = verify_ledger(ledger)
    assert check.ok and {r.status for r in check.rounds} == {"match"}
    settled_in = sorted({s.settled_in for s in read_ledger(ledger).settlements})
    assert all("settlement(s) of earlier rounds" in check.rounds[t - 1].detail for t in settled_in)

    def edited(name: str, sql: str, resealed: bool = True):
        """A copy of the ledger with ``sql`` run on it (foreign keys off, as a forger's tool would leave them)."""
        copy = _copy_ledger(ledger, tmp_path / f"{name}.sqlite")
        with sqlite3.connect(copy) as conn:
            conn.execute("PRAGMA foreign_keys=OFF")
            conn.execute(sql)
        if resealed:
            reseal(copy)
        return verify_ledger(copy)

    # A settlement's pay raised and the chain resealed (an operator with write access): the recomputation disagrees.
    check = edited("raised", "UPDATE settlements SET reward = reward + 0.5 WHERE round = 1")
    assert not check.chain_errors and not check.ok
    bad = [r for r in check.rounds if r.status == "mismatch"]
    assert [r.round for r in bad] == [settled_in[-1]] and all("settled" in line for line in bad[0].rows)

    # Settled earlier than the pool could (round 1 paid at round 2, resealed): the pool at round 2 cannot settle it.
    check = edited("early", "UPDATE settlements SET settled_in = 2 WHERE round = 1")
    assert any(r.round == 2 and r.status == "mismatch" and "could not settle it yet" in " ".join(r.rows)
               for r in check.rounds)

    # Deleted without resealing: the chain breaks; added for a round that was never recorded: listed.
    check = edited("deleted", "DELETE FROM settlements WHERE round = 2", resealed=False)
    assert any("do not hash" in e for e in check.chain_errors)
    check = edited("forged", "INSERT INTO settlements SELECT run_id, round, participant, 99, 1.0, '[]', 1.0 FROM "
                             "rewards WHERE round = 4", resealed=False)
    assert any("settled in round 99" in e for e in check.chain_errors)
    # A settlement of a round its participant did not train in (a pay added for nothing): listed.
    check = edited("stray", "INSERT INTO settlements SELECT run_id, 5, participant, 9, 1.0, '[]', 1.0 FROM rewards "
                            "WHERE round = 4 AND participant NOT IN (SELECT participant FROM rewards WHERE round = 5)")
    assert any("has no reward row" in e for e in check.chain_errors)


def test_each_settlement_gets_a_signed_receipt_that_catches_a_resealed_settlement(tmp_path, monkeypatch):
    import sqlite3

    from kfca_llm.flower import receipts

    issued = []
    make = receipts.make_receipt
    monkeypatch.setattr(receipts, "make_receipt", lambda *a: issued.append(make(*a)) or issued[-1])
    ledger = tmp_path / "rewards.sqlite"
    run(ledger, receipt_key=tmp_path / "server.key")
    folder = tmp_path / "receipts"
    receipts.save_receipts(issued, folder)
    contents = read_ledger(ledger)
    bodies = [json.loads(t)["receipt"] for t in issued]
    settled = sorted((b["round"], b["participant"], b["settled_in"], b["reward"]) for b in bodies if "kind" in b)
    assert settled and settled == sorted((s.round, s.participant, s.settled_in, s.reward) for s in contents.settlements)
    key = receipts.read_public_key(tmp_path / "server.key.pub")
    assert receipts.check_receipts(contents, folder, key) == ([], len(issued))
    with sqlite3.connect(ledger) as conn:
        conn.execute("UPDATE settlements SET reward = reward + 1 WHERE round = 2")
    reseal(ledger)
    problems, _ = receipts.check_receipts(read_ledger(ledger), folder, key)
    # The settlement's own receipt names the raised reward; every receipt from the resealed round on, the new hash.
    assert [p for p in problems if "reward is" in p] == [p for p in problems if "settled in round" in p and "reward is" in p]
    assert len([p for p in problems if "reward is" in p]) == 2


def test_the_runs_last_round_settles_what_still_waits_and_only_it_settles_its_own(tmp_path):
    """Pool rule 17: stopped at round 4 (``num_rounds=4``), the run's last round settles rounds 1-3, which the 24-round
    run settles at rounds 6 and 7 once the pool has warmed up; the ledger marks that round ``closes_run`` and verifies.
    A settlement of a round in itself is listed where the round is not the run's last; ``closes_run`` forged onto an
    earlier round (resealed) or holding a string is never a match."""
    import sqlite3

    from kfca_llm.flower.audit import verify_ledger

    ledger = tmp_path / "four.sqlite"
    strategy, _ = run(ledger, rounds=4)
    contents = read_ledger(ledger)
    assert strategy.last_round == 4 and not strategy.pool.pending
    assert [r.round for r in contents.rounds if r.settings.get("closes_run")] == [4]
    undetermined = {(r.round, who) for r in contents.rounds for who in r.undetermined or ()}
    assert {(s.round, s.participant) for s in contents.settlements} == undetermined
    assert {s.settled_in for s in contents.settlements} == {4} and {t for t, _ in undetermined} == {1, 2, 3}
    (fined,) = [s for s in contents.settlements if s.participant in {r.participant for r in contents.rewards
                                                                      if r.node_id == str(FLIPPER)}]
    assert fined.reward < 0 < min(s.reward for s in contents.settlements if s is not fined)
    check = verify_ledger(ledger)
    assert check.ok and {r.status for r in check.rounds} == {"match"}
    assert check.rounds[3].detail.endswith(f"{len(undetermined)} settlement(s) of earlier rounds")

    def edited(name: str, *sql: str):
        copy = _copy_ledger(ledger, tmp_path / f"{name}.sqlite")
        with sqlite3.connect(copy) as conn:
            conn.execute("PRAGMA foreign_keys=OFF")
            for statement in sql:
                conn.execute(statement)
        reseal(copy)
        return verify_ledger(copy)

    def self_settled(t: int) -> str:
        return (f"INSERT OR REPLACE INTO settlements SELECT run_id, round, participant, round, reward, peers, "
                f"unadjusted_reward FROM rewards WHERE round = {t} LIMIT 1")

    # A round that settles itself: listed unless it is the run's last, whose recomputation finds nobody waiting.
    check = edited("self3", self_settled(3))
    assert any("(or, the run's last, its own)" in e for e in check.chain_errors)
    assert check.rounds[2].status == "mismatch"
    check = edited("self4", self_settled(4))
    assert not check.chain_errors and not check.ok
    assert "was not waiting" in " ".join(check.rounds[3].rows)
    # closes_run forged onto round 3: its replay settles nothing it recorded and drops what waits, so round 4's
    # settlements name rounds no longer waiting.
    check = edited("early", "UPDATE rounds SET settings = json_set(settings, '$.closes_run', json('true')) "
                            "WHERE round = 3")
    assert not check.ok and check.rounds[3].status == "mismatch"
    check = edited("string", "UPDATE rounds SET settings = json_set(settings, '$.closes_run', 'yes') WHERE round = 4")
    assert check.rounds[3].status == "unverifiable" and "closes_run setting is 'yes'" in check.rounds[3].detail


def test_a_settling_round_moved_after_a_later_one_is_never_a_match(pooled, tmp_path):
    """Rows reordered: the pool reaches the later round first and applies the settlements on its way; the settling
    round, checked after, cannot be recomputed (never a match, never a crash), and the chain says why."""
    import sqlite3

    from kfca_llm.flower.audit import verify_ledger

    _, _, ledger = pooled
    moved = _copy_ledger(ledger, tmp_path / "moved.sqlite")
    at = min(s.settled_in for s in read_ledger(ledger).settlements)
    with sqlite3.connect(moved) as conn:
        conn.execute("CREATE TEMP TABLE kept AS SELECT * FROM rounds WHERE round = ?", (at,))
        conn.execute("DELETE FROM rounds WHERE round = ?", (at,))
        conn.execute("INSERT INTO rounds SELECT * FROM kept")
    check = verify_ledger(moved)
    assert any("reordered" in e for e in check.chain_errors) and not check.ok
    (settling,) = [r for r in check.rounds if r.round == at]
    assert settling.status == "unverifiable" and "reordered" in settling.detail


def test_a_rounds_value_sketches_forged_are_damaged_never_a_crash_nor_a_match(pooled, tmp_path, capsys):
    """Pool rule 11's value sketches as a forger leaves them (re-sealed): a sketch file naming one participant twice,
    or of another size than the round's replies take, reads as damaged (never an exception), and the rounds after it,
    whose pool it is part of, are never a match."""
    import hashlib
    import sqlite3

    from kfca_llm.flower.audit import verify_ledger
    from kfca_llm.flower.ledger import signs_path

    _, _, ledger = pooled
    round_row = next(r for r in read_ledger(ledger).rounds if r.round == 3)
    data = signs_path(ledger, round_row.values_sha256).read_bytes()
    entry = len(data) // round_row.valid_replies
    for forged, why in ((data[:entry] * round_row.valid_replies, "one participant named twice"),
                        (data + data[:entry], "hold")):
        copy = _copy_ledger(ledger, tmp_path / f"forged{len(forged)}.sqlite")
        sha = hashlib.sha256(forged).hexdigest()
        signs_path(copy, sha).write_bytes(forged)
        with sqlite3.connect(copy) as conn:
            conn.execute("UPDATE rounds SET values_sha256 = ? WHERE round = 3", (sha,))
        reseal(copy)
        check = verify_ledger(copy)
        third = next(r for r in check.rounds if r.round == 3)
        assert third.status == "damaged" and why in third.detail, third
        assert all(r.status != "match" for r in check.rounds if r.round > 3)  # its pool cannot be rebuilt
