import json
import shutil
import warnings
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import TINY, short_recipe

from kfca_llm import score_checkpoints
from kfca_llm.errors import InputError
from kfca_llm.fl.aggregate import fedavg
from kfca_llm.fl.rounds import FederationOptions, run_federation, sample_round_clients
from kfca_llm.fl.scoring import Submission, choose_peers, score_round
from kfca_llm.fl.state import last_complete_round, round_dir, updates_dir
from kfca_llm.recipe import RecipeError, clients_per_round, load_recipe


def test_round_sampling_keeps_the_analysis_client_and_follows_fraction():
    recipe = load_recipe(TINY, ["num-clients=20", "strategy.fraction-train=0.2", "dataset.num-rows=200"])
    k = clients_per_round(recipe)
    seen = set()
    for t in range(1, 11):
        clients = sample_round_clients(recipe, t, seed=3)
        assert clients == sorted(set(clients)) and len(clients) == k and clients[0] == 0
        assert clients == sample_round_clients(recipe, t, seed=3)
        seen.update(clients)
    assert len(seen) > k  # honest participants change from round to round
    plain = load_recipe(TINY, ["kfca.attacks=[]"])
    drawn = {tuple(sample_round_clients(plain, t, seed=1)) for t in range(1, 30)}
    assert any(0 not in c for c in drawn)  # without attacks client 0 is an ordinary client
    assert all(len(c) == clients_per_round(plain) for c in drawn)


def test_choose_peers():
    ids = ["a", "b", "c", "d"]
    assert choose_peers(ids, None, 0) == ids
    assert choose_peers(ids, 9, 0) == ids
    two = choose_peers(ids, 2, 5)
    assert len(two) == 2 and set(two) <= set(ids) and two == choose_peers(ids, 2, 5)
    assert len({tuple(choose_peers(ids, 2, s)) for s in range(20)}) > 1  # the seed picks the peers


def test_fedavg_is_the_example_weighted_mean_in_any_input_order():
    g = torch.Generator().manual_seed(0)
    glob = {"w": torch.randn(5, 4, generator=g)}
    ups = [(f"c{i}", {"w": torch.randn(5, 4, generator=g)}, n) for i, n in enumerate((10, 30, 60))]
    want = glob["w"] + sum(u["w"] * n for _, u, n in ups) / 100
    out = fedavg(glob, ups)
    torch.testing.assert_close(out["w"], want)
    assert torch.equal(out["w"], fedavg(glob, ups[::-1])["w"])  # sorted summation: bit-identical
    with pytest.raises(InputError):
        fedavg(glob, [("c", {"w": glob["w"]}, 0)])


def _update(g, scale=1.0):
    return {"w": torch.randn(64, 32, generator=g) * scale}


def test_score_round_pays_each_submission_against_the_documented_peers():
    g = torch.Generator().manual_seed(1)
    base = _update(g)
    honest = {c: {"w": base["w"] + 0.5 * torch.randn(64, 32, generator=g)} for c in ("a", "b", "c", "d")}
    from kfca_llm.recipe import KfcaConfig

    subs = [Submission("a", "honest", honest["a"], 10), Submission("b", "honest", honest["b"], 10),
            Submission("c", "flip", {"w": -honest["c"]["w"]}, 10), Submission("d", "honest", honest["d"], 10),
            Submission("a", "zero", {"w": torch.zeros(64, 32)}, 10, analysis=True)]
    scores = score_round(subs, analysis_client="a", kfca=KfcaConfig(), kfca_seed=7)
    peers = {p.submission: sorted(q.peer for q in scores.pairs if q.submission == p.submission) for p in scores.pairs}
    assert peers["a"] == peers["a/zero"] == ["b", "d"]  # the analysis client: honest peers only
    assert peers["b"] == ["a", "c", "d"] and peers["c"] == ["a", "b", "d"]  # others: every other client
    assert "a/zero" not in {p.peer for p in scores.pairs}  # analysis submissions are nobody's peer
    assert set(scores.strategy_rewards) == {"honest", "zero"} and scores.strategy_rewards["honest"] > 0.1
    assert abs(scores.strategy_rewards["zero"]) < 0.05
    assert set(scores.honest_rewards) == {"a", "b", "d"} and scores.fixed_attacker_rewards["c"] < -0.1
    assert all(p.honest_pair == (p.strategy == "honest" and p.peer != "c") for p in scores.pairs)
    with pytest.raises(InputError, match="more than one"):
        score_round(subs + [Submission("b", "flip", honest["b"], 10)], analysis_client="a", kfca=KfcaConfig(),
                    kfca_seed=7)


