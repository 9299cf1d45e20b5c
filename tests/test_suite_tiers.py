"""The suite's two tiers: tests/slow_tests.txt names the slow one, and outside it no test starts a process."""

import multiprocessing
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import refuse_processes
from slow_tests import MEASURED_HEADER, SLOW_TESTS, is_slow, read_entries, rewrite_measured, slow_entries

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))


def test_an_entry_names_a_case_a_test_with_all_its_cases_or_a_module():
    entries = read_entries("tests/a.py::test_b[1]  # a comment\n# tests/c.py\ntests/d.py::test_e\ntests/f.py\n")
    assert entries == {"tests/a.py::test_b[1]", "tests/d.py::test_e", "tests/f.py"}
    assert is_slow("tests/a.py::test_b[1]", entries) and not is_slow("tests/a.py::test_b[2]", entries)
    assert is_slow("tests/d.py::test_e[x-y]", entries) and is_slow("tests/d.py::test_e", entries)
    assert is_slow("tests/f.py::test_g[3]", entries)
    assert not is_slow("tests/d.py::test_eg", entries) and not is_slow("tests/ff.py::test_g", entries)


def test_every_slow_entry_names_a_test_that_exists():
    """A renamed test would silently leave the slow tier: each entry's module exists and defines its test."""
    for entry in slow_entries():
        module, _, test = entry.partition("::")
        path = ROOT / module
        assert path.is_file(), entry
        if test:
            name = test.split("[", 1)[0]
            assert re.search(rf"^def {name}\(", path.read_text(encoding="utf-8"), re.MULTILINE), entry


def test_outside_the_slow_tier_every_way_of_starting_a_process_fails_the_test_naming_it():
    starts = {
        "subprocess": lambda: subprocess.run([sys.executable, "-c", "pass"]),
        "multiprocessing spawn": lambda: multiprocessing.get_context("spawn").Process(target=print).start(),
        "os.fork": lambda: os.fork(),
        "os.system": lambda: os.system("true"),
    }
    for what, start in starts.items():
        with pytest.MonkeyPatch.context() as patch:
            refuse_processes(patch, "tests/x.py::test_y")
            with pytest.raises(pytest.fail.Exception) as failed:
                start()
        assert str(failed.value) == (f"tests/x.py::test_y starts a process ({what}); a test that starts processes is "
                                     "listed in tests/slow_tests.txt (`make test` leaves it to `make test-slow`)")


def test_this_module_runs_under_the_guard_and_a_listed_test_does_not(request):
    """The hook in conftest.py patches around every test outside the list (this one), not around a listed one."""
    assert request.node.get_closest_marker("slow") is None
    with pytest.raises(pytest.fail.Exception, match="test_this_module_runs_under_the_guard"):
        subprocess.run([sys.executable, "-c", "pass"])


def test_suite_tiers_rewrites_the_measured_section_and_keeps_the_hand_kept_one(tmp_path):
    import suite_tiers

    junit = tmp_path / "suite.xml"
    junit.write_text('<testsuites><testsuite><testcase classname="tests.test_a" name="test_b[1]" time="3.5"/>'
                     '<testcase classname="tests.flower.test_c" name="test_d" time="0.2"/></testsuite></testsuites>')
    assert suite_tiers.measured_tests(junit) == {"tests/test_a.py::test_b[1]": 3.5, "tests/flower/test_c.py::test_d": 0.2}
    text = "# hand\ntests/x.py\n\n" + MEASURED_HEADER.replace("SECONDS", "3") + "\ntests/old.py::test_gone\n"
    rewritten = rewrite_measured(text, ["tests/test_a.py::test_b[1]"], 1.5)
    assert read_entries(rewritten) == {"tests/x.py", "tests/test_a.py::test_b[1]"}
    assert "1.5 s or more" in rewritten and "3 s or more" not in rewritten
    assert rewritten.startswith("# hand\ntests/x.py\n")


def test_the_makefile_runs_one_tier_in_make_test_and_the_other_in_make_test_slow_and_ci_runs_both():
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    assert '$(BIN)/python -m pytest -q -n 2 -m "not slow"' in makefile
    assert "$(BIN)/python -m pytest -q -n 2 -m slow" in makefile
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    assert ci[-2:] == ["make test", "make test-slow"]
    assert SLOW_TESTS.read_text(encoding="utf-8").count(MEASURED_HEADER.split("SECONDS")[0]) == 1


def test_collection_marks_the_listed_tests_slow_and_only_them():
    from conftest import pytest_collection_modifyitems

    class Item:
        def __init__(self, nodeid):
            self.nodeid, self.marks = nodeid, []

        def add_marker(self, mark):
            self.marks.append(mark.name)

    listed, unlisted = sorted(slow_entries())[0], "tests/test_suite_tiers.py::test_collection_marks"
    items = [Item(listed + ("" if "::" in listed else "::test_any")), Item(unlisted)]
    pytest_collection_modifyitems(None, items)
    assert [item.marks for item in items] == [["slow"], []]
