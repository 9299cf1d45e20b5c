"""The Flower app's server side without a simulation engine: the ServerApp's strategy from the recipe and the run
config (copies, weak verdicts, identity, resume, the wrapped Flower strategy, the server's reference), and how a
wrong setting or a failing node ends the run (the node side: test_app.py)."""

import pytest

pytest.importorskip("flwr", reason="Flower is the optional extra kfca-llm[flower] (make install installs it)")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from flower_app_runs import CONFIG, declared_config, node_context  # noqa: E402
from flwr.app import ArrayRecord, Context, Message, RecordDict  # noqa: E402

from kfca_llm import InputError  # noqa: E402
from kfca_llm.flower.client_app import train_reply  # noqa: E402
from kfca_llm.flower.task import initial_adapter, recipe_from_config  # noqa: E402


def test_the_server_app_pays_copies_by_the_recipes_kfca_duplicates(tmp_path):
    from kfca_llm.flower.server_app import build_strategy

    ledger = {"kfca.ledger": str(tmp_path / "rewards.sqlite")}
    assert build_strategy(recipe_from_config(CONFIG), ledger).duplicates == "zero"
    split = recipe_from_config({**CONFIG, "kfca.duplicates": "split"})
    assert build_strategy(split, ledger).duplicates == "split"
    # an own earlier update is replayed within 2% of the signs where nodes train other samples every round, else none
    assert build_strategy(recipe_from_config(CONFIG), ledger).pool.settings.own_replay_limit == 0.02
    static = recipe_from_config({**CONFIG, "train.dynamic-data-seed": False})
    assert build_strategy(static, ledger).pool.settings.own_replay_limit == 0.0


def test_the_server_app_takes_the_weak_verdict_rule_from_the_recipe_or_the_run_config(tmp_path):
    """``kfca.weak-verdict`` is declared for ``flwr run`` with the recipe's default, and reaches KFCAStrategy."""
    from kfca_llm.flower.server_app import build_strategy

    assert declared_config()["kfca.weak-verdict"] == recipe_from_config(CONFIG).kfca.weak_verdict
    config = {**CONFIG, "kfca.aggregation": "exclude-negative", "kfca.weak-verdict": "trust-pool"}
    strategy = build_strategy(recipe_from_config(config), {**config, "kfca.ledger": str(tmp_path / "r.sqlite")})
    assert strategy.weak_verdict == "trust-pool" and strategy.settings["weak_verdict"] == "trust-pool"


def test_the_server_app_reads_identity_keep_signs_and_resume_from_the_run_config(tmp_path):
    from kfca_llm.flower.server_app import build_strategy

    config = {**CONFIG, "kfca.ledger": str(tmp_path / "rewards.sqlite"), "kfca.identity": "declared",
              "kfca.keep-signs": True}
    recipe = recipe_from_config(config)
    strategy = build_strategy(recipe, config)
    assert (strategy.identity, strategy.keep_signs, strategy.round_offset) == ("declared", True, 0)
    assert strategy.resume_arrays() is None  # nothing committed yet
    assert build_strategy(recipe, {**config, "kfca.resume": True}).run_id == strategy.run_id  # continues its run
    with pytest.raises(InputError, match="'kfca.resume' must be true or false"):
        build_strategy(recipe, {**config, "kfca.resume": "yes"})
    # the app keeps signs unless told not to: an operator who pays people needs verify to recompute every round
    default = {k: v for k, v in config.items() if k != "kfca.keep-signs"}
    default["kfca.ledger"] = str(tmp_path / "default.sqlite")
    assert build_strategy(recipe, default).keep_signs is True
    assert build_strategy(recipe, {**default, "kfca.keep-signs": False}).keep_signs is False
    with pytest.raises(InputError, match="cannot resume: scoring setting 'identity'"):
        build_strategy(recipe, {**config, "kfca.resume": True, "kfca.identity": "public-key"})


class _RecordingKFCA:
    """Mixed into KFCAStrategy: keeps each round's valid replies as numpy (the wrapped strategy may consume them)."""

    def aggregate_train(self, server_round, replies):
        replies = list(replies)
        self.handed = [({k: a.numpy().copy() for k, a in m.content["arrays"].items()},
                        m.content["metrics"]["num-examples"]) for m in replies]
        return super().aggregate_train(server_round, replies)


