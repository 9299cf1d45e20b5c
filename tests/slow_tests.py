"""The slow tier's list (``slow_tests.txt``): `make test` leaves these tests out, `make test-slow` runs them.

An entry is a node id (``tests/x.py::test_y[case]``), a test with all its cases (``tests/x.py::test_y``) or a whole
module (``tests/x.py``); ``#`` starts a comment. benchmarks/suite_tiers.py rewrites the measured section."""

from pathlib import Path

SLOW_TESTS = Path(__file__).with_name("slow_tests.txt")
MEASURED_HEADER = "# --- measured: SECONDS s or more in a quiet run (benchmarks/suite_tiers.py --write rewrites below) ---"


def read_entries(text: str) -> set[str]:
    return {line.split("#", 1)[0].strip() for line in text.splitlines()} - {""}


def is_slow(nodeid: str, entries: set[str]) -> bool:
    test = nodeid.split("[", 1)[0]
    return nodeid in entries or test in entries or test.split("::", 1)[0] in entries


def slow_entries() -> set[str]:
    return read_entries(SLOW_TESTS.read_text(encoding="utf-8"))
