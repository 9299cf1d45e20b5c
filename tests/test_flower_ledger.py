"""The reward ledger: a server killed inside a round's transaction leaves complete rounds only."""

import json
import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("flwr", reason="Flower is the optional extra kfca-llm[flower] (make install installs it)")

from flower_ledger_server import NODES, serve  # noqa: E402

from kfca_llm import InputError  # noqa: E402
from kfca_llm.cli import main  # noqa: E402
from kfca_llm.flower import read_ledger  # noqa: E402

HERE = Path(__file__).resolve().parent


def kill_inside_round(ledger: Path, server_round: int) -> list[dict]:
    """Run the server in a subprocess, SIGKILL it inside ``server_round``'s transaction; the rounds it reported."""
    proc = subprocess.Popen([sys.executable, str(HERE / "flower_ledger_server.py"), str(ledger),
                             "--pause-round", str(server_round)],
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
        for node, reward in record["rewards"].items():
            expected[node] = expected.get(node, 0.0) + reward
    assert contents.totals() == pytest.approx(expected, rel=1e-12, abs=1e-15)

    assert main(["ledger", str(ledger), "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert {t["node_id"]: t["total"] for t in printed["totals"]} == pytest.approx(expected, rel=1e-12, abs=1e-15)
    assert {t["node_id"]: t["rounds"] for t in printed["totals"]} == {str(n): 5 for n in NODES}
    assert printed["runs"] == 2


def test_ledger_command_prints_totals_as_table_and_csv(tmp_path, capsys):
    ledger = tmp_path / "rewards.sqlite"
    strategy = serve(ledger, rounds=2, report=lambda line: None)
    capsys.readouterr()
    totals = {n: strategy.rewards[1][n] + strategy.rewards[2][n] for n in strategy.rewards[1]}
    assert main(["ledger", str(ledger), "--csv"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "node_id,total,rounds,mean"
    rows = {line.split(",")[0]: line.split(",")[1:] for line in lines[1:]}
    assert {n: float(v[0]) for n, v in rows.items()} == pytest.approx(totals, rel=1e-12, abs=1e-15)
    assert all(v[1] == "2" for v in rows.values())
    assert main(["ledger", str(ledger)]) == 0
    table = capsys.readouterr().out
    assert f"{totals['4']:+.6f}" in table and "1 run(s), 2 round(s) recorded (2 scored), 0 failure(s)" in table


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