def _krum_selection(replies, malicious, select):
    """Krum/MultiKrum by hand: the `select` replies whose n-f-2 nearest others are closest (squared L2)."""
    flat = [np.concatenate([a[k].ravel() for k in sorted(a)]) for a, _ in replies]
    distances = np.array([[float(np.sum((x - y) ** 2)) for y in flat] for x in flat])
    closest = max(1, len(flat) - malicious - 2)
    scores = [np.sort(row)[1:closest + 1].sum() for row in distances]
    return [replies[i] for i in np.argsort(scores)[:select]]


def _mean(replies):
    total = sum(n for _, n in replies)
    return {k: sum(a[k] * (n / total) for a, n in replies) for k in replies[0][0]}


@pytest.mark.parametrize("name, parameters", [
    ("fedavg", {}), ("fedmedian", {}), ("fedtrimmedavg", {"kfca.wrapped.beta": 0.3}),
    ("krum", {"kfca.wrapped.num-malicious-nodes": 1}),
    ("multikrum", {"kfca.wrapped.num-malicious-nodes": 1, "kfca.wrapped.num-nodes-to-select": 3}),
    ("bulyan", {"kfca.wrapped.num-malicious-nodes": 1})])
def test_each_wrapped_strategy_key_builds_flowers_strategy_which_aggregates_what_kfca_hands_it(tmp_path, name,
                                                                                               parameters):
    """``kfca.wrapped-strategy`` builds Flower's own class with its parameters; its aggregation makes the
    global arrays (recomputed by hand from the replies KFCA handed it) and KFCA still pays every reply."""
    import flwr.serverapp.strategy as flower
    from flower_local import LocalGrid, initial_arrays, numpy_node

    from kfca_llm.flower import KFCAStrategy
    from kfca_llm.flower.server_app import WRAPPED_STRATEGIES, build_strategy

    config = {**CONFIG, "strategy.fraction-train": 1.0, "strategy.fraction-evaluate": 0.0,
              "kfca.ledger": str(tmp_path / "rewards.sqlite"), "kfca.wrapped-strategy": name, **parameters}
    recording = type("RecordingKFCA", (_RecordingKFCA, KFCAStrategy), {})
    strategy = build_strategy(recipe_from_config(config), config, recording)
    expected_class = {"fedavg": flower.FedAvg, "fedmedian": flower.FedMedian, "fedtrimmedavg": flower.FedTrimmedAvg,
                      "krum": flower.Krum, "multikrum": flower.MultiKrum, "bulyan": flower.Bulyan}[name]
    assert type(strategy.strategy) is expected_class is WRAPPED_STRATEGIES[name]
    for key, value in parameters.items():
        assert getattr(strategy.strategy, key.rpartition(".")[2].replace("-", "_")) == value

    nodes = {n: numpy_node("honest") for n in range(1, 7)} | {7: numpy_node("flip")}
    result = strategy.start(grid=LocalGrid(nodes), initial_arrays=initial_arrays(), num_rounds=1)
    replies = strategy.handed
    assert len(replies) == 7 and len(strategy.rewards[1]) == 7  # aggregation "all": every reply, every one paid
    stacked = {k: np.stack([a[k] for a, _ in replies]) for k in replies[0][0]}
    if name == "fedavg":
        expected = _mean(replies)
    elif name == "fedmedian":
        expected = {k: np.median(v, axis=0) for k, v in stacked.items()}
    elif name == "fedtrimmedavg":  # beta 0.3 of 7: two cut at each end of every coordinate
        expected = {k: np.sort(v, axis=0)[2:-2].mean(axis=0) for k, v in stacked.items()}
    elif name in ("krum", "multikrum"):
        expected = _mean(_krum_selection(replies, 1, parameters.get("kfca.wrapped.num-nodes-to-select", 1)))
    else:  # Bulyan, f = 1, 7 replies: within each coordinate's range of the replies, not their mean
        low, high = ({k: f(v, axis=0) for k, v in stacked.items()} for f in (np.min, np.max))
        assert all(np.all(low[k] - 1e-6 <= result.arrays[k].numpy()) and np.all(result.arrays[k].numpy() <= high[k] + 1e-6)
                   for k in low)
        expected = None
        assert not all(np.allclose(result.arrays[k].numpy(), v) for k, v in _mean(replies).items())
    if expected is not None:
        for k, v in expected.items():
            np.testing.assert_allclose(result.arrays[k].numpy(), v, rtol=1e-5, atol=1e-6)


