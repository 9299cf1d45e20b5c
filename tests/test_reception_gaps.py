"""``simulate`` conditions each round on its clients' own reception gaps (``engine.public.public_spans``): the
server knows in which rounds it sent each client a global, so the round's strata hold the global's change since each
sampled client last trained (what a free rider replays), beside the doubling spans."""

from helpers import short_recipe

from kfca_llm.fl import rounds
from kfca_llm.fl.rounds import FederationOptions, run_federation, sample_round_clients


def test_each_round_is_scored_within_its_clients_reception_gaps(monkeypatch):
    # Two of six clients a round, no analysis client: each client's gap is the rounds since it last trained.
    recipe = short_recipe("num-server-rounds=4", "train.training-arguments.max-steps=1", "kfca.attacks=[]",
                          "strategy.fraction-train=0.34")
    seen = {}
    score_round = rounds.score_round

    def recording(submissions, **kwargs):
        seen[kwargs["round_"]] = (kwargs["gaps"], len(kwargs["public"]))
        return score_round(submissions, **kwargs)

    monkeypatch.setattr(rounds, "score_round", recording)
    run_federation(recipe, FederationOptions(progress=False))
    last = {}
    for t in range(1, 5):
        sampled = sample_round_clients(recipe, t, recipe.kfca.seed)
        expected = sorted(t - last[i] for i in sampled if i in last)
        gaps, n_steps = seen[t]
        assert gaps == expected and n_steps == t - 1, (t, gaps, expected)
        last.update(dict.fromkeys(sampled, t))
    assert any(seen[t][0] for t in seen)


def test_reception_gaps_are_the_rounds_since_each_client_last_trained():
    assert rounds.reception_gaps({0: 3, 2: 1, 5: 4}, 5, [0, 1, 2]) == [2, 4]
    assert rounds.reception_gaps({}, 1, [0, 1]) == []


def test_a_client_back_after_more_rounds_than_the_steps_is_scored_on_the_change_since_its_global(monkeypatch, tmp_path):
    """With 2 public steps (spans up to 2 rounds) a client back after 3 or more rounds gets a plane of the change
    since the global it was last sent, which the server keeps for it (``rounds.public_history``); a resume keeps
    those globals too (they are saved with the round's state) and pays every round bit for bit as the run without it."""
    import shutil
    from dataclasses import asdict

    import torch

    from kfca_llm.fl.state import last_complete_round, round_dir

    recipe = short_recipe("num-server-rounds=8", "train.training-arguments.max-steps=1", "kfca.attacks=[]",
                          "strategy.fraction-train=0.34", "kfca.public-steps=2", "train.save-every-round=1")
    seen, starts = {}, {}
    score_round = rounds.score_round

    def recording(submissions, **kwargs):
        seen[kwargs["round_"]] = (kwargs["gaps"], kwargs["changes"])
        return score_round(submissions, **kwargs)

    monkeypatch.setattr(rounds, "score_round", recording)
    out = tmp_path / "run"
    on_round = lambda ctx: starts.update({ctx.round: ctx.global_state})  # noqa: E731
    result = run_federation(recipe, FederationOptions(out_dir=out, progress=False, on_round=on_round))
    longer = 0
    for t, (gaps, changes) in seen.items():
        assert set(changes) <= {g for g in gaps if g > 2}, (t, gaps, changes)
        for gap, change in changes.items():
            for name, value in change.items():
                assert torch.equal(value, starts[t][name] - starts[t - gap][name]), (t, gap, name)
        longer += len(changes)
    assert longer >= 2, seen

    resumed = tmp_path / "resumed"
    shutil.copytree(out, resumed)
    for t in (7, 8):
        shutil.rmtree(round_dir(resumed, t))
        shutil.rmtree(resumed / "state" / f"round-{t:03d}")
    assert last_complete_round(resumed) == 6
    seen.clear()
    again = run_federation(recipe, FederationOptions(out_dir=resumed, resume=True, progress=False))
    # Round 8's client 2 is back after 5 rounds: round 3's global left the newest in round 6, before the resume.
    assert 5 in seen[8][1], seen
    assert [asdict(r) for r in again.rounds] == [asdict(r) for r in result.rounds]
