"""An auditor runs `verify` and `ledger` on any ledger: hostile sign files, forged histories, type-confused cells.

Every case ends in a clear verdict or one clear error line, never a hang or a traceback. Each runs under a time
limit: ``limited`` (SIGALRM, in-process, for the library and ``main``) or ``cli`` (a subprocess with a timeout).
The limits catch hangs, they are no speed claim (the issue's answer times are measured in the closing note).
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import reseal, run_main

HERE = Path(__file__).resolve().parent
NODES = {1: "honest", 2: "honest", 3: "honest", 4: "flip", 5: "zero"}


# ------------------------------------------------------------------------------------------------------------
# Ledgers: one run with kept signs and one without, both with receipts delivered through Flower


def _serve(folder: Path, *, keep_signs: bool) -> Path:
    pytest.importorskip("flwr", reason="the ledgers are written by KFCAStrategy (the flower extra)")
    sys.path.insert(0, str(HERE / "flower"))
    from flower_local import serve_with_receipts

    return serve_with_receipts(folder, keep_signs=keep_signs, nodes=NODES)


@pytest.fixture(scope="module")
def kept(tmp_path_factory) -> Path:
    return _serve(tmp_path_factory.mktemp("kept"), keep_signs=True)


@pytest.fixture(scope="module")
def plain(tmp_path_factory) -> Path:
    return _serve(tmp_path_factory.mktemp("plain"), keep_signs=False)


def copy_of(pristine: Path, tmp_path: Path) -> Path:
    """A fresh copy of a served folder (ledger, store, receipts, keys); returns the ledger's path."""
    target = tmp_path / "case"
    shutil.copytree(pristine, target, symlinks=True)
    return target / "rewards.sqlite"


def edit(ledger: Path, sql: str, *params) -> None:
    with sqlite3.connect(ledger) as conn:
        conn.execute(sql, params)


def first_sign(ledger: Path) -> tuple[str, Path]:
    with sqlite3.connect(ledger) as conn:
        (sha,) = conn.execute("SELECT sign_sha256 FROM rewards WHERE round = 1 ORDER BY rowid LIMIT 1").fetchone()
    return sha, Path(f"{ledger}.d") / "signs" / sha


def verify(capsys, ledger: Path, *extra) -> tuple[int, str]:
    code, out, err = run_main(capsys, "verify", ledger, *extra)
    return code, out + err


def receipts(ledger: Path, node: int = 4) -> list[str]:
    folder = ledger.parent
    return ["--receipts", str(folder / f"receipts-{node}"), "--server-key", str(folder / "keys" / "server.key.pub")]


# ---- stored hashes used as paths --------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["/etc/passwd", "../../x", "../rewards.sqlite", "A" * 64])
def test_a_sign_hash_that_is_not_64_hex_digits_is_never_opened(kept, tmp_path, capsys, name):
    ledger = copy_of(kept, tmp_path)
    edit(ledger, "UPDATE rewards SET sign_sha256 = ? WHERE round = 1 AND node_id = '1'", name)
    reseal(ledger)
    code, out = verify(capsys, ledger)
    assert code == 1 and "round 1: damaged" in out and "not a SHA-256 (64 hex digits); not opened" in out


def test_a_fifo_in_place_of_a_sign_file_is_refused_without_waiting(kept, tmp_path, capsys):
    ledger = copy_of(kept, tmp_path)
    _, path = first_sign(ledger)
    path.unlink()
    os.mkfifo(path)
    code, out = verify(capsys, ledger)
    assert code == 1 and "are not a regular file; not read" in out


@pytest.mark.parametrize("target", ["/dev/zero", "inside"])
def test_a_sign_file_replaced_by_a_link_is_not_followed(kept, tmp_path, capsys, target):
    ledger = copy_of(kept, tmp_path)
    _, path = first_sign(ledger)
    if target == "inside":  # even a link to a copy of the right bytes: nothing is read through a link
        shutil.copy(path, tmp_path / "outside")
        target = str(tmp_path / "outside")
    path.unlink()
    path.symlink_to(target)
    code, out = verify(capsys, ledger)
    assert code == 1 and "a link (not followed)" in out


