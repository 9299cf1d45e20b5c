"""One aggregation rule for both front ends (``fl/aggregate.py``), simulate's four modes, the held-out evaluation."""

import pytest
import torch
from helpers import TINY

from kfca_llm import InputError
from kfca_llm.fl.aggregate import (DEFAULT_WEAK_VERDICT, REPLY_AGGREGATIONS, WEAK_VERDICT_RULES, WeakVerdicts,
                                 aggregation_weights)
from kfca_llm.fl.client import ClientUpdate
from kfca_llm.fl.rounds import RoundAggregation, aggregate_round
from kfca_llm.fl.scoring import Submission
from kfca_llm.recipe import AGGREGATES, load_recipe

REWARDS = {"a": 0.2, "b": 0.0, "c": -0.1, "d": 0.05}
WEIGHTS = {"a": 10, "b": 20, "c": 30, "d": 40}


def test_the_rule_keeps_which_replies_with_which_weights():
    assert aggregation_weights("all", REWARDS, WEIGHTS) == {k: float(v) for k, v in WEIGHTS.items()}
    assert aggregation_weights("exclude-negative", REWARDS, WEIGHTS) == {"a": 10.0, "b": 20.0, "d": 40.0}
    # reward-weighted: weight x max(reward, 0); a reply paid <= 0 drops out
    assert aggregation_weights("reward-weighted", REWARDS, WEIGHTS) == pytest.approx({"a": 2.0, "d": 2.0})
    assert aggregation_weights("exclude-negative", None, WEIGHTS) == {k: float(v) for k, v in WEIGHTS.items()}
    assert aggregation_weights("reward-weighted", {"a": -1.0, "b": 0.0}, {"a": 1, "b": 1}) == {}
    with pytest.raises(InputError, match="aggregation must be one of .*'reward-weighted'.*got 'median'"):
        aggregation_weights("median", REWARDS, WEIGHTS)
    with pytest.raises(InputError, match=r"name different replies: \['e'\]"):
        aggregation_weights("all", {**REWARDS, "e": 1.0}, WEIGHTS)


def test_simulate_knows_the_rules_modes_and_the_oracle():
    assert set(AGGREGATES) == {"honest", *REPLY_AGGREGATIONS}
    from kfca_llm.flower.strategy import AGGREGATION_MODES

    assert AGGREGATION_MODES == REPLY_AGGREGATIONS


def _round(rewards):
    """A round of 1-element updates: client c's honest update is +i, the attacker 'c' submits -10 x its own."""
    honest = {cid: {"w": torch.tensor([float(i + 1)])} for i, cid in enumerate(sorted(rewards))}
    trained = {cid: ClientUpdate(u, WEIGHTS[cid], 0.0, 0.0) for cid, u in honest.items()}
    submissions = [Submission(cid, "scaled:-10", {"w": -10 * honest[cid]["w"]}, WEIGHTS[cid]) if cid == "c"
                   else Submission(cid, "honest", honest[cid], WEIGHTS[cid]) for cid in sorted(rewards)]
    return RoundAggregation(1, {"w": torch.zeros(1)}, trained, submissions, dict(rewards))


def _recipe(mode):
    return load_recipe(TINY, [f"kfca.aggregate={mode}"])


def test_simulates_modes_on_one_round():
    round_ = _round(REWARDS)
    new, weights = aggregate_round(_recipe("honest"), round_)  # every client's honest update, attacks never
    assert weights == {"a": 10.0, "b": 20.0, "c": 30.0, "d": 40.0} and new["w"].item() == pytest.approx(3.0)
    new, weights = aggregate_round(_recipe("all"), round_)  # c's -30 is averaged in
    assert new["w"].item() == pytest.approx((10 * 1 + 20 * 2 - 30 * 30 + 40 * 4) / 100)
    new, weights = aggregate_round(_recipe("exclude-negative"), round_)
    assert set(weights) == {"a", "b", "d"} and new["w"].item() == pytest.approx((10 + 40 + 160) / 70)
    new, weights = aggregate_round(_recipe("reward-weighted"), round_)
    assert set(weights) == {"a", "d"} and new["w"].item() == pytest.approx((2 * 1 + 2 * 4) / 4)
    # nothing kept: the global adapter stays
    new, weights = aggregate_round(_recipe("reward-weighted"), _round({k: -1.0 for k in REWARDS}))
    assert weights == {} and new["w"].item() == 0.0