def test_round_records_are_complete_and_consistent(short_federation):
    recipe, _, result = short_federation
    assert [r.round for r in result.rounds] == [1, 2, 3]
    for r in result.rounds:
        assert r.analysis_client == "client-000" and r.analysis_client in r.clients
        assert set(r.strategy_rewards) == {"honest", "flip", "stale", "lagged:1", "zero", "sparse:0.5"}
        # Every strategy is scored against the same honest peers (the other clients of the round).
        peers = {s: sorted(p.peer for p in r.pairs if p.client == r.analysis_client and p.strategy == s)
                 for s in r.strategy_rewards}
        assert all(v == sorted(c for c in r.clients if c != r.analysis_client) for v in peers.values())
        # The "honest" strategy is the analysis client's own honest reward.
        assert r.honest_rewards[r.analysis_client] == r.strategy_rewards["honest"]
        assert set(r.honest_rewards) == set(r.clients) and not r.fixed_attacker_rewards
        assert all(np.asarray(p.delta).shape == (2, 2) for p in r.pairs)
        assert r.categorical_world
        assert r.strategy_rewards["honest"] > 0 > r.strategy_rewards["flip"]
        # Local training lowers the loss on the probe batch.
        assert np.mean([r.loss_after[c] - r.loss_before[c] for c in r.clients]) < 0
    # Round 1 has no history: stale and lagged submit the round-1 update, i.e. the honest one.
    first = result.rounds[0].strategy_rewards
    assert first["stale"] == first["lagged:1"] == first["honest"]
    assert result.rounds[2].strategy_rewards["stale"] != result.rounds[2].strategy_rewards["honest"]


def test_adapters_are_saved_in_peft_format_and_load(short_federation):
    from peft import PeftModel, get_peft_model_state_dict

    from kfca_llm.modeling import load_model_and_tokenizer

    recipe, out, result = short_federation
    assert last_complete_round(out) == 3
    for t in (1, 2, 3):
        assert (round_dir(out, t) / "adapter_config.json").is_file()
        assert (round_dir(out, t) / "adapter_model.safetensors").is_file()
    base, _ = load_model_and_tokenizer(recipe)
    initial = {k: v.clone() for k, v in get_peft_model_state_dict(base).items()}
    loaded = PeftModel.from_pretrained(base.get_base_model(), str(round_dir(out, 3)))
    state = get_peft_model_state_dict(loaded)
    lora_b = [k for k in state if "lora_B" in k]
    assert lora_b and any(not torch.equal(state[k], initial[k]) for k in lora_b)


def test_saved_client_updates_score_like_the_run(short_federation):
    # What the README's scoring example does: score a round's saved client adapters against its global.
    _, out, result = short_federation
    for r in result.rounds:
        folder = updates_dir(out, r.round)
        assert sorted(p.name for p in folder.iterdir()) == sorted(["global", *r.clients])
        # The run conditions on the globals it sent (kfca.public-steps): the earlier rounds' saved globals.
        public = [updates_dir(out, t) / "global" for t in range(1, r.round)]
        report = score_checkpoints([folder / c for c in r.clients], reference=folder / "global", seed=r.kfca_seed,
                                   public=public)
        # Same updates up to float32 rounding of (global + update) - global: the same sign of reward.
        for c in r.clients:
            assert report.rewards[c] == pytest.approx(r.honest_rewards[c], abs=0.02)
        assert min(report.rewards.values()) > 0