def test_a_signs_folder_that_is_a_link_elsewhere_is_not_followed(kept, tmp_path, capsys):
    ledger = copy_of(kept, tmp_path)
    signs = Path(f"{ledger}.d") / "signs"
    shutil.move(signs, tmp_path / "elsewhere")
    signs.symlink_to(tmp_path / "elsewhere")
    code, out = verify(capsys, ledger)
    assert code == 1 and "the store folder signs/ is not a directory" in out


def test_a_sign_file_of_another_size_than_the_layout_implies_is_not_read(kept, tmp_path, capsys):
    ledger = copy_of(kept, tmp_path)
    _, path = first_sign(ledger)
    with open(path, "ab") as handle:
        handle.truncate(1 << 30)  # a sparse GiB: refused on its size, before any read
    code, out = verify(capsys, ledger)
    assert code == 1 and "hold 1073741824 bytes, the round's layout implies" in out


def test_a_layout_of_a_trillion_coordinates_is_refused_before_anything_is_allocated(kept, tmp_path, capsys):
    ledger = copy_of(kept, tmp_path)
    edit(ledger, "UPDATE rounds SET layout = ? WHERE round = 2", json.dumps([["w", [10 ** 12]]]))
    reseal(ledger)
    code, out = verify(capsys, ledger)
    assert code == 1 and "round 2: damaged (the recorded tensor layout is not one any update has" in out


def test_a_sign_file_altered_in_place_is_damaged_not_a_match(kept, tmp_path, capsys):
    ledger = copy_of(kept, tmp_path)
    _, path = first_sign(ledger)
    data = bytearray(path.read_bytes())
    data[0] ^= 1
    path.write_bytes(bytes(data))
    code, out = verify(capsys, ledger)
    assert code == 1 and "do not hash to their name (file altered)" in out


def test_a_kept_round_without_its_task_words_is_damaged(kept, tmp_path, capsys):
    ledger = copy_of(kept, tmp_path)
    edit(ledger, "UPDATE rounds SET task_sha256 = NULL WHERE round = 3")
    reseal(ledger)
    code, out = verify(capsys, ledger)
    assert code == 1 and "round 3: damaged" in out


# ---- forged histories ---------------------------------------------------------------------------------------


def test_a_resealed_reward_passes_the_chain_alone_and_the_verdict_says_what_that_proves(plain, tmp_path, capsys):
    ledger = copy_of(plain, tmp_path)
    edit(ledger, "UPDATE rewards SET reward = reward + 1.0 WHERE round = 1 AND node_id = '4'")
    reseal(ledger)
    code, out = verify(capsys, ledger)
    assert code == 0 and "chain intact" in out
    assert "an intact chain shows only that no row was edited without recomputing the hashes" in out


def test_receipts_catch_a_resealed_reward_in_a_run_without_signs(plain, tmp_path, capsys):
    ledger = copy_of(plain, tmp_path)
    assert verify(capsys, ledger, *receipts(ledger))[0] == 0
    edit(ledger, "UPDATE rewards SET reward = reward + 1.0 WHERE round = 1 AND node_id = '4'")
    reseal(ledger)
    code, out = verify(capsys, ledger, *receipts(ledger))
    assert code == 1 and "round 1" in out and "(the round was rewritten after it was paid)" in out
    assert "reward is" in out and "in the ledger," in out and "in the signed receipt" in out


def test_a_signs_kept_flag_cleared_and_resealed_is_caught_by_the_runs_row(kept, tmp_path, capsys):
    ledger = copy_of(kept, tmp_path)
    edit(ledger, "UPDATE rewards SET reward = reward + 1.0 WHERE round = 2 AND node_id = '4'")
    edit(ledger, "UPDATE rounds SET signs_kept = 0 WHERE round = 2")
    reseal(ledger)
    code, out = verify(capsys, ledger)
    assert code == 1 and "says its signs were not kept, but its run keeps signs" in out


def test_receipts_catch_a_rewrite_of_the_runs_keep_signs_flag_too(kept, tmp_path, capsys):
    ledger = copy_of(kept, tmp_path)
    edit(ledger, "UPDATE rewards SET reward = reward + 1.0 WHERE round = 2 AND node_id = '4'")
    edit(ledger, "UPDATE rounds SET signs_kept = 0")
    edit(ledger, "UPDATE runs SET keep_signs = 0")
    reseal(ledger)
    code, out = verify(capsys, ledger, *receipts(ledger))
    assert code == 1 and out.count("(the round was rewritten after it was paid)") == 3


