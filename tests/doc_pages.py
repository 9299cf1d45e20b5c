"""The user-facing pages (README.md and docs/*.md) as the tests read them: page text, fenced blocks, tables."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def page(name: str) -> str:
    """The text of a page by its path from the repository root, e.g. ``"docs/api.md"``."""
    return (ROOT / name).read_text()


def page_names() -> list[str]:
    """README.md and every docs page, as paths from the repository root."""
    return ["README.md", *sorted(f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md"))]


def fenced_blocks(text: str, language: str) -> list[str]:
    """The bodies of the text's fenced code blocks of one language (``""`` for blocks without one)."""
    blocks, body, opened = [], [], None
    for line in text.splitlines(keepends=True):
        if opened is None and line.startswith("```"):
            opened, body = line[3:].strip(), []
        elif opened is not None and line.strip() == "```":
            if opened == language:
                blocks.append("".join(body))
            opened = None
        elif opened is not None:
            body.append(line)
    return blocks


def one_block(name: str, language: str, marker: str) -> str:
    """The one ``language`` block of page ``name`` that contains ``marker``."""
    found = [b for b in fenced_blocks(page(name), language) if marker in b]
    assert len(found) == 1, f"expected one {language} block with {marker!r} in {name}, found {len(found)}"
    return found[0]


def markdown_table(text: str, header_start: str) -> list[list[str]]:
    """The body rows of the markdown table whose header line starts with ``header_start``, as stripped cells
    (``\\|`` inside a cell stays one cell)."""
    lines = text.splitlines()
    (start,) = [i for i, line in enumerate(lines) if line.startswith(header_start)]
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        cells = re.split(r"(?<!\\)\|", line.strip()[1:-1])
        rows.append([c.strip() for c in cells])
    return rows


def box_rows(text: str) -> list[list[str]]:
    """The body rows of a table as the CLI prints it (``│ a │ b │``), as stripped cells."""
    return [[c.strip() for c in line.strip().strip("│").split("│")] for line in text.splitlines()
            if line.startswith("│")]
