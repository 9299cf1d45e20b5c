"""Reading a reward ledger as hostile input: every cell checked against its field's type, read-only always.

An auditor reads the ledger an operator hands over, so a cell may hold anything SQLite can store: text where a
number belongs, ``Infinity``, a BLOB, bytes that are not UTF-8, JSON of another shape. ``typed_rows`` reads a
table into the ledger's row dataclasses, deriving each cell's rule from the field's annotation (so a field
added to a row class is read, checked and hashed without a hand-kept list of columns); a row that breaks a
rule is reported in ``bad`` (table, rowid, column, why) and left out, never read as something else.

``open_for_reading`` opens the file read-only; where SQLite cannot (a WAL ledger in a read-only folder needs
to create its ``-shm`` file), it reads a private copy of the file and its ``-wal``: reading never needs, nor
takes, write access to the ledger's folder.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import sqlite3
import stat
import tempfile
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import fields
from pathlib import Path

from ..errors import InputError


def _text(value) -> str:
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            raise ValueError("is not UTF-8 text") from None
    return value


def _json(value) -> object:
    try:
        return json.loads(_text(value))
    except RecursionError:
        raise ValueError("holds JSON nested too deeply") from None
    except ValueError as exc:  # JSONDecodeError, and ints past Python's digit limit
        raise ValueError(f"is not valid JSON ({str(exc)[:80]})") from None


def _strings(value) -> tuple[str, ...]:
    items = _json(value)
    if not isinstance(items, list) or not all(isinstance(s, str) for s in items):
        raise ValueError("is not a JSON list of strings")
    return tuple(items)


def _spans(value) -> tuple[int, ...]:
    items = _json(value)
    if not isinstance(items, list) or not all(isinstance(s, int) and not isinstance(s, bool) and s > 0 for s in items):
        raise ValueError("is not a JSON list of positive integers")
    return tuple(items)


def _object(value) -> dict:
    item = _json(value)
    if not isinstance(item, dict):
        raise ValueError("is not a JSON object")
    return item


def _layout(value) -> tuple[tuple[str, tuple[int, ...]], ...]:
    items = _json(value)
    ok = isinstance(items, list) and all(
        isinstance(e, list) and len(e) == 2 and isinstance(e[0], str) and isinstance(e[1], list)
        and all(isinstance(s, int) and not isinstance(s, bool) and s > 0 for s in e[1]) for e in items)
    if not ok:
        raise ValueError("is not a JSON list of [tensor name, [positive sizes]]")
    return tuple((name, tuple(shape)) for name, shape in items)


# A field's annotation (without ``| None``) -> (SQLite storage classes it may have, conversion of the cell).
_SCALARS: dict[str, tuple[tuple[str, ...], Callable]] = {
    "str": (("text",), _text),
    "int": (("integer",), int),
    "float": (("real", "integer"), float),
    "bool": (("integer",), lambda v: _flag(v)),
    "dict": (("text",), _object),
    "tuple[str, ...]": (("text",), _strings),
    "tuple[int, ...]": (("text",), _spans),
    "tuple[tuple[str, tuple[int, ...]], ...]": (("text",), _layout),
}


def _flag(value: int) -> bool:
    if value not in (0, 1):
        raise ValueError(f"is {value!r}, not 0 or 1")
    return bool(value)


def _rule(annotation: str) -> tuple[bool, tuple[str, ...], Callable]:
    parts = [p.strip() for p in annotation.split("|")]
    optional = "None" in parts
    base = " | ".join(p for p in parts if p != "None")
    if base not in _SCALARS:  # a new field type: teach the reader its rule (it is never guessed)
        raise TypeError(f"no cell rule for the annotation {annotation!r}")
    return (optional, *_SCALARS[base])


def _cell(name: str, value, storage: str | bytes, annotation: str):
    optional, storages, convert = _rule(annotation)
    storage = storage.decode() if isinstance(storage, bytes) else storage
    if value is None:
        if optional:
            return None
        raise ValueError(f"column {name!r} is NULL")
    if storage not in storages:
        raise ValueError(f"column {name!r} holds {storage} where {' or '.join(storages)} belongs")
    try:
        out = convert(value)
    except ValueError as exc:
        raise ValueError(f"column {name!r} {exc}") from None
    if isinstance(out, float) and not math.isfinite(out):
        raise ValueError(f"column {name!r} is {out}, not a finite number")
    return out


def typed_rows(conn: sqlite3.Connection, cls: type, table: str, *, columns: Mapping[str, str] = {},
               where: tuple[str, tuple] | None = None, bad: list[str] | None = None) -> list:
    """Rows of ``table`` as ``cls``, in rowid order; ``columns`` maps a field to the SQL expression that reads it
    (older schemas). A row with a bad cell goes to ``bad`` as one line (``bad`` None: ``ValueError``)."""
    names = [f.name for f in fields(cls)]
    annotations = {f.name: f.type if isinstance(f.type, str) else f.type.__name__ for f in fields(cls)}
    selected = ", ".join(f"{columns.get(n, n)}, typeof({columns.get(n, n)})" for n in names)
    query = f"SELECT rowid, {selected} FROM {table}" + (f" WHERE {where[0]}" if where else "") + " ORDER BY rowid"
    out = []
    for raw in conn.execute(query, where[1] if where else ()):
        rowid, cells = raw[0], raw[1:]
        try:
            values = {n: _cell(n, cells[2 * k], cells[2 * k + 1], annotations[n]) for k, n in enumerate(names)}
            out.append(cls(**values))
        except ValueError as exc:
            if bad is None:
                raise
            bad.append(f"{table} row {rowid}: {exc}")
    return out


def _regular_size(path: Path) -> int | None:
    """The size of ``path`` if it is a regular file (not followed if a link); None if absent; else InputError."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return None
    if not stat.S_ISREG(info.st_mode):
        raise InputError(f"{str(path)!r} is not a regular file; refusing to read it")
    return info.st_size


@contextmanager
def open_for_reading(path: Path) -> Iterator[sqlite3.Connection]:
    """A read-only connection (text as bytes, decoded per cell); a private copy where SQLite needs to write."""
    conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
    try:
        conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
    except sqlite3.OperationalError:  # a WAL ledger in a read-only folder: read a copy instead
        conn.close()
        with tempfile.TemporaryDirectory(prefix="kfca-ledger-") as folder:
            copy = Path(folder) / "ledger.sqlite"
            _copy_regular(path, copy)
            wal = path.with_name(path.name + "-wal")
            if _regular_size(wal) is not None:
                _copy_regular(wal, copy.with_name(copy.name + "-wal"))
            conn = sqlite3.connect(f"{copy.as_uri()}?mode=ro", uri=True)
            try:
                conn.text_factory = bytes
                yield conn
            finally:
                conn.close()
        return
    try:
        conn.text_factory = bytes
        yield conn
    finally:
        conn.close()


def _copy_regular(source: Path, target: Path) -> None:
    fd = os.open(source, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO opens without a writer, then is refused
    with os.fdopen(fd, "rb") as src:
        if not stat.S_ISREG(os.fstat(src.fileno()).st_mode):
            raise InputError(f"{str(source)!r} is not a regular file; refusing to read it")
        with open(target, "wb") as dst:
            shutil.copyfileobj(src, dst)