def _interrupted(out: Path, tmp_path: Path, last: int) -> Path:
    """A copy of a finished run's folder without its final round, as if it had stopped after ``last``."""
    resumed_dir = tmp_path / "resumed"
    shutil.copytree(out, resumed_dir)
    shutil.rmtree(round_dir(resumed_dir, last + 1))
    shutil.rmtree(resumed_dir / "state" / f"round-{last + 1:03d}")
    assert last_complete_round(resumed_dir) == last
    return resumed_dir


def test_same_seed_reproduces_and_resume_continues_bit_identically(short_federation, tmp_path):
    recipe, out, result = short_federation
    resumed_dir = _interrupted(out, tmp_path, last=2)
    resumed = run_federation(recipe, FederationOptions(out_dir=resumed_dir, resume=True, progress=False))
    assert [asdict(r) for r in resumed.rounds] == [asdict(r) for r in result.rounds]
    a = (round_dir(out, 3) / "adapter_model.safetensors").read_bytes()
    b = (round_dir(resumed_dir, 3) / "adapter_model.safetensors").read_bytes()
    assert a == b
    with pytest.raises(InputError, match="cannot resume"):
        other = short_recipe('kfca.attacks=["honest", "flip"]')
        run_federation(other, FederationOptions(out_dir=resumed_dir, resume=True, progress=False))


@pytest.mark.parametrize("key, field, value", [("kfca.duplicates", "duplicates", "split"),
                                             ("kfca.penalty", "penalty", "sampled"),
                                             ("kfca.bonus-fraction", "bonus_fraction", 0.4),
                                             ("kfca.peers", "peers", 1), ("kfca.aggregate", "aggregate", "all")])
def test_resume_refuses_a_changed_scoring_setting_in_one_line_naming_it(short_federation, tmp_path, key, field,
                                                                          value):
    recipe, out, _ = short_federation
    resumed_dir = _interrupted(out, tmp_path, last=2)
    changed = recipe.model_copy(update={"kfca": recipe.kfca.model_copy(update={field: value})})
    with pytest.raises(InputError, match=rf"cannot resume from .*: scoring setting {key} was .* this run has {value!r}"):
        run_federation(changed, FederationOptions(out_dir=resumed_dir, resume=True, progress=False))
    assert last_complete_round(resumed_dir) == 2  # nothing was trained or written


def test_report_dict_is_json_and_has_the_documented_keys(short_federation):
    _, _, result = short_federation
    report = json.loads(json.dumps(result.to_report()))
    assert {"domain", "recipe", "seed", "rounds", "strategies", "categorical_world", "delta"} <= set(report)
    assert report["rounds"] == 3 and report["categorical_world"] == [True] * 3
    honest = report["strategies"]["honest"]
    assert honest["mean_reward"] == pytest.approx(np.mean(honest["per_round"]))


def test_attacks_leave_the_honest_trajectory_alone_unless_aggregated():
    # aggregate = "honest": listing a flip attack changes neither the model nor the honest clients' rewards
    # (flip is non-zero exactly where the honest update is, so the task set is the same too).
    base = ["num-server-rounds=2", "train.training-arguments.max-steps=1"]
    only = run_federation(load_recipe(TINY, [*base, 'kfca.attacks=["honest"]']), FederationOptions(progress=False))
    both = run_federation(load_recipe(TINY, [*base, 'kfca.attacks=["honest", "flip"]']),
                          FederationOptions(progress=False))
    poisoned = run_federation(load_recipe(TINY, [*base, 'kfca.attacks=["honest", "flip"]', "kfca.aggregate=all"]),
                              FederationOptions(progress=False))
    assert [r.honest_rewards for r in only.rounds] == [r.honest_rewards for r in both.rounds]
    assert [r.loss_before for r in only.rounds] == [r.loss_before for r in both.rounds]
    # With "all", the flipped submission enters FedAvg and round 2 starts from another global adapter.
    assert poisoned.rounds[1].loss_before != both.rounds[1].loss_before
    assert poisoned.rounds[0].strategy_rewards == both.rounds[0].strategy_rewards


# Two rounds of one step: lagged:1 needs a second round; every client of six trains every round.
FIXED_SHAPE = ["num-server-rounds=2", "train.training-arguments.max-steps=1", "strategy.fraction-train=1.0",
               'kfca.attacks=["honest"]']