@pytest.mark.parametrize("sql", ["UPDATE participants SET label = 'honest-alice' WHERE first_node_id = '4'",
                                 "UPDATE participants SET key_fingerprint = NULL WHERE first_node_id = '4'",
                                 "UPDATE runs SET keep_signs = 1", "UPDATE runs SET settings = '{}'",
                                 "UPDATE runs SET receipt_key = NULL",
                                 "UPDATE failures SET reason = 'fine' WHERE round = 1"])
def test_an_edit_to_any_table_verify_or_ledger_reads_breaks_the_chain(plain, tmp_path, capsys, sql):
    ledger = copy_of(plain, tmp_path)
    with sqlite3.connect(ledger) as conn:
        conn.execute("INSERT INTO failures VALUES ((SELECT run_id FROM runs), 1, '9', NULL, 'late reply')")
    reseal(ledger)
    assert verify(capsys, ledger)[0] == 0
    edit(ledger, sql)
    code, out = verify(capsys, ledger)
    assert code == 1 and "round 1: its rows do not hash to its chain hash (edited)" in out


def test_receipts_catch_a_relabelled_participant_after_a_reseal(plain, tmp_path, capsys):
    ledger = copy_of(plain, tmp_path)
    edit(ledger, "UPDATE participants SET label = 'honest-alice' WHERE first_node_id = '4'")
    reseal(ledger)
    code, out = verify(capsys, ledger, *receipts(ledger))
    assert code == 1 and "(the round was rewritten after it was paid)" in out


def test_a_participant_deleted_from_its_table_is_named(plain, tmp_path, capsys):
    ledger = copy_of(plain, tmp_path)
    edit(ledger, "DELETE FROM participants WHERE first_node_id = '4'")
    reseal(ledger)
    code, out = verify(capsys, ledger)
    assert code == 1 and "is paid but not in the participants table (deleted)" in out


def test_receipts_signed_by_another_key_do_not_verify(plain, tmp_path, capsys):
    ledger = copy_of(plain, tmp_path)
    from kfca_llm.flower.receipts import load_or_create_server_key

    load_or_create_server_key(tmp_path / "other.key")
    code, out = verify(capsys, ledger, "--receipts", ledger.parent / "receipts-4", "--server-key",
                       tmp_path / "other.key.pub")
    assert code == 1 and out.count("the signature does not verify with the server key") == 3
    assert "the ledger says its receipts were signed with the key" in out


def test_a_receipt_edited_by_its_holder_does_not_verify(plain, tmp_path, capsys):
    ledger = copy_of(plain, tmp_path)
    path = sorted((ledger.parent / "receipts-4").iterdir())[0]
    item = json.loads(path.read_text())
    item["receipt"]["reward"] += 5.0
    path.write_text(json.dumps(item))
    code, out = verify(capsys, ledger, *receipts(ledger))
    assert code == 1 and "the signature does not verify" in out


def test_a_round_deleted_from_the_end_is_caught_by_a_receipt_and_by_the_published_head(plain, tmp_path, capsys):
    ledger = copy_of(plain, tmp_path)
    code, out = verify(capsys, ledger)
    head = out.split("(head ")[1].split(")")[0]
    edit(ledger, "DELETE FROM rewards WHERE round = 3")
    edit(ledger, "DELETE FROM failures WHERE round = 3")
    edit(ledger, "DELETE FROM rounds WHERE round = 3")
    assert verify(capsys, ledger)[0] == 0  # a clean cut keeps a valid shorter chain...
    code, out = verify(capsys, ledger, *receipts(ledger))
    assert code == 1 and "round 3" in out and "the ledger has no such round (deleted)" in out
    code, out = verify(capsys, ledger, "--expect-head", head)
    assert code == 1 and "rounds deleted, added or rewritten" in out