def test_a_wrapped_strategy_key_or_parameter_out_of_range_is_refused_naming_the_key(tmp_path):
    from kfca_llm.flower.server_app import build_wrapped_strategy

    recipe = recipe_from_config(CONFIG)
    with pytest.raises(InputError, match="'kfca.wrapped-strategy' must be one of .*'bulyan'.*got 'median'"):
        build_wrapped_strategy(recipe, {"kfca.wrapped-strategy": "median"})
    with pytest.raises(InputError, match="'kfca.wrapped.beta' must lie in"):
        build_wrapped_strategy(recipe, {"kfca.wrapped-strategy": "fedtrimmedavg", "kfca.wrapped.beta": 0.7})
    with pytest.raises(InputError, match="'kfca.wrapped.num-malicious-nodes' must be an integer"):
        build_wrapped_strategy(recipe, {"kfca.wrapped-strategy": "krum", "kfca.wrapped.num-malicious-nodes": 1.5})
    # a parameter the chosen strategy does not take is ignored (Flower fills every declared key in)
    assert type(build_wrapped_strategy(recipe, {"kfca.wrapped.beta": 0.7})).__name__ == "FedAvg"


# What Flower 1.42's ServerApp process does with the app (flwr/superlink/runtime/run_serverapp.py; the
# simulation's flwr/simulation/app.py alike): load and run it, log an exception it raises with
# ``exc_info`` and mark the run failed; a run whose app returns is marked completed.
SERVERAPP_PROCESS = '''
import json, sys
from logging import ERROR
from flwr.app import Context, RecordDict
from flwr.server.run_serverapp import run
from flwr.supercore.logger import log

for run_config in json.loads(sys.argv[1]):
    context = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=run_config)
    try:
        run(grid=None, context=context, server_app_dir=".", server_app_attr="kfca_llm.flower.server_app:app")
        print("completed")
    except Exception as ex:
        log(ERROR, "%s raised an exception", "ServerApp", exc_info=ex)
        print("failed")
'''


def test_a_wrong_setting_fails_the_flower_run_with_one_input_error_line_and_no_traceback(tmp_path):
    """``flwr run . --run-config "recipe='tny'"``, and a resume with a changed scoring setting."""
    import json
    import subprocess
    import sys

    from kfca_llm.flower.server_app import build_strategy

    ledger = {**CONFIG, "kfca.ledger": str(tmp_path / "rewards.sqlite")}
    build_strategy(recipe_from_config(ledger), ledger)  # the run a resume continues (identity "auto")
    configs = [{"recipe": "tny"}, {**ledger, "kfca.resume": True, "kfca.identity": "public-key"}]
    done = subprocess.run([sys.executable, "-c", SERVERAPP_PROCESS, json.dumps(configs)], capture_output=True,
                          text=True, timeout=300, cwd=tmp_path)
    assert done.stdout.split() == ["failed", "failed"], done.stderr  # the app raised: Flower marks the runs failed
    assert "Traceback" not in done.stderr
    errors = [line for line in done.stderr.splitlines() if "InputError" in line]
    assert len(errors) == 2, done.stderr
    assert "ServerApp raised an exception: InputError: no recipe file 'tny'" in errors[0]
    assert "InputError: cannot resume: scoring setting 'identity'" in errors[1]


