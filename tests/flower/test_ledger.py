"""The reward ledger: crashes leave complete rounds only, a resume continues the run, the CLI reads it."""

import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("flwr", reason="Flower is the optional extra kfca-llm[flower] (make install installs it)")

from flower_ledger_server import NODES, serve  # noqa: E402
from flower_local import pid  # noqa: E402

from kfca_llm import InputError  # noqa: E402
from kfca_llm.cli import main  # noqa: E402
from kfca_llm.flower import read_ledger, verify_ledger  # noqa: E402
from kfca_llm.flower.ledger import store_dir  # noqa: E402

HERE = Path(__file__).resolve().parent


def kill_inside_round(ledger: Path, server_round: int, *options: str) -> list[dict]:
    """Run the server in a subprocess, SIGKILL it inside ``server_round``'s transaction; the rounds it reported."""
    proc = subprocess.Popen([sys.executable, str(HERE / "flower_ledger_server.py"), str(ledger),
                             "--pause-round", str(server_round), *options],
                            cwd=HERE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    reported, paused = [], False
    try:
        for line in proc.stdout:
            if line.startswith("ROUND "):
                reported.append(json.loads(line[len("ROUND "):]))
            elif line.startswith("IN-TRANSACTION"):
                paused = True
                break
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    assert paused, "the server never reached the paused transaction"
    return reported


def test_a_server_killed_mid_round_leaves_complete_rounds_and_a_restart_appends(tmp_path, capsys):
    ledger = tmp_path / "rewards.sqlite"
    crashed = kill_inside_round(ledger, 3)
    assert [r["round"] for r in crashed] == [1, 2]
    # The killed transaction had written round 3's status row and a reward row: none of it may be visible.
    contents = read_ledger(ledger)
    assert [r.round for r in contents.rounds] == [1, 2]
    assert sorted({r.round for r in contents.rewards}) == [1, 2]
    assert len(contents.rewards) == 2 * len(NODES)
    with sqlite3.connect(ledger) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("SELECT count(*) FROM rewards WHERE round = 3").fetchone()[0] == 0

    restarted = []
    strategy = serve(ledger, rounds=3, report=restarted.append)
    contents = read_ledger(ledger)
    runs = sorted({r.run_id for r in contents.rounds})
    assert len(runs) == 2 and strategy.run_id in runs
    assert sorted((r.run_id == strategy.run_id, r.round) for r in contents.rounds) == [
        (False, 1), (False, 2), (True, 1), (True, 2), (True, 3)]
    # Same seed and nodes: the restarted run pays rounds 1-2 exactly as the killed one did.
    assert strategy.rewards[1] == crashed[0]["rewards"] and strategy.rewards[2] == crashed[1]["rewards"]

    expected: dict[str, float] = {}
    for record in crashed + [json.loads(line[len("ROUND "):]) for line in restarted]:
        for who, reward in record["rewards"].items():
            expected[who] = expected.get(who, 0.0) + reward
    assert contents.totals() == pytest.approx(expected, rel=1e-12, abs=1e-15)

    assert main(["ledger", str(ledger), "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    totals = {t["participant"]: t for t in printed["totals"]}
    assert {p: t["total"] for p, t in totals.items()} == pytest.approx(expected, rel=1e-12, abs=1e-15)
    assert {p: (t["rounds"], t["node_ids"]) for p, t in totals.items()} == {pid(n): (5, [str(n)]) for n in NODES}
    assert printed["runs"] == 2
    assert main(["verify", str(ledger)]) == 0  # the chain holds across the crash (signs not kept: unverifiable)
    assert "chain intact" in capsys.readouterr().out


def test_resume_after_a_crash_continues_the_run_from_its_last_committed_round(tmp_path, capsys):
    """Unconditioned (public_steps=0), a resumed run pays what the uninterrupted one pays; the public trajectory
    restarts at a resume (next test)."""
    ledger = tmp_path / "rewards.sqlite"
    crashed = kill_inside_round(ledger, 3, "--keep-signs", "--rounds", "4", "--public-steps", "0")
    assert [r["round"] for r in crashed] == [1, 2]
    assert main(["verify", str(ledger)]) == 0
    assert "2 match, 0 mismatch, 0 unverifiable" in capsys.readouterr().out

    resumed = serve(ledger, rounds=4, keep_signs=True, resume=True, report=lambda line: None, public_steps=0)
    assert resumed.round_offset == 2 and sorted(resumed.rewards) == [3, 4]
    contents = read_ledger(ledger)
    assert [(r.run_id, r.round) for r in contents.rounds] == [(resumed.run_id, t) for t in (1, 2, 3, 4)]
    uninterrupted = serve(tmp_path / "other.sqlite", rounds=4, report=lambda line: None, public_steps=0)
    assert {t: resumed.rewards[t] for t in (3, 4)} == {t: uninterrupted.rewards[t] for t in (3, 4)}
    # Round 3 started from the arrays round 2 produced (stored before round 2 committed): every round's
    # resulting arrays equal the uninterrupted run's.
    other = read_ledger(tmp_path / "other.sqlite")
    assert [r.global_sha256 for r in contents.rounds] == [r.global_sha256 for r in other.rounds]
    assert len({r.global_sha256 for r in contents.rounds}) == 4
    # Only the newest round's arrays are kept as the resume point; a resume with no round left runs none.
    assert sorted(p.stem for p in (store_dir(ledger) / "global").iterdir()) == [contents.rounds[3].global_sha256]
    assert serve(ledger, rounds=4, keep_signs=True, resume=True, report=lambda line: None, public_steps=0).rewards == {}
    assert main(["verify", str(ledger)]) == 0
    assert "4 match, 0 mismatch, 0 unverifiable" in capsys.readouterr().out


@pytest.mark.parametrize("setting, value", [("penalty", "sampled"), ("bonus_fraction", 0.4), ("peers", 2),
                                            ("duplicates", "split"), ("aggregation", "exclude-negative"),
                                            ("identity", "public-key"), ("pool", 3), ("public", 2)])
def test_resume_refuses_a_changed_scoring_setting_naming_it(tmp_path, setting, value):
    ledger = tmp_path / "rewards.sqlite"
    serve(ledger, rounds=1, report=lambda line: None)
    # The pool's and the public strata's settings are recorded as one dict each.
    shown = {"pool": re.escape(f"{{'min_peers': {value}"), "public": re.escape(f"{{'steps': {value}")}.get(
        setting, repr(value))
    # The sampled penalty is not conditioned (public_steps=0 with it): the penalty, first in order, is named.
    options = {"pool": {"min_peers": value}, "public": {"public_steps": value},
               "penalty": {"penalty": value, "public_steps": 0}}.get(setting, {setting: value})
    with pytest.raises(InputError, match=f"cannot resume: scoring setting '{setting}' was .* this run has {shown}"):
        serve(ledger, rounds=2, resume=True, report=lambda line: None, **options)
    assert len(read_ledger(ledger).rounds) == 1  # nothing written by the refused run
    serve(ledger, rounds=2, resume=True, report=lambda line: None)  # the same settings resume
    assert [r.round for r in read_ledger(ledger).rounds] == [1, 2]


def test_the_ledger_command_starts_without_torch_numba_or_flower(tmp_path):
    """Reading and printing balances needs neither the scoring engine nor Flower: a cold `kfca-llm ledger` is a
    tenth of a second, not the two or more that importing torch and numba takes."""
    ledger = tmp_path / "rewards.sqlite"
    serve(ledger, rounds=1, report=lambda line: None)
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "kfca_llm.cli", "ledger", str(ledger)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "1 run(s), 1 round(s) recorded" in done.stdout, done.stderr[-2000:]
    imported = {line.rsplit("|", 1)[-1].strip().split(".")[0] for line in done.stderr.splitlines()
                if line.startswith("import time:")}
    assert "kfca_llm" in imported and "rich" in imported  # what it does import is listed
    heavy = imported & {"torch", "numba", "scipy", "triton", "flwr"}
    assert not heavy, sorted(heavy)


def test_ledger_command_prints_balances_as_table_and_csv(tmp_path, capsys):
    ledger = tmp_path / "rewards.sqlite"
    strategy = serve(ledger, rounds=2, report=lambda line: None)
    capsys.readouterr()
    totals = {n: strategy.rewards[1][n] + strategy.rewards[2][n] for n in strategy.rewards[1]}
    assert main(["ledger", str(ledger), "--csv"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == ("participant,label,node_ids,total,rounds,mean,std_error,distinguishable_from_zero,"
                        "undetermined_rounds,settled_rounds")
    rows = {line.split(",")[0]: line.split(",")[1:] for line in lines[1:]}
    assert {n: float(v[2]) for n, v in rows.items()} == totals  # repr: the exact float
    # Two rounds: the standard error of the mean is half their difference; distinguishable beyond 1.96 of them.
    for n in NODES:
        a, b = strategy.rewards[1][pid(n)], strategy.rewards[2][pid(n)]
        se = float(rows[pid(n)][5])
        assert se == pytest.approx(abs(a - b) / 2, rel=1e-12)
        assert rows[pid(n)][6] == ("yes" if abs(a + b) / 2 > 1.96 * se else "no") and rows[pid(n)][7] == "0"
    assert {n: (v[1], v[3]) for n, v in rows.items()} == {pid(n): (str(n), "2") for n in NODES}
    assert main(["ledger", str(ledger)]) == 0
    table = capsys.readouterr().out
    assert f"{totals[pid(4)]:+.6f}" in table and "1 run(s), 2 round(s) recorded (2 scored), 0 failure(s)" in table


def test_csv_export_cannot_turn_names_into_formulas(tmp_path, capsys):
    from kfca_llm.flower.ledger import Ledger
    from kfca_llm.flower.ledger_rows import RewardRow, RoundEntry

    ledger = tmp_path / "rewards.sqlite"
    writer = Ledger(ledger, run_id="r", strategy="FedAvg", package_version="0", settings={}, keep_signs=False)
    names = ["=HYPERLINK(\"http://x\")", "+1+2", "-3", "@SUM(A1)", "\tTAB", "plain"]
    rows = [RewardRow("r", 1, f"name:{n}" if n == "plain" else n, str(k), -0.5, (), None, "0" * 64, -0.5)
            for k, n in enumerate(names)]
    writer.record_round(RoundEntry(1, 0, {}, len(rows), True, rows, []))
    assert main(["ledger", str(ledger), "--csv"]) == 0
    import csv

    parsed = list(csv.reader(capsys.readouterr().out.splitlines()))[1:]
    cells = {row[0] for row in parsed}
    # Control characters (a tab here) are written as escapes: no cell can hold a CR that starts a row.
    assert cells == {"'=HYPERLINK(\"http://x\")", "'+1+2", "'-3", "'@SUM(A1)", "'\\tTAB", "name:plain"}
    assert {row[3] for row in parsed} == {"-0.5"}  # numbers stay numbers


def test_reading_something_that_is_not_a_ledger_is_an_input_error(tmp_path, capsys):
    with pytest.raises(InputError, match="no ledger at"):
        read_ledger(tmp_path / "missing.sqlite")
    other = tmp_path / "other.sqlite"
    with sqlite3.connect(other) as conn:
        conn.execute("CREATE TABLE t (x)")
    with pytest.raises(InputError, match="not a kfca-llm reward ledger"):
        read_ledger(other)
    junk = tmp_path / "junk.sqlite"
    junk.write_bytes(b"\x00garbage" * 512)
    assert main(["ledger", str(junk)]) == 2
    assert "cannot read the reward ledger" in capsys.readouterr().err
    assert main(["verify", str(junk)]) == 2


def test_a_full_disk_gives_one_clear_error_and_no_half_round(tmp_path):
    """SQLite's page limit is how it reports a full disk (SQLITE_FULL); the round before it stays whole."""
    from kfca_llm.flower import ledger as ledger_module

    ledger = tmp_path / "rewards.sqlite"
    serve(ledger, rounds=1, report=lambda line: None, keep_signs=True)
    connect = ledger_module._connect

    def full(path):
        conn = connect(path)
        pages = conn.execute("PRAGMA page_count").fetchone()[0]
        conn.execute(f"PRAGMA max_page_count = {pages}")
        return conn

    ledger_module._connect = full
    try:
        with pytest.raises(ledger_module.LedgerWriteError) as caught:
            serve(ledger, rounds=2, resume=True, keep_signs=True, report=lambda line: None)
    finally:
        ledger_module._connect = connect
    message = str(caught.value)
    assert "round 2 was not recorded" in message and "full" in message and "\n" not in message
    contents = read_ledger(ledger)
    assert [r.round for r in contents.rounds] == [1] and {r.round for r in contents.rewards} == {1}
    assert verify_ledger(ledger).ok


def test_a_read_only_ledger_gives_one_clear_error_before_round_one():
    import shutil
    import tempfile

    # As root, file modes do not stop writes: the attempt then runs as an unprivileged user (imports done
    # first, while the interpreter's files are readable), in a folder that user can reach.
    folder = Path(tempfile.mkdtemp(prefix="kfca-readonly-"))
    ledger = folder / "rewards.sqlite"
    try:
        serve(ledger, rounds=1, report=lambda line: None)
        ledger.chmod(0o444)
        folder.chmod(0o555)
        drop = "os.setgid(65534); os.setuid(65534)" if os.geteuid() == 0 else "pass"
        script = (f"import os, sys; sys.path.insert(0, {str(HERE)!r}); from flower_ledger_server import serve\n"
                  f"from kfca_llm.errors import InputError\n{drop}\n"
                  f"try:\n    serve({str(ledger)!r}, rounds=2, resume=True, report=print)\n"
                  f"except InputError as exc:\n    print('ERROR', exc)\n")
        done = subprocess.run([sys.executable, "-c", script], cwd=HERE, capture_output=True, text=True, timeout=300)
        lines = [line for line in done.stdout.splitlines() if line.startswith(("ERROR", "ROUND"))]
        assert len(lines) == 1 and lines[0].startswith("ERROR cannot use") and "readonly" in lines[0], done.stderr
        assert [r.round for r in read_ledger(ledger).rounds] == [1]
    finally:
        folder.chmod(0o755)
        shutil.rmtree(folder)


def test_random_kills_leave_complete_verifiable_rounds(run_script):
    """A few trials of benchmarks/bench_ledger_crash.py (the benchmark runs 30 or more). The servers it kills are
    real processes (a SIGKILL mid-transaction is the proof); the script itself runs in this worker, which has
    flwr and torch imported already, and so do the restarts that finish each run."""
    printed = run_script(["benchmarks/bench_ledger_crash.py", "--trials", "3", "--seed", "1", "--json"])
    summary = json.loads(printed.splitlines()[-1])
    assert summary["trials"] == 3 and summary["failed"] == [] and summary["verified"] == 3
    assert summary["resumed_complete"] == 3


def test_a_resumed_run_logs_the_ledgers_round_numbers(tmp_path):
    """Flower counts a run's rounds from 1: without the offset a run resumed after round 2 logs round 3 as
    "[ROUND 1/2]"."""
    import logging

    class Lines(logging.Handler):
        def __init__(self):
            super().__init__()
            self.lines = []

        def emit(self, record):
            self.lines.append(record.getMessage())

    ledger = tmp_path / "rewards.sqlite"
    serve(ledger, rounds=2, report=lambda line: None)
    flower_logger, lines = logging.getLogger("flwr"), Lines()
    flower_logger.addHandler(lines)
    try:
        serve(ledger, rounds=4, resume=True, report=lambda line: None)
        serve(tmp_path / "fresh.sqlite", rounds=1, report=lambda line: None)
    finally:
        flower_logger.removeHandler(lines)
    assert [line for line in lines.lines if line.startswith("[ROUND")] == ["[ROUND 3/4]", "[ROUND 4/4]", "[ROUND 1/1]"]


def test_ledger_summary_standard_error_and_distinguishability_from_constructed_rows():
    from kfca_llm.flower.ledger_rows import LedgerContents, RewardRow, RoundRow, ledger_summary

    def row(who, t, reward):
        return RewardRow("run", t, who, "1", reward, (), None, "", reward)

    rewards = [row("a", 1, 0.2), row("a", 2, 1.0), row("b", 1, 1.0), row("b", 2, 1.5), row("c", 3, 0.3)]
    rounds = [RoundRow("run", t, "scored", 0, None, 2, 0, "", undetermined=("a",) if t == 1 else ()) for t in (1, 2, 3)]
    summary = {s["participant"]: s for s in ledger_summary(LedgerContents(rewards, [], rounds))}
    # a: mean 0.6, standard error 0.4: 1.5 standard errors from zero, not the 1.96 it takes.
    assert summary["a"]["std_error"] == pytest.approx(0.4) and summary["a"]["distinguishable_from_zero"] is False
    assert summary["b"]["std_error"] == pytest.approx(0.25) and summary["b"]["distinguishable_from_zero"] is True
    assert summary["c"]["std_error"] is None and summary["c"]["distinguishable_from_zero"] is None
    assert [summary[w]["undetermined_rounds"] for w in "abc"] == [1, 0, 0]