def test_receipts_in_a_fifo_or_oversized_file_are_not_read(plain, tmp_path, capsys):
    ledger = copy_of(plain, tmp_path)
    folder = ledger.parent / "receipts-4"
    os.mkfifo(folder / "fifo.json")
    (folder / "big.json").write_bytes(b" " * (1 << 20))
    code, out = verify(capsys, ledger, *receipts(ledger))
    assert code == 1 and "fifo.json: not a regular file (not read)" in out and "big.json: 1048576 bytes" in out


def test_receipts_without_the_server_key_are_one_clear_error(plain, tmp_path, capsys):
    ledger = copy_of(plain, tmp_path)
    code, _, err = run_main(capsys, "verify", ledger, "--receipts", ledger.parent / "receipts-4")
    assert code == 2 and "give --server-key" in err


def test_an_old_schema_says_what_verify_cannot_check(plain, tmp_path, capsys):
    ledger = copy_of(plain, tmp_path)
    with sqlite3.connect(ledger) as conn:
        conn.execute("ALTER TABLE runs DROP COLUMN receipt_key")
        conn.execute("PRAGMA user_version = 3")
    code, out = verify(capsys, ledger)
    assert "schema version 3: the chain leaves out the runs and participants tables" in out
    v1 = tmp_path / "v1.sqlite"
    with sqlite3.connect(v1) as conn:
        conn.executescript("CREATE TABLE rewards (run_id TEXT, round INTEGER, node_id TEXT, reward REAL, peers TEXT, "
                           "penalty TEXT, seed INTEGER, categorical_world INTEGER, num_examples INTEGER, "
                           "sign_sha256 TEXT); CREATE TABLE failures (run_id TEXT, round INTEGER, node_id TEXT, "
                           "reason TEXT); CREATE TABLE rounds (run_id TEXT, round INTEGER, status TEXT, seed INTEGER, "
                           "categorical_world INTEGER, valid_replies INTEGER, failed_replies INTEGER, recorded_at TEXT);"
                           "PRAGMA user_version=1;")
    code, out = verify(capsys, v1)
    assert code == 0 and "nothing of this ledger can be checked; an edited row passes" in out
    code, out = verify(capsys, v1, "--expect-head", "0" * 64)
    assert code == 1 and "schema version 1 has no hash chain" in out


# ---- type-confused cells ------------------------------------------------------------------------------------


@pytest.mark.parametrize("sql, params, why", [
    ("UPDATE rewards SET reward = 'abc' WHERE rowid = 2", (), "column 'reward' holds text where real or integer"),
    ("UPDATE rewards SET reward = 9e999 WHERE rowid = 2", (), "column 'reward' is inf, not a finite number"),
    ("UPDATE rewards SET participant = ? WHERE rowid = 2", (b"key:blob",), "column 'participant' holds blob"),
    ("UPDATE rewards SET node_id = CAST(? AS TEXT) WHERE rowid = 2", (b"\xff\xfe",), "column 'node_id' is not UTF-8"),
    ("UPDATE rewards SET peers = ? WHERE rowid = 2", ("[" * 100_000 + "]" * 100_000,), "column 'peers' holds JSON"),
    ("UPDATE rounds SET layout = ? WHERE rowid = 2", ('[["w", [' + "9" * 5000 + "]]]",), "column 'layout' is not valid"),
    ("UPDATE rounds SET signs_kept = 7 WHERE rowid = 2", (), "column 'signs_kept' is 7, not 0 or 1"),
])
def test_a_type_confused_cell_names_its_row_and_the_rest_is_still_verified(kept, tmp_path, capsys, sql, params, why):
    ledger = copy_of(kept, tmp_path)
    edit(ledger, sql, *params)
    code, out = verify(capsys, ledger)
    table = "rounds" if "rounds" in sql else "rewards"
    assert code == 1 and f"unreadable: {table} row 2: {why}" in out
    assert "round 3: match" in out  # one bad row does not make the ledger unreadable


def test_ledger_lists_the_readable_balances_and_names_the_bad_row(kept, tmp_path, capsys):
    ledger = copy_of(kept, tmp_path)
    edit(ledger, "UPDATE rewards SET reward = 'abc' WHERE rowid = 2")
    code, out, err = run_main(capsys, "ledger", ledger)
    assert code == 1 and "rewards row 2: column 'reward' holds text" in err and out.count("key:") == 5
    code, out, err = run_main(capsys, "ledger", ledger, "--json")
    assert code == 1 and json.loads(out)["bad_rows"] == [err.split("unreadable ")[1].split(" (left out")[0]]


