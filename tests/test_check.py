"""kfca-llm check on hand-made reports: what an expectation measures, the table, failures, JUnit, exit status."""

import json
import xml.etree.ElementTree as ET

import pytest

from kfca_llm.check import check_runs
from kfca_llm.check_reports import load_runs
from kfca_llm.cli import main
from kfca_llm.errors import InputError
from kfca_llm.expectations import expectations_from_dict

HOLDS = [[0.1, -0.1], [-0.1, 0.1]]


def write_report(folder, seed, rewards, deltas=None, copies=None, own=None):
    """A report.json with these per-round strategy rewards; ``deltas[t]``: the honest pairs' deltas of round t;
    ``copies``: strategy -> the rounds it was found to copy an earlier submission; ``own``: strategy -> those of
    them it copied only its own client's earlier submissions (scored without the pool)."""
    rounds = len(next(iter(rewards.values())))
    deltas = deltas or [[HOLDS, HOLDS]] * rounds
    records = [{"round": t + 1, "pairs": [
        *({"client": f"client-{k:03d}", "peer": "client-009", "honest_pair": True, "delta": d, "payment": 0.1}
          for k, d in enumerate(round_deltas)),
        {"client": "client-000/flip", "peer": "client-001", "honest_pair": False, "delta": [[-1, 1], [1, -1]]}]}
        for t, round_deltas in enumerate(deltas)]
    report = {"domain": "general-nlp", "recipe": "hand", "seed": seed, "rounds": rounds,
              "strategies": {s: {"mean_reward": sum(v) / len(v), "per_round": v,
                                 **({"copy_rounds": copies[s]} if s in (copies or {}) else {}),
                                 **({"own_resubmission_rounds": own[s]} if s in (own or {}) else {})}
                             for s, v in rewards.items()},
              "round_records": records}
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "report.json").write_text(json.dumps(report))
    return folder / "report.json"


def check(expect, *reports):
    return check_runs(expectations_from_dict({"expect": expect, "name": "mine"}), load_runs(reports))


def one(expect, **rewards):
    """The outcome of one expectation on one hand-made run (in a fresh temporary folder)."""
    return check([expect], write_report(one.tmp / "run", 0, rewards)).outcomes[0]


@pytest.fixture(autouse=True)
def _tmp(tmp_path):
    one.tmp = tmp_path


@pytest.mark.parametrize("expect, rewards, gap, holds", [
    ({"check": "a > b", "margin": 0.1}, {"a": [0.3], "b": [0.1]}, 0.2, True),
    ({"check": "a > b", "margin": 0.25}, {"a": [0.5], "b": [0.25]}, 0.25, False),  # strict: equal is not above
    ({"check": "a > b", "tolerance": 0.01}, {"a": [0.3], "b": [0.305]}, -0.005, True),
    ({"check": "a > b", "tolerance": 0.01}, {"a": [0.3], "b": [0.32]}, -0.02, False),
    ({"check": "a > b > c", "margin": 0.0}, {"a": [0.3], "b": [0.2], "c": [0.25]}, -0.05, False),
    ({"check": "|z| < 0.02"}, {"z": [-0.03, 0.01]}, 0.01, True),  # |mean|, not mean of |.|
    ({"check": "|z| < 0.02"}, {"z": [-0.03, -0.01]}, -0.0, False),
    ({"check": "f < -0.5 x h"}, {"f": [-0.2], "h": [0.3]}, 0.05, True),
    ({"check": "f < -0.5 x h"}, {"f": [-0.1], "h": [0.3]}, -0.05, False),
    ({"check": "h > *", "margin": 0.03}, {"h": [0.3], "x": [0.2], "y": [0.28]}, 0.02, False),
    ({"check": "h > *", "margin": 0.01}, {"h": [0.3], "x": [0.2], "y": [0.28]}, 0.02, True),
    ({"check": "a > b"}, {"a": [0.3, float("nan")], "b": [0.1, 0.1]}, float("nan"), False),
    ({"check": "c < b < a"}, {"a": [float("nan")], "b": [0.2], "c": [0.1]}, float("nan"), False),  # NaN is worst
])
def test_gap_and_margin(expect, rewards, gap, holds):
    outcome = one(expect, **rewards)
    measured = outcome.runs[0]
    assert measured.gap == pytest.approx(gap, nan_ok=True) and measured.holds == holds == outcome.passed


