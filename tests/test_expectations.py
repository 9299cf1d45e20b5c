"""Expectations files (kfca_llm.expectations): the check grammar and the TOML validation."""

import pytest

from kfca_llm.cli import main
from kfca_llm.expectations import (ExpectationError, Term, expectations_from_dict, load_expectations, parse_check,
                                   resolve_expectations_path)


def entry(**keys):
    return expectations_from_dict({"expect": [{"check": "honest > 0", **keys}]}).expect[0]


def test_shipped_default_is_the_papers_ordering():
    expectations = load_expectations()
    assert expectations.name == "paper-llm"
    checks = {e.title: (e.check, e.margin, e.tolerance, e.over) for e in expectations.expect}
    assert checks["honest above every attack"] == ("honest > *", "0.15 x honest", 0.0, "mean")
    assert checks["categorical world"] == ("categorical-world", 0.0, 0.0, "every-round")
    assert resolve_expectations_path("paper-llm") == resolve_expectations_path(None)


@pytest.mark.parametrize("text, terms, descending", [
    ("sparse:0.75 > sparse:0.5>sparse:0.25 > 0",
     [Term("sparse:0.75"), Term("sparse:0.5"), Term("sparse:0.25"), Term(constant=0.0)], True),
    ("|zero| < 0.02", [Term("zero", absolute=True), Term(constant=0.02)], False),
    ("flip < -0.5 x honest", [Term("flip"), Term("honest", scale=-0.5)], False),
    ("honest > *", [Term("honest"), Term("*")], True),
    ("collude:a > 2.5e-3*my_attack", [Term("collude:a"), Term("my_attack", scale=0.0025)], True),
])
def test_check_grammar(text, terms, descending):
    chain = parse_check(text)
    assert list(chain.terms) == terms and chain.descending == descending
    assert parse_check(str(chain)) == chain  # the printed form reads back


def test_categorical_world_is_a_check_of_its_own():
    assert parse_check(" categorical-world ") is None


@pytest.mark.parametrize("text, message", [
    ("honest", "not a chain"),
    ("honest > flip < zero", "mixes '>' and '<'"),
    ("honest >= flip", "every link is strict"),
    ("1 > 0", "numbers only"),
    ("* > honest > *", "more than one '*'"),
    ("honest > fl ip", "term 'fl ip'"),
    ("honest > inf x flip", "term 'inf x flip'"),
])
def test_bad_checks_are_refused_with_the_reason(text, message):
    with pytest.raises(ExpectationError, match=r"#1: key 'check': .*" + message.replace("*", r"\*")):
        entry(check=text)


@pytest.mark.parametrize("keys, message", [
    ({"margn": 0.1}, "unknown key 'margn'; did you mean margin?"),
    ({"from_round": 2}, "unknown key 'from_round'; did you mean from-round?"),
    ({"margin": "0.1"}, "key 'margin'"),
    ({"margin": "-0.1 x honest"}, "key 'margin': must be a number >= 0 or 'K x STRATEGY' with K >= 0"),
    ({"tolerance": "honest"}, "key 'tolerance': must be a number >= 0 or 'K x STRATEGY'"),
    ({"margin": "0.1 x honest", "tolerance": "0.01 x honest"}, "give a margin or a tolerance, not both"),
    ({"margin": True}, "key 'margin'"),
    ({"margin": -0.1}, "key 'margin'"),
    ({"margin": float("inf")}, "key 'margin': must be a finite number"),
    ({"tolerance": float("nan")}, "key 'tolerance': must be a finite number"),
    ({"margin": 0.1, "tolerance": 0.1}, "give a margin or a tolerance, not both"),
    ({"over": "median"}, "key 'over': Input should be 'mean' or 'every-round'"),
    ({"seeds": 1.5}, "key 'seeds'"),
    ({"seeds": "most"}, "key 'seeds'"),
    ({"from-round": 0}, "key 'from-round'"),
    ({"check": 3}, "key 'check'"),
])
def test_bad_keys_are_refused_naming_entry_and_key(keys, message):
    with pytest.raises(ExpectationError, match="#1: " + message.replace("?", r"\?").replace("(", r"\(")):
        entry(**keys)


def test_integers_are_numbers_and_quantiles_are_accepted():
    e = entry(margin=1, seeds=0.5, **{"from-round": 3})
    assert e.margin == 1.0 and e.seeds == 0.5 and e.from_round == 3
    assert entry(tolerance=0.002).gap_needed() == -0.002
    relative = entry(margin="0.15x honest")  # written back as the table shows it
    assert (relative.margin, relative.scale_strategy, relative.margin_text()) == ("0.15 x honest", "honest", "0.15 x honest")
    assert relative.gap_needed(lambda strategy: -0.2) == pytest.approx(0.03)  # the magnitude of the mean


@pytest.mark.parametrize("table, message", [
    ({}, "key 'expect' is required"),
    ({"expect": []}, "key 'expect'"),
    ({"expects": []}, "unknown key 'expects'; did you mean expect?"),
    ({"expect": [{"margin": 0.1}]}, r"#1: key 'check' is required"),
    ({"expect": [{"check": "a > b"}, {"check": "a > b"}]}, "two expectations are named 'a > b'"),
])
def test_bad_files_are_refused(table, message):
    with pytest.raises(ExpectationError, match=message):
        expectations_from_dict(table)


def test_a_bad_file_is_one_line_and_exit_2(tmp_path, capsys):
    bad = tmp_path / "mine.toml"
    bad.write_text('[[expect]]\ncheck = "honest > *"\nmargn = 0.03\n')
    assert main(["check", str(tmp_path), "--expect", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"kfca-llm: error: {bad}: [[expect]] #1: unknown key 'margn'; did you mean margin?"
    bad.write_text("[[expect]\n")
    assert main(["check", str(tmp_path), "--expect", str(bad)]) == 2
    assert "not valid TOML" in capsys.readouterr().err
    assert main(["check", str(tmp_path), "--expect", "no-such-file"]) == 2
    assert "shipped: free-riders, paper-llm" in capsys.readouterr().err
