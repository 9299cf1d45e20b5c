"""`kfca-llm verify` and verify_ledger: the hash chain catches edits, kept signs are scored again, a participant
finds its own update."""

import json
import sqlite3
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("flwr", reason="Flower is the optional extra kfca-llm[flower] (make install installs it)")

from flower_ledger_server import serve  # noqa: E402
from flower_local import pid  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from helpers import reseal  # noqa: E402

from kfca_llm.cli import main  # noqa: E402
from kfca_llm.flower import read_ledger, verify_ledger  # noqa: E402
from kfca_llm.flower.ledger import store_dir  # noqa: E402


def test_verify_detects_edits_deletions_and_reordering_without_stored_signs(tmp_path, capsys):
    ledger = tmp_path / "rewards.sqlite"
    serve(ledger, rounds=3, report=lambda line: None)
    assert verify_ledger(ledger).ok
    head = verify_ledger(ledger).head
    with sqlite3.connect(ledger) as conn:  # one self-contained file to copy (no WAL beside it)
        conn.execute("PRAGMA journal_mode=DELETE")
    pristine = ledger.read_bytes()

    def tampered(sql: str) -> list[str]:
        ledger.write_bytes(pristine)
        with sqlite3.connect(ledger) as conn:
            conn.executescript(sql)
        return verify_ledger(ledger, expect_head=head).chain_errors

    assert tampered("SELECT 1") == []
    edited = tampered("UPDATE rewards SET reward = reward + 0.01 WHERE round = 2 AND node_id = '4'")
    assert any("round 2: its rows do not hash" in e for e in edited)
    assert any("round 2" in e for e in tampered("UPDATE rewards SET participant = 'name:thief' WHERE round = 2 "
                                                 "AND node_id = '1'"))
    deleted = tampered("DELETE FROM rounds WHERE round = 2")
    assert any("a round deleted" in e for e in deleted) and any("rows of a round the ledger does not list" in e
                                                                 for e in deleted)
    # Swap the first two rounds' rowids: the chain now runs out of order.
    reordered = tampered("UPDATE rounds SET rowid = 100 WHERE rowid = 1; UPDATE rounds SET rowid = 1 WHERE rowid = 2; "
                         "UPDATE rounds SET rowid = 2 WHERE rowid = 100;")
    assert any("rows reordered" in e for e in reordered)
    truncated = tampered("DELETE FROM rewards WHERE round = 3")
    assert truncated  # rows of round 3 deleted: its hash no longer matches
    ledger.write_bytes(pristine)
    with sqlite3.connect(ledger) as conn:
        conn.execute("DELETE FROM rewards WHERE round = 3")
        conn.execute("DELETE FROM rounds WHERE round = 3")
    assert verify_ledger(ledger).chain_errors == []  # a clean cut of the newest round keeps a valid chain...
    assert "expected" in verify_ledger(ledger, expect_head=head).chain_errors[0]  # ...but not the published head
    assert main(["verify", str(ledger), "--expect-head", head]) == 1
    assert "chain BROKEN" in capsys.readouterr().out


def test_verify_recomputes_kept_rounds_and_reports_mismatched_rows(tmp_path, capsys):
    ledger = tmp_path / "rewards.sqlite"
    serve(ledger, rounds=2, keep_signs=True, report=lambda line: None)
    check = verify_ledger(ledger)
    assert [(r.round, r.status) for r in check.rounds] == [(1, "match"), (2, "match")] and check.ok
    contents = read_ledger(ledger)
    # One file per participant per round, named by its SHA-256, plus each round's task words and value sketches.
    stored = {p.name for p in (store_dir(ledger) / "signs").iterdir()}
    planes = {r.public_sha256 for r in contents.rounds} - {None}  # round 2's public strata (round 1 has none)
    values = {r.values_sha256 for r in contents.rounds} - {None}
    assert len(values) == 2
    assert ({r.sign_sha256 for r in contents.rewards} | {r.task_sha256 for r in contents.rounds} | planes | values
            == stored)

    # A row paid more than its signs earn: the chain is re-sealed (an insider rewriting history), so only
    # the recomputation can see it.
    with sqlite3.connect(ledger) as conn:
        conn.execute("UPDATE rewards SET reward = reward + 0.25 WHERE round = 2 AND node_id = '3'")
    reseal(ledger)
    check = verify_ledger(ledger)
    assert check.chain_errors == []
    assert [(r.round, r.status) for r in check.rounds] == [(1, "match"), (2, "mismatch")] and not check.ok
    (row,) = check.rounds[1].rows
    assert row.startswith(pid(3)) and "reward" in row and "recomputed" in row
    assert main(["verify", str(ledger)]) == 1
    out = capsys.readouterr().out
    assert "round 2: mismatch (1 row(s) differ)" in out and "1 match, 1 mismatch, 0 unverifiable" in out

    # A missing or altered sign file makes the round damaged, never a match.
    victim = contents.rewards[0].sign_sha256
    (store_dir(ledger) / "signs" / victim).write_bytes(b"\x00" * 8)
    first = verify_ledger(ledger).rounds[0]  # kept signs that are not the round's: damaged, and a failure
    assert first.status == "damaged" and "8 bytes, the round's layout implies" in first.detail
    (store_dir(ledger) / "signs" / victim).unlink()
    assert "missing" in verify_ledger(ledger).rounds[0].detail and not verify_ledger(ledger).ok