def test_mean_over_rounds_or_every_round_from_a_round():
    rewards = {"a": [0.1, 0.5, 0.5], "b": [0.2, 0.1, 0.1]}
    assert one({"check": "a > b"}, **rewards).passed
    failed = one({"check": "a > b", "over": "every-round"}, **rewards)
    assert not failed.passed and [b.round for b in failed.runs[0].breaches] == [1]
    assert one({"check": "a > b", "over": "every-round", "from-round": 2}, **rewards).passed
    assert not one({"check": "a > b", "from-round": 1}, a=[0.1, 0.5], b=[0.2, 0.5]).passed
    assert one({"check": "a > b", "from-round": 3}, **rewards).runs[0].gap == pytest.approx(0.4)


def test_from_round_beyond_the_run_is_bad_input():
    with pytest.raises(InputError, match="starts at round 4"):
        one({"check": "a > b", "from-round": 4}, a=[0.1], b=[0.0])


def test_categorical_world_reads_every_honest_pair(tmp_path):
    broken = [[0.1, 0.02], [-0.1, 0.1]]  # an off-diagonal entry above 0
    good = write_report(tmp_path / "good", 0, {"h": [0.1, 0.1]})
    bad = write_report(tmp_path / "bad", 1, {"h": [0.1, 0.1]}, deltas=[[HOLDS, HOLDS], [HOLDS, broken]])
    outcome = check([{"check": "categorical-world", "over": "every-round"}], good, bad).outcomes[0]
    assert [m.holds for m in outcome.runs] == [True, False] and not outcome.passed
    (breach,) = outcome.runs[1].breaches
    assert breach.round == 2 and "delta(client-001, client-009)" in breach.left
    assert (breach.left_value, breach.right_value, breach.gap) == (0.1, 0.02, -0.02)
    # a margin demands more than the signs; the attack pair (not honest) is never read
    assert outcome.runs[0].gap == pytest.approx(0.1)
    assert not check([{"check": "categorical-world", "margin": 0.1}], good).passed
    nan = write_report(tmp_path / "nan", 2, {"h": [0.1]}, deltas=[[[[0.1, float("nan")], [-0.1, 0.1]]]])
    assert not check([{"check": "categorical-world"}], nan).passed  # a NaN entry never holds


def test_seeds_all_or_a_quantile(tmp_path):
    runs = [write_report(tmp_path / f"s{s}", s, {"a": [a], "b": [0.0]}) for s, a in enumerate([0.3, -0.1, 0.2])]
    assert not check([{"check": "a > b"}], *runs).passed
    assert check([{"check": "a > b", "seeds": 0.5}], *runs).passed  # the median seed
    assert not check([{"check": "a > b", "seeds": 0.0}], *runs).passed  # the worst seed
    outcome = check([{"check": "a > b", "seeds": 0.5, "margin": 0.25}], *runs).outcomes[0]
    assert outcome.quantile_gap == pytest.approx(0.2) and not outcome.passed
    # the quantile is one seed's own gap (numpy's 'lower'), never an interpolation between two seeds
    runs.append(write_report(tmp_path / "s3", 3, {"a": [-0.05], "b": [0.0]}))
    outcome = check([{"check": "a > b", "seeds": 0.5}], *runs).outcomes[0]
    assert outcome.quantile_gap == pytest.approx(-0.05) and not outcome.passed


def test_failure_names_seed_rounds_values_margin_and_figure(tmp_path):
    run = write_report(tmp_path / "run", 7, {"honest": [0.3, 0.3, 0.3], "sparse:0.5": [0.2, 0.29, 0.28]})
    (tmp_path / "run" / "rewards.png").write_bytes(b"png")
    result = check([{"name": "honest first", "check": "honest > *", "margin": 0.03, "over": "every-round"},
                    {"name": "on the mean", "check": "honest > sparse:0.5", "margin": 0.06}], run)
    every_round, mean = (result.failure_text(o) for o in result.outcomes)
    assert f"seed 7 ({run})" in every_round
    assert "round 2: honest = +0.3000, sparse:0.5 = +0.2900: gap +0.0100 is not above the margin +0.03" in every_round
    assert "round 3: honest = +0.3000, sparse:0.5 = +0.2800: gap +0.0200" in every_round
    assert "round 1:" not in every_round
    assert f"figure: {tmp_path / 'run' / 'rewards.png'}\n" in every_round + "\n"
    assert "mean over rounds: honest = +0.3000, sparse:0.5 = +0.2567: gap +0.0433" in mean
    assert "(broken on its own in rounds 2, 3)" in mean
    table = result.table()
    assert "FAILED honest first" in table and "0/2 expectations hold" in table