def test_kfca_reference_rows_makes_the_server_app_train_simulates_reference_each_round(tmp_path, monkeypatch):
    """``kfca.reference-rows = N``: the ServerApp's strategy trains the reference on the recipe's N held-out rows
    from the round's global arrays, seeded by the round (``fl.client.train_reference``, what simulate calls), and
    scores it as a peer of every participant: two nodes, no pool yet, and round 1 is not undetermined."""
    from flower_local import LocalGrid

    from kfca_llm.data import load_reference_examples
    from kfca_llm.fl.client import train_reference
    from kfca_llm.fl.reference import REFERENCE
    from kfca_llm.fl.training_plan import TrainingPlan
    from kfca_llm.flower.server_app import build_strategy
    from kfca_llm.flower.task import _model, recipe_key

    config = {**CONFIG, "kfca.ledger": str(tmp_path / "rewards.sqlite"), "kfca.reference-rows": 8,
              "kfca.reference-weight": 2.0}
    recipe = recipe_from_config(config, num_partitions=2)
    strategy = build_strategy(recipe, config)
    assert strategy.reference is not None and strategy.reference_weight == 2.0

    global1 = initial_adapter(recipe)
    model, tokenizer, _ = _model(recipe_key(recipe))
    rows = load_reference_examples(recipe, tokenizer, 8)
    expected = train_reference(model, global1, rows, TrainingPlan.of(recipe), server_round=2,
                               device=torch.device("cpu"), pad_token_id=tokenizer.pad_token_id or tokenizer.eos_token_id)
    numpy_global = {k: v.numpy().copy() for k, v in global1.items()}
    second = strategy.reference(numpy_global, server_round=2)
    assert all(np.array_equal(second[k], expected[k].numpy()) for k in global1)  # simulate's reference of round 2
    assert not all(np.array_equal(second[k], v) for k, v in strategy.reference(numpy_global, server_round=1).items())

    def node(partition):
        return lambda msg: train_reply(msg, node_context({"partition-id": partition, "num-partitions": 2}), config)

    strategy.start(grid=LocalGrid({11: node(0), 12: node(1)}), initial_arrays=ArrayRecord(global1), num_rounds=2)
    assert sorted(strategy.reports) == [1, 2]
    for report in strategy.reports.values():
        assert all(REFERENCE in peers for peers in report.peers.values()) and REFERENCE not in report.rewards
    assert strategy.undetermined == {1: (), 2: ()}
    # Without it the same two nodes leave round 1 undetermined (no pool yet).
    plain_config = {**CONFIG, "kfca.ledger": str(tmp_path / "p.sqlite")}
    plain = build_strategy(recipe_from_config(plain_config, num_partitions=2), plain_config)
    assert plain.reference is None
    plain.start(grid=LocalGrid({11: node(0), 12: node(1)}), initial_arrays=ArrayRecord(global1), num_rounds=1)
    assert len(plain.undetermined[1]) == 2
    # A real data set sets the reference's rows aside (kfca_llm.data.real_split); one too small to leave rows to
    # train on fails the app before round 1, naming both keys.
    import datasets

    from kfca_llm import data
    from kfca_llm.synthetic import make_rows

    monkeypatch.setattr(data, "_load_real", lambda recipe, data_dir: datasets.Dataset.from_list(
        make_rows("general-nlp", 70, seed=0)))
    with pytest.raises(InputError, match="heldout-rows = 64 and kfca.reference-rows = 8 leaves none to train on"):
        build_strategy(recipe_from_config({**config, "dataset.name": "someone/real-data"}), config)


def test_two_nodes_and_the_apps_default_attacker_stop_the_run_at_round_1_with_the_nodes_error(tmp_path):
    """``flwr run .`` without --federation-config: 2 SuperNodes, ``kfca.attackers = "3=flip"``. Each ClientApp
    raises; Flower turns that into an error reply (as its simulation engine does, ``vce_api.py``), and the
    ServerApp's strategy stops the run with the nodes' error instead of running every round on "0 results"."""
    from flower_local import LocalGrid
    from flwr.app import Error

    from kfca_llm.flower.replies import EveryNodeFailed
    from kfca_llm.flower.server_app import build_strategy

    config = {**declared_config(), **CONFIG, "kfca.ledger": str(tmp_path / "rewards.sqlite")}

    def flower_node(partition):
        def answer(message):
            context = Context(run_id=1, node_id=partition, state=RecordDict(), run_config=config,
                              node_config={"partition-id": partition, "num-partitions": 2})
            try:
                return train_reply(message, context, config)
            except Exception as ex:
                return Message(Error(code=2, reason=str(type(ex)) + ":<'" + str(ex) + "'>"), reply_to=message)
        return answer

    recipe = recipe_from_config(config)
    strategy = build_strategy(recipe, config)
    with pytest.raises(EveryNodeFailed, match=r"round 1: all 2 nodes replied with an error, so the run stops; the "
                                              r"first: .*RecipeError.*kfca.attackers.*outside 0..1"):
        strategy.start(grid=LocalGrid({1: flower_node(0), 2: flower_node(1)}),
                       initial_arrays=ArrayRecord(initial_adapter(recipe)), num_rounds=recipe.num_server_rounds)