def test_verify_recomputes_the_public_strata_each_round_was_scored_within(tmp_path):
    """Each round records its public planes (engine.public: the global's change over the last 1, 2, ... rounds) and
    how many spans they cover; verify scores the round within them again. A ledger re-sealed without them, or with
    altered planes, does not verify."""
    ledger = tmp_path / "rewards.sqlite"
    strategy = serve(ledger, rounds=3, keep_signs=True, report=lambda line: None)
    rounds = read_ledger(ledger).rounds
    assert [(r.public_steps, r.public_sha256 is not None) for r in rounds] == [(None, False), (1, True), (2, True)]
    assert [strategy.reports[t].tasks.get("public_steps") for t in (1, 2, 3)] == [None, 1, 2]
    assert [r.status for r in verify_ledger(ledger).rounds] == ["match"] * 3
    with sqlite3.connect(ledger) as conn:  # the conditioning removed: round 3 scored again without it differs
        conn.execute("UPDATE rounds SET public_sha256 = NULL, public_steps = NULL WHERE round = 3")
    reseal(ledger)
    check = verify_ledger(ledger)
    assert check.chain_errors == [] and [r.status for r in check.rounds] == ["match", "match", "mismatch"]
    planes = store_dir(ledger) / "signs" / rounds[1].public_sha256
    planes.write_bytes(bytes(reversed(planes.read_bytes())))
    assert verify_ledger(ledger).rounds[1].status == "damaged"


def test_a_resumed_run_conditions_on_the_globals_it_sent_since_the_resume(tmp_path):
    """A resumed run's public trajectory starts again at the arrays it resumes from (the ledger keeps only the
    newest global): the first resumed round is unconditioned, the next has one step; verify matches every round."""
    ledger = tmp_path / "rewards.sqlite"
    serve(ledger, rounds=2, keep_signs=True, report=lambda line: None)
    serve(ledger, rounds=4, keep_signs=True, resume=True, report=lambda line: None)
    assert [r.public_steps for r in read_ledger(ledger).rounds] == [None, 1, None, 1]
    assert [r.status for r in verify_ledger(ledger).rounds] == ["match"] * 4


def test_rounds_scored_under_an_earlier_copy_rule_are_unverifiable_not_mismatched(tmp_path):
    """A ledger of the version before ``DuplicateRule.copy_fit_sigma`` (its copy fit was taken 3 standard errors
    up): recomputing it with today's rule could flag other pairs, which would read as tampering."""
    ledger = tmp_path / "rewards.sqlite"
    serve(ledger, rounds=1, keep_signs=True, report=lambda line: None)
    with sqlite3.connect(ledger) as conn:
        (settings,) = conn.execute("SELECT settings FROM rounds").fetchone()
        settings = json.loads(settings)
        del settings["duplicate_rule"]["copy_fit_sigma"]
        conn.execute("UPDATE rounds SET settings = ?", (json.dumps(settings),))
    reseal(ledger)
    check = verify_ledger(ledger)
    assert check.chain_errors == []
    (only,) = check.rounds
    assert only.status == "unverifiable" and "copy_fit_sigma" in only.detail


def test_a_participant_checks_that_its_own_update_is_the_one_scored(tmp_path, capsys):
    from flower_local import honest_update
    from safetensors.numpy import save_file

    ledger = tmp_path / "rewards.sqlite"
    serve(ledger, rounds=2, report=lambda line: None)
    mine = tmp_path / "mine.safetensors"
    save_file(honest_update(2, 2), str(mine))
    assert main(["verify", str(ledger), "--node-update", str(mine), "--round", "2"]) == 0
    assert f"the one scored for participant {pid(2)} (node 2)" in capsys.readouterr().out
    assert main(["verify", str(ledger), "--node-update", str(mine), "--round", "1"]) == 1  # round 1's differs
    other = tmp_path / "other.npz"
    np.savez(other, **{k: -v for k, v in honest_update(2, 2).items()})
    assert main(["verify", str(ledger), "--node-update", str(other), "--round", "2"]) == 1
    assert "no participant was scored with this update" in capsys.readouterr().out
    assert main(["verify", str(ledger), "--node-update", str(mine)]) == 2
    assert "needs --round" in capsys.readouterr().err
    assert main(["verify", str(ledger), "--node-update", str(mine), "--round", "9"]) == 2