def test_cli_exit_status_table_and_junit(tmp_path, capsys):
    good = write_report(tmp_path / "a", 0, {"honest": [0.3], "zero": [0.0]})
    bad = write_report(tmp_path / "b", 1, {"honest": [0.3], "zero": [0.05]})
    expect = tmp_path / "mine.toml"
    expect.write_text('[[expect]]\nname = "honest first"\ncheck = "honest > *"\nmargin = 0.1\n'
                      '[[expect]]\ncheck = "|zero| < 0.02"\n')
    junit = tmp_path / "out" / "junit.xml"
    assert main(["check", str(tmp_path / "a"), "--expect", str(expect), "--junit", str(junit)]) == 0
    out = capsys.readouterr().out
    assert "2/2 expectations hold" in out and "seed 0" in out
    cases = ET.parse(junit).getroot().findall("testsuite/testcase")
    assert [c.get("name") for c in cases] == ["honest first", "|zero| < 0.02"]
    assert all(c.find("failure") is None for c in cases)

    assert main(["check", str(good), str(tmp_path / "b"), "--expect", str(expect), "--junit", str(junit)]) == 1
    out = capsys.readouterr().out
    assert "1/2 expectations hold" in out and "FAILED |zero| < 0.02" in out
    root = ET.parse(junit).getroot()
    suite = root.find("testsuite")
    assert (root.tag, root.get("tests"), root.get("failures")) == ("testsuites", "2", "1")
    assert (suite.get("tests"), suite.get("failures"), suite.get("errors"), suite.get("skipped")) == ("2", "1", "0", "0")
    failed = [c for c in suite.findall("testcase") if c.find("failure") is not None]
    assert [c.get("name") for c in failed] == ["|zero| < 0.02"]
    failure = failed[0].find("failure")
    assert failure.get("message").startswith("FAILED |zero| < 0.02") and f"seed 1 ({bad})" in failure.text
    assert "seed 0: smallest gap +0.0200" in failed[0].find("system-out").text
    assert {p.get("name"): p.get("value") for p in suite.iter("property")} == {"seed 0": str(good), "seed 1": str(bad)}
    assert sorted(p.name for p in junit.parent.iterdir()) == ["junit.xml"]  # written atomically, no leftovers


def test_junit_is_valid_xml_whatever_the_report_names(tmp_path):
    hostile = "evil\x00\x1b[31m<&>\ud800"
    run = write_report(tmp_path / "r", 0, {"honest": [0.3], hostile: [0.4]})
    result = check([{"check": "honest > *", "name": "honest \x07 first"}], run)
    root = ET.fromstring(result.junit_xml())  # parses: no raw control character reached the XML
    assert "evil\\x00" in root.find("testsuite/testcase/failure").text
    assert "\x1b" not in result.table()


def test_runs_sharing_a_seed_get_distinct_columns(tmp_path):
    runs = [write_report(tmp_path / name, 0, {"a": [0.1], "b": [0.0]}) for name in ("x", "y")]
    assert check([{"check": "a > b"}], *runs).labels == ["seed 0 (x)", "seed 0 (y)"]


