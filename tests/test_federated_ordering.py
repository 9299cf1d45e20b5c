"""The paper's attack-analysis ordering on the tiny federation (recipes/tiny.toml, seed 0), checked by
``kfca-llm check`` with its default expectations (recipes/expectations/paper-llm.toml), the command and file
a user's CI runs.

The tiny run is shared by the session (``tiny_federation`` in conftest.py). The file's margins are shares of the
run's honest reward h (about 0.18 here), which at this regime are what the regression has always used (a change
of torch numerics cannot cross them, a real regression does):

* honest beats every attack by more than 0.15 h (about 0.03; measured: 0.055 over sparse:0.75), and is paid;
* sparse:0.75 > sparse:0.5 > sparse:0.25 > 0 by more than 0.1 h (about 0.02; measured >= 0.05);
* lagged:2 >= lagged:5 >= stale may tie within 0.03 h (scored conditioned on the public trajectory, the default,
  the full chain lagged:2..5 no longer holds: lagged:3 lies inside the public steps), and lagged:2 earns at most
  0.6 h (measured 0.27 h; 0.49 h before the conditioning): a lag that runs backwards (the oldest for the shortest
  lag) or stops costing (a replay paid like a fresh update) fails;
* |zero|, |random| < 0.1 h (chance agreement, per-round noise about 0.005);
* flip < -0.5 x honest (KFCA pays a flipper the negative of the honest reward);
* the categorical-world condition for every honest pair in every round.

The doctored reports below prove the file is that strong: each moves one reward just past one margin (or
breaks one honest pair's delta in one round) and must fail exactly that expectation.
"""

import copy
import xml.etree.ElementTree as ET

import pytest

from kfca_llm.cli import main
from kfca_llm.report import write_json


@pytest.fixture(scope="module")
def report(tiny_federation):
    assert tiny_federation.recipe.num_server_rounds == 10
    return tiny_federation.to_report()


def check(report, folder, capsys, *extra):
    write_json(folder / "report.json", report)
    code = main(["check", str(folder), *extra])
    return code, capsys.readouterr().out


def test_paper_ordering_holds_on_the_tiny_run(report, tmp_path, capsys):
    code, out = check(report, tmp_path, capsys, "--junit", str(tmp_path / "junit.xml"))
    assert code == 0, out
    assert "10/10 expectations hold" in out and "seed 0" in out
    cases = ET.parse(tmp_path / "junit.xml").getroot().findall("testsuite/testcase")
    assert len(cases) == 10 and all(c.find("failure") is None for c in cases)


def shift_mean(report, spec, target):
    """Move every round's reward of ``spec`` by one amount so that its mean is ``target``."""
    entry = report["strategies"][spec]
    step = target - entry["mean_reward"]
    entry["per_round"] = [v + step for v in entry["per_round"]]
    entry["mean_reward"] = target


def mean(report, spec):
    return report["strategies"][spec]["mean_reward"]


H = 0.15  # "honest above every attack": margin 0.15 x honest
STEP = 0.1  # sparse steps, |zero| and |random|: 0.1 x honest
TIE = 0.03  # "older updates earn less": tolerance 0.03 x honest
LAG = 0.4  # "a lag costs reward": honest - lagged:2 above 0.4 x honest


def _honest(r):
    # honest - sparse:0.75 just below 0.15 x honest (honest moves the margin with it).
    shift_mean(r, "honest", mean(r, "sparse:0.75") / (1 - H) - 0.001)


def _sparse_step(r):
    shift_mean(r, "sparse:0.25", mean(r, "sparse:0.5") - 0.95 * STEP * mean(r, "honest"))


def _sparse_floor(r):
    shift_mean(r, "sparse:0.25", 0.95 * STEP * mean(r, "honest"))


def _lag_backwards(r):
    shift_mean(r, "lagged:5", mean(r, "lagged:2") + 1.05 * TIE * mean(r, "honest"))


def _lag_free(r):
    shift_mean(r, "lagged:2", (1 - 0.95 * LAG) * mean(r, "honest"))


def _free_rider(r):
    shift_mean(r, "free-ride:1", 1.05 * STEP * mean(r, "honest"))


def _zero(r):
    shift_mean(r, "zero", 1.05 * STEP * mean(r, "honest"))


def _random(r):
    shift_mean(r, "random", -1.05 * STEP * mean(r, "honest"))


def _flip(r):
    shift_mean(r, "flip", -0.49 * mean(r, "honest"))


def _categorical(r):
    pair = next(p for p in r["round_records"][6]["pairs"] if p["honest_pair"])
    pair["delta"][0][1] = 1e-4  # one honest pair, round 7: an off-diagonal entry above 0


@pytest.mark.parametrize("doctor, broken", [
    (_honest, "honest above every attack"),
    (_sparse_step, "sparse attacks interpolate"),
    (_sparse_floor, "sparse attacks interpolate"),
    (_lag_backwards, "older updates earn less"),
    (_lag_free, "a lag costs reward"),
    (_free_rider, "a free rider earns at most a tenth of honest"),
    (_zero, "zero earns nothing"),
    (_random, "random earns nothing"),
    (_flip, "flip is punished"),
    (_categorical, "categorical world"),
], ids=lambda v: v.__name__.strip("_") if callable(v) else None)
def test_a_report_just_past_a_margin_fails_that_expectation(report, tmp_path, capsys, doctor, broken):
    doctored = copy.deepcopy(report)
    doctor(doctored)
    code, out = check(doctored, tmp_path, capsys)
    assert code == 1
    assert [line.split(":")[0] for line in out.splitlines() if line.startswith("FAILED ")] == [f"FAILED {broken}"]
    assert "9/10 expectations hold" in out


FREE_RIDERS = ("free-ride:1", "free-ride:2", "free-ride-flip:1", "free-ride-noise:0.05", "free-ride-signs:1")


def test_the_free_riders_earn_at_most_a_tenth_of_honest_and_less_than_sparse(report):
    """The default run scores conditioned on the globals the server sent (kfca.public-steps): a free rider replaying
    them is paid about 0 (measured at most 2% of honest; with the steps a round late 35%, reversed 26%: the test
    fails when simulate hands scoring the wrong steps), and less than sparse:0.25, whose information is real."""
    honest = mean(report, "honest")
    for spec in FREE_RIDERS:
        assert abs(mean(report, spec)) <= 0.1 * honest, spec
        assert mean(report, spec) < mean(report, "sparse:0.25"), spec
    honest_rounds = [sum(r["honest_rewards"].values()) / len(r["honest_rewards"]) for r in report["round_records"]]
    assert min(honest_rounds) > 0


def test_the_shipped_free_rider_expectations_hold_on_the_tiny_run(report, tmp_path, capsys):
    code, out = check(report, tmp_path, capsys, "--expect", "free-riders")
    assert code == 0 and "4/4 expectations hold" in out, out
    doctored = copy.deepcopy(report)
    shift_mean(doctored, "free-ride:2", 0.11 * mean(report, "honest"))
    code, out = check(doctored, tmp_path, capsys, "--expect", "free-riders")
    assert code == 1 and "FAILED a longer replay too" in out
