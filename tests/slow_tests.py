"""The slow tier's list (``slow_tests.txt``): `make test` leaves these tests out, `make test-slow` runs them.

An entry is a node id (``tests/x.py::test_y[case]``), a test with all its cases (``tests/x.py::test_y``) or a whole
module (``tests/x.py``); ``#`` starts a comment. The list has two sections: the hand-kept one (the tests that start
processes), then the measured one, which benchmarks/suite_tiers.py rewrites from a JUnit report."""

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


def hand_kept(text: str) -> str:
    """The list's text before its measured section (whatever seconds that section's header names)."""
    return text.split(MEASURED_HEADER.split("SECONDS", 1)[0], 1)[0]


def rewrite_measured(text: str, slow: list[str], seconds: float) -> str:
    """The list's text with its measured section replaced by ``slow`` (the hand-kept section is kept as it is)."""
    kept = hand_kept(text).rstrip("\n")
    header = MEASURED_HEADER.replace("SECONDS", f"{seconds:g}")
    return "\n".join([kept, "", header, *sorted(slow), ""])