@pytest.mark.parametrize("content, message", [
    ("not json", "cannot be read as JSON"),
    ('{"seed": 0, "rounds": 1, "strategies": {"a": {"per_round": ["0.1"]}}}', "strategies.a.per_round.0"),
    ('{"seed": 0, "rounds": 2, "strategies": {"a": {"per_round": [0.1]}}}', "1 per-round rewards for 2 rounds"),
    ('{"seed": 0, "rounds": 1, "strategies": {}}', "no strategies"),
    ('{"seed": 0, "rounds": 1, "strategies": {"a": {"per_round": [0.1]}}, "round_records": []}', "0 round records"),
    ('{"seed": 0, "rounds": 1, "strategies": {"a": {"per_round": [0.1]}}, "round_records": [{"pairs": ['
     '{"client": "c", "peer": "p", "honest_pair": true, "delta": [[1, 2, 3]]}]}]}', "not a square matrix"),
    ('{"seed": 0, "rounds": 1, "strategies": {"b": {"per_round": [0.1]}}}', "has no strategy 'a'"),
])
def test_bad_reports_are_bad_input(tmp_path, capsys, content, message):
    (tmp_path / "report.json").write_text(content)
    expect = tmp_path / "e.toml"
    expect.write_text('[[expect]]\ncheck = "a > 0"\n')
    assert main(["check", str(tmp_path), "--expect", str(expect)]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


@pytest.mark.parametrize("args, message", [
    ([], "nothing to check"),
    (["{run}", "--recipe", "tiny"], "not both"),
    (["{run}", "--seeds", "0,1"], "not both"),
    (["{tmp}/missing"], "no report"),
    (["{tmp}/empty"], "holds no report.json nor summary.json"),
    (["{tmp}/outside"], "must list report paths inside"),
    (["{run}", "--junit", "{tmp}"], "is not a regular file"),
    (["--recipe", "tiny", "--seeds", "0", "--attacks", "honest,flip"], "recipe 'tiny' has no strategy 'sparse:0.75'"),
    (["{run}", "--dry-run"], "give --recipe or --seeds"),
    (["--recipe", "tiny", "--seeds", "0", "--attacks", "honest,flip", "--dry-run"], "has no strategy 'sparse:0.75'"),
])
def test_bad_arguments_are_bad_input(tmp_path, capsys, monkeypatch, args, message):
    monkeypatch.chdir(tmp_path)  # where a run would go (runs/...)
    run = write_report(tmp_path / "run", 0, {"honest": [0.3]}).parent
    (tmp_path / "empty").mkdir()
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "summary.json").write_text(json.dumps({"runs": {"0": "../run/report.json"}}))
    args = [a.format(run=run, tmp=tmp_path) for a in args]
    assert main(["check", *args]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()  # nothing ran


def test_junit_is_replaced_atomically(tmp_path, monkeypatch):
    import os

    run = write_report(tmp_path / "run", 0, {"zero": [0.0]})
    expect = tmp_path / "e.toml"
    expect.write_text('[[expect]]\ncheck = "|zero| < 0.02"\n')
    junit = tmp_path / "junit.xml"
    junit.write_text("previous")

    def fail(*args):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", fail)  # the last step of an atomic write fails
    with pytest.raises(OSError, match="disk full"):
        main(["check", str(run), "--expect", str(expect), "--junit", str(junit)])
    assert junit.read_text() == "previous"  # readers never see a torn file
    assert sorted(p.name for p in tmp_path.iterdir()) == ["e.toml", "junit.xml", "run"]  # no temporary left


def test_strategies_that_submit_the_same_update_in_every_round_are_not_measurable_on_the_run(tmp_path, capsys):
    """lagged:2 replays round 1 until round 3, as stale does: on 3 rounds the two submit the same update in every
    round (equal rewards, by construction); the link needs a 4-round run. Nothing else failed: exit 2."""
    short = write_report(tmp_path / "short", 0, {"honest": [0.3, 0.3, 0.3], "lagged:2": [0.3, 0.2, 0.2],
                                                 "stale": [0.3, 0.2, 0.2]})
    outcome = check([{"check": "lagged:2 > stale", "margin": 0.02}], short).outcomes[0]
    assert (outcome.passed, outcome.failed, outcome.needs_rounds) == (False, False, 4)
    assert outcome.runs[0].holds and outcome.runs[0].unmeasured[0].rounds == (1, 3)
    # a tolerance lets neighbours tie: equal submissions meet it (the shipped lag chain on a 6-round run)
    assert check([{"check": "lagged:2 > stale", "tolerance": 0.002}], short).passed
    # the links that can be measured still are: honest vs the replays of round 1 differ from round 2 on
    assert check([{"check": "honest > *", "margin": 0.05}], short).passed
    assert check([{"check": "honest > *", "from-round": 1}], write_report(tmp_path / "one", 0, {
        "honest": [0.3], "stale": [0.3]})).outcomes[0].needs_rounds == 2
    assert check([{"check": "lagged:2 > stale", "over": "every-round", "from-round": 4}], write_report(
        tmp_path / "five", 0, {"lagged:2": [0.3] * 5, "stale": [0.3, 0.3, 0.3, 0.2, 0.2]})).passed

    expect = tmp_path / "mine.toml"
    expect.write_text('[[expect]]\nname = "a lag costs reward"\ncheck = "lagged:2 > stale"\nmargin = 0.02\n'
                      '[[expect]]\ncheck = "honest > 0"\n')
    junit = tmp_path / "junit.xml"
    assert main(["check", str(short), "--expect", str(expect), "--junit", str(junit)]) == 2
    out = capsys.readouterr().out
    assert "is not measurable on this run; it needs a run of at least 4 rounds" in out and "FAIL" not in out
    assert "lagged:2 > stale: both submit the same update (one honest round replayed) in every round 1-3" in out
    assert "1/2 expectations hold, 1 not measurable on these runs" in out
    suite = ET.parse(junit).getroot().find("testsuite")
    assert (suite.get("failures"), suite.get("skipped")) == ("0", "1")
    (skipped,) = [c for c in suite.findall("testcase") if c.find("skipped") is not None]
    assert skipped.get("name") == "a lag costs reward" and "at least 4 rounds" in skipped.find("skipped").get("message")

    # a measured failure beside it still fails the check (exit 1), and a long enough run measures the link
    expect.write_text(expect.read_text().replace("honest > 0", "honest > 0.5"))
    assert main(["check", str(short), "--expect", str(expect)]) == 1
    assert "FAILED honest > 0.5" in capsys.readouterr().out
    long = write_report(tmp_path / "long", 0, {"honest": [0.3] * 4, "lagged:2": [0.3, 0.2, 0.2, 0.2],
                                               "stale": [0.3, 0.2, 0.2, 0.2]})
    outcome = check([{"check": "lagged:2 > stale", "margin": 0.02}], long).outcomes[0]
    assert outcome.failed and outcome.needs_rounds is None


def test_a_relative_margin_is_a_share_of_the_runs_own_mean_reward(tmp_path):
    """``0.15 x honest`` on a run paid at three of six (honest 0.2: margin 0.03) and on one paid a fifth of that
    (honest 0.04: margin 0.006): the same ordering holds on both, and a gap below the share fails on either."""
    big = write_report(tmp_path / "big", 0, {"honest": [0.1, 0.3], "x": [0.1, 0.25]})   # gap 0.025 < 0.03
    small = write_report(tmp_path / "small", 1, {"honest": [0.04, 0.04], "x": [0.03, 0.03]})  # gap 0.01 > 0.006
    expect = [{"check": "honest > *", "margin": "0.15 x honest"}]
    outcome = check(expect, big, small).outcomes[0]
    assert [m.need for m in outcome.runs] == pytest.approx([0.03, 0.006])
    assert [m.holds for m in outcome.runs] == [False, True] and outcome.failed
    result = check(expect, big)
    assert "gap +0.0250 is not above the margin 0.15 x honest = +0.0300" in result.failure_text(result.outcomes[0])
    assert "0.15 x honest" in result.table()
    # the magnitude of the mean: a mechanism that pays honest clients a negative mean gets no slack from it
    assert check([{"check": "x > y", "margin": "0.5 x honest"}], write_report(
        tmp_path / "neg", 2, {"honest": [-0.2], "x": [0.05], "y": [0.0]})).outcomes[0].runs[0].need == 0.1
    # a tolerance alike, from the rounds read only
    tie = check([{"check": "a > b", "tolerance": "0.1 x honest", "from-round": 2}], write_report(
        tmp_path / "tie", 3, {"honest": [1.0, 0.2], "a": [0.0, 0.1], "b": [0.0, 0.115]})).outcomes[0]
    assert tie.runs[0].need == pytest.approx(-0.02) and tie.passed
    with pytest.raises(InputError, match="no strategy 'honest'"):
        check([{"check": "x > 0", "margin": "0.1 x honest"}], write_report(tmp_path / "no", 4, {"x": [1.0]}))


def test_rounds_in_which_both_strategies_were_paid_as_copies_are_left_out_of_the_link(tmp_path, capsys):
    """Copies paid under the duplicate policy (a report written before own resubmissions were scored without the
    pool listed the analysis client's replays so, round 2 on): lagged:2 and stale were both paid nothing but their
    fines, which is no order of lags. Those rounds are left out of the link: a margin has nothing left to measure
    (not measurable, exit 2, whatever the run's length), a tolerance a tie; a link with one side not a copy is
    measured in every round."""
    rewards = {"honest": [0.3, 0.05, 0.05, 0.05, 0.05], "lagged:2": [0.3, 0.0, 0.0, -0.01, 0.0],
               "lagged:3": [0.3, 0.0, 0.0, -0.03, -0.02], "stale": [0.3, 0.0, 0.0, 0.0, 0.0]}
    replays = {"lagged:2": [2, 3, 4, 5], "lagged:3": [2, 3, 4, 5], "stale": [2, 3, 4, 5]}
    run = write_report(tmp_path / "pool", 0, rewards, copies=replays)
    lag = check([{"check": "lagged:2 > stale", "margin": "0.1 x honest"}], run).outcomes[0]
    assert (lag.passed, lag.failed, lag.needs_rounds, lag.verdict()) == (False, False, None,
                                                                          "not measurable: both paid as copies")
    assert check([{"check": "lagged:2 > lagged:3 > stale", "tolerance": "0.01 x honest"}], run).passed
    assert check([{"check": "honest > *", "margin": "0.15 x honest"}], run).passed
    # without the copy rounds the same rewards are measured, and the fines' order breaks the chain
    plain = write_report(tmp_path / "plain", 0, rewards)
    assert check([{"check": "lagged:2 > lagged:3 > stale", "tolerance": "0.01 x honest"}], plain).outcomes[0].failed
    assert check([{"check": "lagged:2 > stale", "margin": "0.1 x honest"}], plain).outcomes[0].failed
    # one round in which only one side was a copy is measured as any round
    partly = write_report(tmp_path / "partly", 0, rewards, copies={**replays, "lagged:2": [2, 3, 5]})
    assert check([{"check": "lagged:2 > stale", "margin": "0.1 x honest"}], partly).outcomes[0].failed

    expect = tmp_path / "lag.toml"
    expect.write_text('[[expect]]\nname = "a lag costs reward"\ncheck = "lagged:2 > stale"\nmargin = "0.1 x honest"\n')
    assert main(["check", str(run), "--expect", str(expect)]) == 2
    out = capsys.readouterr().out
    assert "is not measurable on this run; no run length changes that" in out and "FAIL" not in out
    assert ("lagged:2 > stale: in every round 1-5 both submit the same update or both are paid as copies of earlier "
            "submissions") in out


def test_own_resubmissions_are_copies_scored_on_the_rounds_peers_and_keep_their_order(tmp_path):
    """Today's reports: the analysis client's replays are copies (``copy_rounds``) of its own earlier updates
    (``own_resubmission_rounds``), scored without the pool on the round's peers: every round is read, and the
    lag ordering is measured (it holds here, and breaks where the replays' rewards break it)."""
    replays = {"lagged:2": [2, 3, 4, 5], "stale": [2, 3, 4, 5]}
    rewards = {"honest": [0.3, 0.3, 0.3, 0.3, 0.3], "lagged:2": [0.3, 0.3, 0.2, 0.15, 0.15],
               "stale": [0.3, 0.3, 0.05, 0.0, -0.02]}
    own = write_report(tmp_path / "own", 0, rewards, copies=replays, own=replays)
    lag = check([{"check": "lagged:2 > stale", "margin": "0.1 x honest"}], own).outcomes[0]
    assert lag.passed and lag.runs[0].gap == pytest.approx((1.1 - 0.63) / 5) and lag.runs[0].need == pytest.approx(0.03)
    assert load_runs([own])[0].copies == {}
    # one round paid as a copy of another's entry (round 5 of both) is left out; the other rounds are read
    paid = write_report(tmp_path / "paid", 0, rewards, copies=replays, own={s: [2, 3, 4] for s in replays})
    assert load_runs([paid])[0].copies == {s: frozenset({5}) for s in replays}
    swapped = {**rewards, "stale": rewards["lagged:2"], "lagged:2": rewards["stale"]}
    assert check([{"check": "lagged:2 > stale", "margin": "0.1 x honest"}],
                 write_report(tmp_path / "swapped", 0, swapped, copies=replays, own=replays)).outcomes[0].failed


def test_dry_run_takes_simulates_options_and_plans_the_runs_without_running_them(tmp_path, capsys, monkeypatch):
    """docs/ci-check.md: --recipe and --seeds take every simulate option, --dry-run and --seed among them."""
    monkeypatch.chdir(tmp_path)
    assert main(["check", "--recipe", "tiny", "--seeds", "0,1", "--rounds", "6", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert out.count("recipe 'tiny' (general-nlp)") == 1 and "6 rounds" in out
    assert main(["check", "--seed", "4", "--dry-run"]) == 0
    assert "seed 4" in capsys.readouterr().out
    assert not (tmp_path / "runs").exists()
