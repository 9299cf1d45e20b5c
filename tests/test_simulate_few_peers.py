"""``kfca-llm simulate`` at two clients per round, the analysis client beside an attacker in every round: the run
finishes (delta.png with no pair of honest updates used to crash ``plots.plot_delta``), the pool is used and the
first rounds are marked undetermined in report.json and the table; the analysis client's replays of its own
earlier updates (``stale``, ``lagged:2``) are pool copies, own resubmissions scored without the pool as a real
resubmission is (on the round's one peer, beside the pool's term at 0), as at 20 x 0.1 (issue 27: the attack analysis' hypothetical submissions
pass the pool's copy detection; 4 clients x 0.5 is the same two-per-round regime at a tenth of the cost)."""

import json
import shutil

import pytest
from helpers import TINY

from kfca_llm.cli import main
from kfca_llm.fl.peer_pool import PoolSettings
from kfca_llm.fl.state import round_dir

FAST = ["--no-progress", "--set", "train.training-arguments.max-steps=2"]


def test_two_clients_per_round_one_an_attacker_runs_to_the_end_with_the_pool(tmp_path, capsys):
    out = tmp_path / "run"
    # 4 clients x 0.5: the analysis client 0 and one of clients 1-3, all fixed attackers.
    assert main(["simulate", "--rounds", "4", "--attacks", "honest,flip,stale,lagged:2", "--set", "num-clients=4",
                 "--set", "strategy.fraction-train=0.5", "--set", 'kfca.attackers=["1=flip", "2=zero"]',
                 *FAST, "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    report = json.loads((out / "report.json").read_text())
    assert (out / "delta.png").stat().st_size > 0
    # Only round 2 (clients 0 and 3) had a pair of honest updates: the other rounds' delta is None, and drawn.
    assert report["delta"][1] is not None and [report["delta"][t] for t in (0, 2, 3)] == [None] * 3
    assert report["undetermined_rounds"] == [1, 2, 3, 4]
    records = report["round_records"]
    assert records[0]["undetermined"] == sorted(records[0]["clients"]) and records[0]["pool_peers"] == {}
    # Round 3: client 0's one in-round peer is the zero node, whose zeros report one sign on every task: no peer
    # (pool rule 10), so client 0 rests on the pool alone, whose verdict is unclear: undetermined, not paid the noise.
    assert records[2]["clients"] == ["client-000", "client-002"] and records[2]["undetermined"] == ["client-000"]
    assert records[3]["pool_peers"]["client-000"]
    # Round 4: the zero node (trained in round 3) sends the same zeros again, an own resubmission: reported as a copy
    # with its note, paid its one in-round peer's agreement beside the pool's term (0), so determined; its partner's
    # one peer counts for nothing (no verdict of the pool on an own resubmission) and its pool holds one entry (the
    # flipper's and the zero node's entries scored <= 0 are no one's pool peers): undetermined.
    assert records[3]["clients"] == ["client-000", "client-002"] and records[3]["undetermined"] == ["client-000"]
    assert records[3]["pool_peers"]["client-000"] == ["client-003@2"]
    (group,) = records[3]["duplicates"]
    assert group["clients"] == ["client-002", "client-002@3"] and group["note"] == "own resubmission: scored without the pool"
    assert "client-002" not in records[3]["pool_peers"] and report["duplicates"]["flagged"] == {"client-002": [4]}
    # A real participant's own resubmission is a copy: paid at most 0, less what its round-3 zeros were paid.
    charged = max(records[2]["fixed_attacker_rewards"]["client-002"], 0.0)
    assert records[3]["charged_back"] == {"client-002": charged}
    assert records[3]["fixed_attacker_rewards"]["client-002"] == min(group["unadjusted_rewards"]["client-002"], 0.0) - charged
    assert (f"resubmitted its own update in round(s) 4: paid at most 0, {charged:.4f} charged back"
            in " ".join(printed.split()))
    # The analysis client's side-by-side strategies borrow the same pool peers as its honest update.
    assert records[3]["pool_peers"]["client-000/flip"] == records[3]["pool_peers"]["client-000"]
    # Round 1 is a replay of the round itself (no earlier update); from round 2 the replayed update is the analysis
    # client's own pool entry: a copy, an own resubmission scored on the round's one peer only (no pool peer) beside
    # the pool's term at 0 (round 2: no lag weighed yet, so undetermined; the run's last round settles it, on the pool
    # as it stands then: pool rule 17).
    strategies = report["strategies"]
    for spec in ("stale", "lagged:2"):
        assert strategies[spec]["copy_rounds"] == strategies[spec]["own_resubmission_rounds"] == [2, 3, 4]
        for t in (2, 3, 4):
            record = records[t - 1]
            assert f"client-000/{spec}" not in record["pool_peers"]
            paid = [p["payment"] for p in record["pairs"] if p["submission"] == f"client-000/{spec}"]
            expected = paid[0] / (1 + PoolSettings().weight)
            assert len(paid) == 1 and strategies[spec]["per_round"][t - 1] == pytest.approx(expected, rel=1e-12)
        assert {(s["round"], s["settled_in"]) for s in records[3]["settlements"]
                if s["participant"] == f"client-000/{spec}"} == {(1, 4), (2, 4)}  # round 1's too
    assert strategies["honest"]["copy_rounds"] == strategies["flip"]["copy_rounds"] == []
    assert strategies["honest"]["own_resubmission_rounds"] == []
    # Hypothetical copies are not listed among the flagged clients (the zero node's repeated zeros are).
    assert not [c for r in records for g in r["duplicates"] for c in g["clients"] if "/" in c]
    assert "undetermined: 4/4 round(s)" in printed and "kfca.min-peers = 2" in printed
    # The pool never warms up for them in 4 rounds; the run's last round settles rounds 1 and 2 (pool rule 17), where
    # client 0 in rounds 3 and 4 rests on the pool alone and its verdict is still unclear.
    assert "settled later (by the run's last round at the latest): 2, never paid: 2" in " ".join(printed.split())


# A window of 5 rounds (the default is 10): rounds 1-2 wait for the window's end all the same (one new pool participant
# a round never makes 8 pool peers), which comes at rounds 6 and 7 instead of 11 and 12; 8 rounds and a resume of 4
# where the default window needed 13 and 7 (the settling and its resume are the same code at any window).
TWENTY = ["--attacks", "honest,flip", "--set", "num-clients=20", "--set", "strategy.fraction-train=0.1", "--set",
          'kfca.attackers=["3=flip"]', "--set", "train.save-every-round=1", "--set", "kfca.pool-window=5", *FAST]
ROUNDS = 8


def test_undetermined_rounds_are_settled_later_in_the_report_and_a_resumed_run_settles_them_alike(tmp_path, capsys):
    """At 20 x 0.1 the analysis client trains every round: one new pool participant a round, so the pool warms up for
    rounds 1-2 only at the window's end (round 6 and 7 settle them with a 5-round window, ``fl.pool_settle``)."""
    whole, resumed = tmp_path / "whole", tmp_path / "resumed"
    assert main(["simulate", "--rounds", str(ROUNDS), *TWENTY, "--out", str(whole)]) == 0
    printed = " ".join(capsys.readouterr().out.split())
    assert f"undetermined: 2/{ROUNDS} round(s)" in printed
    assert "settled later (by the run's last round at the latest): 2, never paid: 0" in printed
    report = json.loads((whole / "report.json").read_text())
    records = report["round_records"]
    assert report["undetermined_rounds"] == [1, 2]
    settled = {(s["round"], s["participant"]): (r["round"], s["reward"]) for r in records for s in r["settlements"]}
    real = {key: value for key, value in settled.items() if "/" not in key[1]}
    assert sorted(real) == sorted((t, c) for t in (1, 2) for c in records[t - 1]["undetermined"])
    assert {at for at, _ in settled.values()} == {6, 7}
    for (t, client), (_, reward) in real.items():  # the settled round's record pays the settled reward
        assert records[t - 1]["honest_rewards"][client] == reward and reward > 0
    # The analysis client's side-by-side flip is settled too, in its strategy's column: fined, where it had 0.
    assert sorted(k for k in settled if "/" in k[1]) == [(1, "client-000/flip"), (2, "client-000/flip")]
    for t in (1, 2):
        strategies = records[t - 1]["strategy_rewards"]
        assert strategies["flip"] == settled[(t, "client-000/flip")][1] < 0 < strategies["honest"]
        assert strategies["honest"] == records[t - 1]["honest_rewards"]["client-000"]
    # Stopped after round 4 (rounds 1-2 still waiting), resumed: the same settlements, the same rewards.
    shutil.copytree(whole, resumed)
    for t in range(5, ROUNDS + 1):
        shutil.rmtree(round_dir(resumed, t))
        shutil.rmtree(resumed / "state" / f"round-{t:03d}")
    assert main(["simulate", "--rounds", str(ROUNDS), *TWENTY, "--out", str(resumed), "--resume"]) == 0
    again = json.loads((resumed / "report.json").read_text())["round_records"]
    assert [r["settlements"] for r in again] == [r["settlements"] for r in records]
    assert [r["honest_rewards"] for r in again] == [r["honest_rewards"] for r in records]
    assert [r["strategy_rewards"] for r in again] == [r["strategy_rewards"] for r in records]


@pytest.mark.parametrize("dynamic", [False, True])
def test_simulate_seeds_a_clients_training_by_the_round_only_with_a_dynamic_data_seed(monkeypatch, dynamic):
    """``train.dynamic-data-seed``: false (FlowerTune's), each client trains with the same seed (data order, dropout)
    in every round it is sampled; true, with a seed of the round."""
    import kfca_llm.fl.rounds as rounds
    from kfca_llm.fl.rounds import FederationOptions, run_federation
    from kfca_llm.recipe import load_recipe

    seeds: dict[str, list[int]] = {}
    train = rounds.train_client

    def recording(model, global_state, examples, plan, *, seed, **kwargs):
        seeds.setdefault(id(examples), []).append(seed)
        return train(model, global_state, examples, plan, seed=seed, **kwargs)

    monkeypatch.setattr(rounds, "train_client", recording)
    recipe = load_recipe(TINY, ["num-server-rounds=2", "num-clients=2", "strategy.fraction-train=1.0",
                                'kfca.attacks=["honest"]', "train.training-arguments.max-steps=1",
                                "train.save-client-updates=false", f"train.dynamic-data-seed={str(dynamic).lower()}"])
    run_federation(recipe, FederationOptions(progress=False))
    assert len(seeds) == 2 and all(len(s) == 2 for s in seeds.values())
    assert all((first == again) is not dynamic for first, again in seeds.values())