def test_a_carriage_return_in_a_label_cannot_start_a_csv_row(plain, tmp_path, capsys):
    ledger = copy_of(plain, tmp_path)
    edit(ledger, "UPDATE participants SET label = ? WHERE first_node_id = '4'", "x\r=HYPERLINK(\"http://e\")\nq")
    code, out, _ = run_main(capsys, "ledger", ledger, "--csv")
    assert code == 0 and "\r" not in out and len(out.splitlines()) == 1 + len(NODES)
    assert "x\\r=HYPERLINK" in out


def test_a_name_from_supernode_register_is_stored_escaped():
    from kfca_llm.flower.identity import Claim, resolve

    identity = resolve(Claim("7", b"key-bytes", "evil\r=cmd|' /C calc'!A0\x1b[2J"), "public-key")
    assert identity.label == "evil\\r=cmd|' /C calc'!A0\\x1b[2J" and identity.label.isprintable()
    assert resolve(Claim("7", b"key-bytes", "alice"), "public-key").label == "alice"


def test_a_ledger_in_a_read_only_folder_is_read_without_writing(kept, tmp_path, capsys):
    ledger = copy_of(kept, tmp_path)
    # Handed over as a WAL ledger whose last commit is still in its -wal file, without the -shm file: SQLite
    # cannot open that read-only in a read-only folder (it would create the -shm); reading must see the commit.
    handed = tmp_path / "handed"
    handed.mkdir()
    writer = sqlite3.connect(ledger)
    try:
        writer.execute("PRAGMA journal_mode=WAL")
        writer.execute("PRAGMA wal_autocheckpoint=0")
        writer.execute("UPDATE participants SET label = 'wal-only' WHERE first_node_id = '1'")
        writer.commit()
        for suffix in ("", "-wal"):
            shutil.copy(f"{ledger}{suffix}", handed / f"rewards.sqlite{suffix}")
    finally:
        writer.close()
    shutil.copytree(f"{ledger}.d", handed / "rewards.sqlite.d")
    mount = tmp_path / "ro"
    mount.mkdir()
    bind = subprocess.run(["mount", "--bind", str(handed), str(mount)], capture_output=True, text=True)
    if bind.returncode != 0:
        pytest.skip(f"a read-only folder needs a bind mount, which this user cannot make: {bind.stderr[-200:]}")
    try:
        subprocess.run(["mount", "-o", "remount,ro,bind", str(mount)], check=True)
        code, out = verify(capsys, mount / "rewards.sqlite")
        assert "readonly" not in out and "3 match" in out
        assert code == 1 and "round 1: its rows do not hash to its chain hash (edited)" in out  # the -wal's edit
        assert sorted(p.name for p in handed.iterdir()) == ["rewards.sqlite", "rewards.sqlite-wal", "rewards.sqlite.d"]
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=True)


@pytest.mark.parametrize("kind", ["fifo", "directory", "not sqlite"])
def test_a_ledger_path_that_is_not_a_ledger_is_one_error_line(tmp_path, capsys, kind):
    path = tmp_path / "rewards.sqlite"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()
    else:
        path.write_bytes(b"SQLite format 2\x00" + b"\x00" * 200)
    code, _, err = run_main(capsys, "verify", path)
    assert code == 2 and ("not a regular file" in err or "cannot read the reward ledger" in err)


def test_a_type_confused_settlement_is_named_and_never_paid(kept, tmp_path, capsys):
    """A settlement row (a later round's pay of an undetermined one) is read as hostile as any other row."""
    ledger = copy_of(kept, tmp_path)
    from kfca_llm.flower import read_ledger

    before = read_ledger(ledger).totals()
    edit(ledger, "INSERT INTO settlements SELECT run_id, round, participant, 2, 'abc', '[]', 0.0 FROM rewards "
                 "WHERE rowid = 1")
    code, out = verify(capsys, ledger)
    assert code == 1 and "unreadable: settlements row 1: column 'reward' holds text where real or integer" in out
    assert read_ledger(ledger).totals() == before
