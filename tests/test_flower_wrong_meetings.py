"""``benchmarks/flower_wrong_meetings.py``: on the captured run of ``test_flower_capture`` (a flipper among honest
nodes at two a round, within public strata, with settlements), what ranked each meeting of the flipper with an honest
node, as the replay pays it."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from flower_few_peers import flip_meetings  # noqa: E402
from flower_wrong_meetings import kinds, main, rulings  # noqa: E402
from test_flower_capture import captured_run  # noqa: E402


def test_each_meeting_is_ruled_by_what_ranked_it_where_its_pay_stands(tmp_path, capsys):
    path, _ = captured_run(tmp_path)
    out, last, first = rulings(path)
    meetings = flip_meetings(out["rounds"], {0: "flip"})
    settled = {(r["round"], int(p)) for r in out["rounds"] for p in r["settled"]}
    ruled = {m.round: last[(m.round, m.partner)] for m in meetings}
    assert len(meetings) >= 3 and set(r.rule for r in ruled.values()) <= {"judges", "trajectory", "lineage", "records",
                                                                           "agreeing"}
    for m in meetings:
        ruling = ruled[m.round]
        # the rounds after judge only a waiting pair, as it is settled: the pay that stands is the settlement's, and the
        # partner's place in it is the judges' (here they rank as they will: these updates never follow the global)
        assert (ruling.rule != "judges") or (ruling.held and ruling.horizon is not None
                                             and (m.round, m.partner) in settled
                                             and ruling.higher == (m.partner_paid > m.flipper_paid)), (m, ruling)
        assert ((m.round, m.partner) in settled) == (ruling.horizon is not None), (m, ruling)
    assert {r.rule for r in ruled.values()} >= {"judges"} and any(r.horizon is None for r in ruled.values())
    # as the round was scored, nothing had judged a pair yet; both sides of each in-round pair are seen
    assert all(r.rule != "judges" for _, _, _, r in first)
    assert {(t, p) for t, p, _, _ in first} == {(t, q) for t, _, q, _ in first}
    kind = kinds(out)
    assert {kind[(m.round, m.partner)] for m in meetings} == {"honest"}
    assert main([str(path)]) == 0
    printed = capsys.readouterr().out
    assert "meetings by ruling: {" in printed and "honest-flip pairs the trajectory ranked" in printed