@pytest.fixture(scope="module")
def tiny_model():
    from kfca_llm.data import load_heldout_examples
    from kfca_llm.modeling import load_model_and_tokenizer

    recipe = load_recipe(TINY)
    model, tokenizer = load_model_and_tokenizer(recipe, device="cpu")
    return model, tokenizer.pad_token_id, load_heldout_examples(recipe, tokenizer)


def test_held_out_rows_follow_the_training_rows_of_the_same_generator():
    from kfca_llm import synthetic
    from kfca_llm.data import load_heldout_examples
    from kfca_llm.modeling import load_model_and_tokenizer

    recipe = load_recipe(TINY)
    tokenizer = load_model_and_tokenizer(recipe, device="cpu")[1]
    examples = load_heldout_examples(recipe, tokenizer)
    assert len(examples) == recipe.dataset.heldout_rows == 64
    rows = synthetic.make_rows(recipe.domain, recipe.dataset.num_rows + 64, recipe.kfca.seed)
    first = tokenizer.decode([t for t, label in zip(examples[0]["input_ids"], examples[0]["labels"]) if label != -100])
    assert rows[recipe.dataset.num_rows]["output"] in first and rows[0]["output"] not in first


def test_evaluation_loss_is_the_models_token_loss_and_accuracy_counts_exact_answers(tiny_model):
    from kfca_llm.data import collate
    from kfca_llm.fl.evaluate import EVAL_BATCH, evaluate_adapter

    model, pad_id, examples = tiny_model
    rows = examples[:EVAL_BATCH]  # one batch: the model's own loss is the mean over every response token
    scores = evaluate_adapter(model, rows, pad_id, torch.device("cpu"))
    with torch.no_grad():
        model.eval()
        expected = float(model(**collate(rows, pad_id)).loss)
    assert scores["loss"] == pytest.approx(expected, rel=1e-5) and scores["rows"] == EVAL_BATCH
    # Relabel every response with the model's own greedy tokens: every answer is exact; spoil one token of
    # one row: that row alone is wrong.
    with torch.no_grad():
        greedy = model(**{k: v for k, v in collate(rows, pad_id).items() if k != "labels"}).logits.argmax(-1)
    relabelled = []
    for row, item in enumerate(rows):
        labels = [greedy[row, i - 1].item() if label != -100 else -100 for i, label in enumerate(item["labels"])]
        relabelled.append({"input_ids": item["input_ids"], "labels": labels})
    assert evaluate_adapter(model, relabelled, pad_id, torch.device("cpu"))["accuracy"] == 1.0
    last = max(i for i, label in enumerate(relabelled[3]["labels"]) if label != -100)
    relabelled[3]["labels"][last] = (relabelled[3]["labels"][last] + 1) % 256
    assert evaluate_adapter(model, relabelled, pad_id, torch.device("cpu"))["accuracy"] == 1.0 - 1 / EVAL_BATCH