# kfca.duplicates = flag: these tests check what each attack is paid before any copy policy.
FIXED = ['kfca.attackers=["2=flip", "3=zero", "4=lagged:1", "5=copy:0"]', "kfca.duplicates=flag", *FIXED_SHAPE]


@pytest.fixture(scope="module")
def fixed_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("fixed")
    recipe = short_recipe(*FIXED)
    return recipe, out, run_federation(recipe, FederationOptions(out_dir=out, progress=False))


def test_fixed_attackers_submit_their_attack_and_are_paid_for_it(fixed_run):
    _, _, result = fixed_run
    for r in result.rounds:
        assert r.fixed_attacks == {"client-002": "flip", "client-003": "zero", "client-004": "lagged:1",
                                   "client-005": "copy:0"}
        assert set(r.fixed_attacker_rewards) == set(r.fixed_attacks)
        assert not set(r.honest_rewards) & set(r.fixed_attacks)
        # The analysis client (0) is scored against the round's honest clients only: one peer (client 1), no pool
        # it could weigh in two rounds, so undetermined and not paid (its score is kept unadjusted).
        assert r.undetermined == ["client-000"] and r.honest_rewards["client-000"] == 0.0
        assert r.fixed_attacker_rewards["client-002"] < 0 < r.honest_rewards["client-001"]
        assert abs(r.fixed_attacker_rewards["client-003"]) < 0.05
        # copy:0 submits another client's honest update: it agrees with that client perfectly, so its pay
        # beats every honest client's (free riding on a copy is what copy detection must catch).
        assert r.fixed_attacker_rewards["client-005"] > 0
        # pairs that involve an attacker are recorded but are not honest pairs
        for p in r.pairs:
            assert p.honest_pair == (p.client not in r.fixed_attacks and p.peer not in r.fixed_attacks)
        assert r.categorical_world
    # lagged:1 replays the previous round's honest update; in round 1 there is none, so it submits its
    # honest update and is paid exactly what it is paid as an honest client, and differently afterwards.
    honest_4 = run_federation(short_recipe('kfca.attackers=["2=flip", "3=zero", "5=copy:0"]', "kfca.duplicates=flag",
                                           *FIXED_SHAPE),
                              FederationOptions(progress=False))
    assert result.rounds[0].fixed_attacker_rewards["client-004"] == honest_4.rounds[0].honest_rewards["client-004"]
    assert result.rounds[1].fixed_attacker_rewards["client-004"] != honest_4.rounds[1].honest_rewards["client-004"]
    # with aggregate = "honest" the attacks do not move the model
    assert [r.loss_before for r in result.rounds] == [r.loss_before for r in honest_4.rounds]
    report = result.to_report()["fixed_attackers"]
    assert report["client-002"]["spec"] == "flip" and report["client-002"]["mean_reward"] < 0


def test_fixed_attackers_move_the_model_when_aggregated(fixed_run):
    _, _, attacked = fixed_run
    poisoned = run_federation(short_recipe(*FIXED, "kfca.aggregate=all"),
                              FederationOptions(progress=False))
    assert poisoned.rounds[0].loss_before == attacked.rounds[0].loss_before
    assert poisoned.rounds[1].loss_before != attacked.rounds[1].loss_before


def test_resume_keeps_fixed_attackers_histories(fixed_run, tmp_path):
    recipe, out, result = fixed_run
    resumed_dir = _interrupted(out, tmp_path, last=1)
    resumed = run_federation(recipe, FederationOptions(out_dir=resumed_dir, resume=True, progress=False))
    assert [asdict(r) for r in resumed.rounds] == [asdict(r) for r in result.rounds]


