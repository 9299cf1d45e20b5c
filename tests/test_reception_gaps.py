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