def test_a_federation_reports_its_global_adapters_held_out_quality_each_round(tmp_path, tiny_model):
    """Each round's figures are the held-out loss and accuracy of that round's global adapter (the one saved
    after the round, evaluated again here on another model instance): not the base model's, nor the adapter
    the round started from, nor the last trained client's, nor other rows'. Under a scaled flip the unguarded
    model's held-out loss rises above the oracle's; exclude-negative keeps the attacker out (recorded per
    round) and stays with the oracle; simulate writes heldout.png."""
    from safetensors.torch import load_file

    from kfca_llm.fl.client import load_adapter_state
    from kfca_llm.fl.evaluate import evaluate_adapter
    from kfca_llm.simulate import run_one

    base = ["num-server-rounds=2", "train.training-arguments.max-steps=2", "strategy.fraction-train=1.0",
            "kfca.attacks=[]", 'kfca.attackers=["3=scaled:-10"]', "train.save-client-updates=false",
            "train.save-every-round=1"]
    reports = {mode: run_one(load_recipe(TINY, [*base, f"kfca.aggregate={mode}"]), tmp_path / mode, progress=False)
               for mode in ("honest", "all", "exclude-negative")}
    for mode, report in reports.items():
        heldout = report["heldout"]
        assert heldout["rows"] == 64 and len(heldout["loss"]) == len(heldout["accuracy"]) == 2
        assert [r["heldout"]["loss"] for r in report["round_records"]] == heldout["loss"]
        assert (tmp_path / mode / "heldout.png").stat().st_size > 0
    model, pad_id, examples = tiny_model
    with torch.no_grad(), model.disable_adapter():
        base_loss = evaluate_adapter(model, examples, pad_id, torch.device("cpu"))["loss"]
    for mode, report in reports.items():
        for t, (loss, accuracy) in enumerate(zip(report["heldout"]["loss"], report["heldout"]["accuracy"]), start=1):
            load_adapter_state(model, load_file(str(tmp_path / mode / "adapters" / f"round-{t:03d}" / "adapter_model.safetensors")))
            expected = evaluate_adapter(model, examples, pad_id, torch.device("cpu"))
            assert loss == pytest.approx(expected["loss"], rel=1e-5) and accuracy == expected["accuracy"]
            assert abs(loss - base_loss) > 1e-3  # the global adapter moved: the base model would not pass
    honest = reports["honest"]["heldout"]["loss"]
    assert abs(honest[1] - honest[0]) > 1e-3  # nor would the adapter a round started from
    oracle, unguarded, guarded = (reports[m]["heldout"]["loss"][-1] for m in ("honest", "all", "exclude-negative"))
    assert unguarded > oracle + 0.1 and abs(guarded - oracle) < 0.05
    assert all("client-003" not in r["aggregated"] and len(r["aggregated"]) == 5
               for r in reports["exclude-negative"]["round_records"])
    assert all(r["aggregated"]["client-003"] == pytest.approx(1 / 6) for r in reports["all"]["round_records"])


def _verdicts(in_round, *, short=None, warming=(), undetermined=(), cautious=None):
    return WeakVerdicts(dict(in_round), frozenset(in_round if short is None else short), frozenset(warming),
                        frozenset(undetermined), dict(cautious or {}))


def test_a_reply_paid_on_its_peer_read_back_is_kept_only_where_its_cautious_reward_is_not_negative():
    """'f' is paid > 0 (the pool ranked its disagreeing partner lower, so its peer was read back), but its cautious
    reward (in-round payment as it is, beside the pool's) is < 0: the model does not take it, under every weak-verdict
    rule but 'all'; 'h', whose cautious reward is >= 0, is kept."""
    pooled, weights = {"h": 0.05, "f": 0.04}, {"h": 10, "f": 10}
    verdicts = _verdicts({"h": -0.2, "f": -0.2}, cautious={"h": 0.01, "f": -0.03})
    for mode in ("exclude-negative", "reward-weighted"):
        for rule in ("trust-pool", "confirm-warm-up", "round-peers-warm-up", "exclude-undetermined"):
            assert set(aggregation_weights(mode, pooled, weights, verdicts=verdicts, weak_verdict=rule)) == {"h"}
    assert set(aggregation_weights("all", pooled, weights, verdicts=verdicts)) == {"h", "f"}


def test_an_undetermined_reply_is_judged_on_its_rounds_score_not_on_its_unpaid_zero():
    verdicts = _verdicts({"a": 0.3, "b": -0.3}, warming={"a", "b"}, undetermined={"a", "b"})
    kept = aggregation_weights("reward-weighted", {"a": 0.0, "b": 0.0}, {"a": 10, "b": 10}, verdicts=verdicts,
                               weak_verdict="trust-pool")
    assert kept == pytest.approx({"a": 3.0})
    assert set(aggregation_weights("exclude-negative", {"a": 0.0, "b": 0.0}, {"a": 10, "b": 10}, verdicts=verdicts,
                                   weak_verdict="confirm-warm-up")) == {"a"}