def test_copies_among_real_submissions_are_paid_nothing_and_recorded():
    # client-003 copies one other client's honest update exactly (every other client is honest, so the
    # copied update is always submitted); the analysis client's stale strategy equals its honest update
    # in round 1 but is a hypothetical alternative, never a copy.
    recipe = short_recipe('kfca.attackers=["3=copy:0"]', 'kfca.attacks=["honest", "stale"]', *FIXED_SHAPE[:3])
    assert recipe.kfca.duplicates == "zero"
    result = run_federation(recipe, FederationOptions(progress=False))
    flagged = {}
    for r in result.rounds:
        (group,) = r.duplicates
        source, copier = group["clients"] if group["clients"][1] == "client-003" else group["clients"][::-1]
        assert copier == "client-003" and group["pairs"][0]["reason"] == "identical"
        unadjusted = group["unadjusted_rewards"]
        assert unadjusted[source] == unadjusted[copier] > 0  # what flag would have paid each
        assert r.honest_rewards[source] == 0.0 and r.fixed_attacker_rewards[copier] == 0.0
        assert all(v > 0 for c, v in r.honest_rewards.items() if c != source)
        for c in group["clients"]:
            flagged.setdefault(c, []).append(r.round)
    first = result.rounds[0].strategy_rewards
    assert first["stale"] == first["honest"] > 0
    assert result.to_report()["duplicates"] == {"policy": "zero", "flagged": flagged}

    colluders = run_federation(short_recipe('kfca.attackers=["4=collude:a", "5=collude:a"]', *FIXED_SHAPE),
                               FederationOptions(progress=False))
    for r in colluders.rounds:
        assert [g["clients"] for g in r.duplicates] == [["client-004", "client-005"]]
        assert r.fixed_attacker_rewards == {"client-004": 0.0, "client-005": 0.0}
        assert min(r.honest_rewards.values()) > 0
    with pytest.raises(RecipeError, match="kfca.duplicates"):
        short_recipe("kfca.duplicates=ban")


def test_a_round_whose_submissions_are_all_zero_pays_nothing_and_the_federation_goes_on():
    """Two zero attackers sampled together (FlowerTune trains two a round): no coordinate is a task. The round is
    paid 0 throughout and undetermined, and the next round is scored as usual."""
    from kfca_llm.fl.peer_pool import PeerPool, PoolSettings
    from kfca_llm.recipe import KfcaConfig

    zero = {"w": torch.zeros(64, 32)}
    pool = PeerPool(PoolSettings())
    subs = [Submission("a", "honest", zero, 10), Submission("b", "zero", zero, 10),
            Submission("a", "flip", zero, 10, analysis=True)]
    with pytest.warns(UserWarning, match="round 3 not scored, every submission paid 0: too few informative"):
        scores = score_round(subs, analysis_client="a", kfca=KfcaConfig(), kfca_seed=7, pool=pool, round_=3)
    assert scores.strategy_rewards == {"honest": 0.0, "flip": 0.0}
    assert scores.honest_rewards == {"a": 0.0} and scores.fixed_attacker_rewards == {"b": 0.0}
    assert scores.pairs == [] and scores.undetermined == ["a", "b"] and pool.entries(4) == []
    g = torch.Generator().manual_seed(2)
    base = _update(g)
    honest = [Submission(c, "honest", {"w": base["w"] + 0.5 * torch.randn(64, 32, generator=g)}, 10)
              for c in ("a", "b", "c")]
    assert score_round(honest, analysis_client="a", kfca=KfcaConfig(), kfca_seed=8, pool=pool,
                       round_=4).strategy_rewards["honest"] > 0.1


def test_a_federation_with_only_zero_attackers_sampled_in_a_round_runs_to_its_end():
    # 4 clients, 2 a round drawn freely (no attack analysis), clients 1-3 zero attackers: a round drawing two of
    # them has no task at all.
    recipe = short_recipe('kfca.attackers=["1=zero", "2=zero", "3=zero"]', 'kfca.attacks=[]',
                          "num-clients=4", "strategy.fraction-train=0.5")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = run_federation(recipe, FederationOptions(progress=False))
    unscored = [int(str(w.message).split()[1]) for w in caught if "not scored" in str(w.message)]
    assert unscored, "no round drew two zero attackers: pick another seed"
    for r in result.rounds:
        if r.round in unscored:
            assert set(r.clients) <= {"client-001", "client-002", "client-003"} and not r.pairs
            assert set(r.fixed_attacker_rewards.values()) == {0.0}
