"""Text for people: tables and untrusted names made safe to print (the standard library and rich only, so
that commands which only read and print, like ``kfca-llm ledger``, start without torch or numba)."""

from __future__ import annotations

import io
from collections.abc import Sequence


def text_table(title: str, columns: Sequence[str], rows: Sequence[Sequence[str]],
               notes: Sequence[str] = (), width: int = 110) -> str:
    """A plain-text rich table (numbers right-aligned: every column but a name column) and notes."""
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    # Cells and notes are plain Text (client names come from users: no markup, no control characters).
    table = Table(title=Text(printable(title)))
    for k, column in enumerate(columns):
        table.add_column(column, justify="left" if k == 1 else "right")
    for row in rows:
        table.add_row(*(Text(printable(cell)) for cell in row))
    buffer = io.StringIO()
    console = Console(file=buffer, width=width, force_terminal=False, color_system=None)
    console.print(table)
    for note in notes:
        console.print(Text(printable(note, keep_newlines=True)))
    return buffer.getvalue().rstrip()


def printable(text: str, *, keep_newlines: bool = False) -> str:
    """``text`` with control characters (newlines, ANSI escapes) shown as Python escapes."""
    return "".join(ch if ch.isprintable() or (keep_newlines and ch == "\n") else ch.encode("unicode_escape").decode()
                   for ch in text)


QUOTED_CHARACTERS = 60
"""How much of an input an error line quotes back: enough to find it, never the whole of a 79,000-character text."""


def quoted(value: object, limit: int = QUOTED_CHARACTERS) -> str:
    """``repr(value)`` for an error line; a longer text as its first ``limit`` characters and its length."""
    if isinstance(value, str) and len(value) > limit:
        return f"{value[:limit]!r}... ({len(value):,} characters)"
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text):,} characters)"


def listed(names: Sequence[str], limit: int = 8) -> str:
    """``a, b, c`` for an error line; past ``limit`` names the first ones and how many more."""
    shown = ", ".join(quoted(name) if len(name) > QUOTED_CHARACTERS else name for name in names[:limit])
    return shown if len(names) <= limit else f"{shown} and {len(names) - limit:,} more"