def test_a_reply_paid_by_the_pool_alone_is_held_to_its_in_round_reward_while_the_pool_warms_up():
    """A pair of two: 'h' is paid > 0 by the pool but < 0 in its round (its partner 'f' flipped, and one peer
    pays both alike). While the pool warms up for 'h' confirm-warm-up leaves it out; once warm, it is kept."""
    pooled, weights = {"h": 0.05, "f": -0.1}, {"h": 10, "f": 10}
    warming = _verdicts({"h": -0.2, "f": -0.2}, warming={"h", "f"})
    warm = _verdicts({"h": -0.2, "f": -0.2})
    for mode in ("exclude-negative", "reward-weighted"):
        assert aggregation_weights(mode, pooled, weights, verdicts=warming, weak_verdict="confirm-warm-up") == {}
        assert set(aggregation_weights(mode, pooled, weights, verdicts=warm, weak_verdict="confirm-warm-up")) == {"h"}
        assert set(aggregation_weights(mode, pooled, weights, verdicts=warming, weak_verdict="trust-pool")) == {"h"}
        assert aggregation_weights(mode, pooled, weights, verdicts=warm, weak_verdict="confirm-always") == {}
        # round-peers-warm-up: the in-round reward instead of the pooled one while warming (both out here) ...
        assert aggregation_weights(mode, pooled, weights, verdicts=warming, weak_verdict="round-peers-warm-up") == {}
        # ... and it keeps a reply the pool fined whose round paid it > 0
        agree = _verdicts({"h": 0.3, "f": 0.3}, warming={"h", "f"})
        assert set(aggregation_weights(mode, pooled, weights, verdicts=agree, weak_verdict="round-peers-warm-up")) == {"h", "f"}
        assert set(aggregation_weights(mode, pooled, weights, verdicts=agree, weak_verdict="confirm-warm-up")) == {"h"}
    # reward-weighted keeps its pooled weight when confirmed (confirm-*), and takes the in-round one when it decides
    assert aggregation_weights("reward-weighted", pooled, weights, verdicts=warm,
                               weak_verdict="confirm-warm-up") == pytest.approx({"h": 0.5})
    assert aggregation_weights("reward-weighted", pooled, weights, verdicts=agree,
                               weak_verdict="round-peers-warm-up") == pytest.approx({"h": 3.0, "f": 3.0})
    # exclude-undetermined: an undetermined reply is out whatever it was paid
    assert set(aggregation_weights("exclude-negative", {"h": 0.3, "g": 0.3}, {"h": 1, "g": 1},
                                   verdicts=_verdicts({"h": 0.3, "g": 0.3}, undetermined={"g"}),
                                   weak_verdict="exclude-undetermined")) == {"h"}
    # "all" takes every reply whatever the rule; an unknown rule is refused
    assert set(aggregation_weights("all", pooled, weights, verdicts=warming, weak_verdict="confirm-always")) == {"h", "f"}
    with pytest.raises(InputError, match="weak verdict rule must be one of .*got 'maybe'"):
        aggregation_weights("exclude-negative", pooled, weights, weak_verdict="maybe")


def test_replies_with_enough_in_round_peers_are_never_touched_by_a_weak_verdict_rule():
    """Only replies the scoring lists as short (paid with the pool) are judged again: a round in which every reply
    had min_peers in-round peers (no reply short) aggregates exactly as under trust-pool, whatever the rule."""
    in_round = {"a": -0.5, "b": -0.5, "c": -0.5, "d": -0.5}  # would fail every in-round test
    none_short = _verdicts(in_round, short=(), warming=(), undetermined=())
    for mode in ("exclude-negative", "reward-weighted"):
        today = aggregation_weights(mode, REWARDS, WEIGHTS)
        for rule in WEAK_VERDICT_RULES:
            assert aggregation_weights(mode, REWARDS, WEIGHTS, verdicts=none_short, weak_verdict=rule) == today
            assert aggregation_weights(mode, REWARDS, WEIGHTS, verdicts=None, weak_verdict=rule) == today


def test_the_recipe_knows_the_weak_verdict_rules_and_both_front_ends_default_alike():
    from kfca_llm.recipe import KfcaConfig, WeakVerdict

    assert WeakVerdict.__args__ == WEAK_VERDICT_RULES
    assert KfcaConfig().weak_verdict == DEFAULT_WEAK_VERDICT
    pytest.importorskip("flwr", reason="Flower is the optional extra kfca-llm[flower] (make install installs it)")
    import inspect

    from kfca_llm.flower import KFCAStrategy

    assert inspect.signature(KFCAStrategy).parameters["weak_verdict"].default == DEFAULT_WEAK_VERDICT
    with pytest.raises(InputError, match="weak verdict rule must be one of"):
        KFCAStrategy(ledger=None, weak_verdict="maybe")
