"""The test suite's two tiers, from a measured run: what `make test` (the fast tier) and `make test-slow` cost.

Run the whole suite once on a quiet machine with a JUnit report, then read it here:

    python -m pytest -q -n 2 -p no:cacheprovider --junitxml=suite.xml      # both tiers (plain pytest runs both)
    python benchmarks/suite_tiers.py suite.xml                              # each tier's seconds, the fast tier's slowest
    python benchmarks/suite_tiers.py suite.xml --write                      # list the tests over --seconds as slow

``tests/slow_tests.txt`` names the slow tier: a hand-kept section of the tests that start processes (the guard in
tests/conftest.py fails any other test that starts one), then a section this script writes, the tests that took
``--seconds`` or more (setup included: a module fixture is charged to its module's first test). The seconds are a
worker's wall seconds in one run: they order and sort, they are not a timing assertion.
"""

import argparse
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

from kfca_llm.report import write_atomic

REPOSITORY = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPOSITORY / "tests"))

from slow_tests import SLOW_TESTS, hand_kept, is_slow, read_entries, rewrite_measured  # noqa: E402


def measured_tests(junit: Path) -> dict[str, float]:
    """Node id -> seconds of every test case in a JUnit report (pytest's ``--junitxml``)."""
    seconds = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        module = case.get("classname").replace(".", "/") + ".py"
        seconds[f"{module}::{case.get('name')}"] = float(case.get("time") or 0.0)
    return seconds


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("junit", type=Path, help="a JUnit report of the whole suite (pytest --junitxml)")
    parser.add_argument("--seconds", type=float, default=1.5, help="a test this slow or slower goes to the slow tier")
    parser.add_argument("--write", action="store_true", help="rewrite the measured section of tests/slow_tests.txt")
    parser.add_argument("--top", type=int, default=15, help="how many of the fast tier's slowest tests to list")
    args = parser.parse_args(argv)

    seconds = measured_tests(args.junit)
    text = SLOW_TESTS.read_text(encoding="utf-8")
    if args.write:
        by_hand = read_entries(hand_kept(text))
        over = [test for test, took in seconds.items() if took >= args.seconds and not is_slow(test, by_hand)]
        text = rewrite_measured(text, over, args.seconds)
        write_atomic(SLOW_TESTS, text)  # an interrupted rewrite leaves the old list, not half of one
    entries = read_entries(text)
    fast = {test: took for test, took in seconds.items() if not is_slow(test, entries)}
    slow_total = sum(seconds.values()) - sum(fast.values())
    print(f"fast tier (make test): {len(fast)} tests, {sum(fast.values()):.0f} s of worker time")
    print(f"slow tier (make test-slow): {len(seconds) - len(fast)} tests, {slow_total:.0f} s of worker time")
    print(f"the fast tier's {args.top} slowest:")
    for test, took in sorted(fast.items(), key=lambda item: -item[1])[:args.top]:
        print(f"  {took:6.2f} s  {test}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
