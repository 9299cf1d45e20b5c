"""The Flower app's node side without a simulation engine: run config -> recipe, node attacks, the ClientApp body,
and the run-config keys the pages give ``flwr run`` (the server side: test_server_app.py)."""

import pytest

pytest.importorskip("flwr", reason="Flower is the optional extra kfca-llm[flower] (make install installs it)")

import torch  # noqa: E402
from flower_app_runs import CONFIG, ROOT, declared_config, node_context, returned, train_message  # noqa: E402
from flower_local import set_task_identity  # noqa: E402
from flwr.app import ArrayRecord, ConfigRecord, Message, RecordDict  # noqa: E402

from kfca_llm import InputError  # noqa: E402
from kfca_llm.flower.client_app import train_reply  # noqa: E402
from kfca_llm.flower.task import initial_adapter, node_attack, recipe_from_config, train_partition  # noqa: E402


def test_run_config_overrides_the_named_recipe_with_flowertune_keys():
    recipe = recipe_from_config({**CONFIG, "kfca.attackers": "1=flip, 3=lagged:2", "kfca.ledger": "x.sqlite",
                                 "kfca.aggregation": "exclude-negative", "model.lora.peft-lora-r": 4},
                                num_partitions=5)
    assert recipe.name == "tiny" and recipe.num_clients == 5 and recipe.num_server_rounds == 2
    assert recipe.train.training_arguments.max_steps == CONFIG["train.training-arguments.max-steps"]
    assert recipe.model.lora.peft_lora_r == 4
    assert recipe.kfca.attackers == ("1=flip", "3=lagged:2") and recipe.kfca.attacks == ()
    with pytest.raises(InputError, match="train.training-arguments.max-stepz"):
        recipe_from_config({"train.training-arguments.max-stepz": 2})
    with pytest.raises(InputError, match="no recipe file 'nope'"):
        recipe_from_config({"recipe": "nope"})


def test_a_node_attacks_through_its_node_config_or_kfca_attackers():
    recipe = recipe_from_config({"kfca.attackers": "1=flip"}, num_partitions=4)
    assert node_attack(recipe, {"partition-id": 1}, 1) == "flip"
    assert node_attack(recipe, {"partition-id": 2}, 2) is None
    assert node_attack(recipe, {"partition-id": 2, "attack": "lagged:3"}, 2) == "lagged:3"
    with pytest.raises(InputError, match="unknown attack 'flop'"):
        node_attack(recipe, {"attack": "flop"}, 0)
    with pytest.raises(InputError, match="outside 0..3"):
        recipe_from_config({"kfca.attackers": "7=flip"}, num_partitions=4)


def test_client_app_replies_global_plus_update_and_attacks_on_its_own_history():
    recipe = recipe_from_config(CONFIG, num_partitions=4)
    global1 = initial_adapter(recipe)
    trained = train_partition(recipe, 2, global1, 1)
    honest1 = trained.update

    reply = train_reply(train_message(global1, 1), node_context({"partition-id": 2}), CONFIG)
    assert reply.content["metrics"]["num-examples"] == trained.num_examples
    assert all(torch.equal(v, global1[k] + honest1[k]) for k, v in returned(reply).items())

    flip = train_reply(train_message(global1, 1), node_context({"partition-id": 2, "attack": "flip"}), CONFIG)
    assert all(torch.equal(v, global1[k] - honest1[k]) for k, v in returned(flip).items())

    # lagged:1 replays the node's previous honest update (kept in its context state across rounds).
    lagger = node_context({"partition-id": 2, "attack": "lagged:1"})
    train_reply(train_message(global1, 1), lagger, CONFIG)
    global2 = {k: v + 0.01 for k, v in global1.items()}
    lagged = train_reply(train_message(global2, 2), lagger, CONFIG)
    assert all(torch.equal(v, global2[k] + honest1[k]) for k, v in returned(lagged).items())


@pytest.mark.parametrize("dynamic", [False, True])
def test_a_node_trains_on_the_same_samples_every_round_unless_the_data_seed_is_dynamic(dynamic):
    """FlowerTune's ``train.dynamic-data-seed``: false, a node's participations train the same samples in the same
    order (at one learning rate from one global: the same update); true, the order is seeded by the round."""
    recipe = recipe_from_config({**CONFIG, "train.learning-rate-min": 3e-3, "train.learning-rate-max": 3e-3,
                                 "train.dynamic-data-seed": dynamic}, num_partitions=4)
    start = initial_adapter(recipe)
    first, again = (train_partition(recipe, 2, start, t).update for t in (1, 2))
    assert all(torch.equal(first[k], again[k]) for k in first) is not dynamic


def test_a_free_riding_node_replays_the_change_of_the_globals_it_received():
    from kfca_llm.flower.client_app import RECEIVED_PREFIX

    config = {**CONFIG, "num-server-rounds": 4}
    recipe = recipe_from_config(config, num_partitions=4)
    g = torch.Generator().manual_seed(3)
    received = {t: {k: v + 0.01 * t * torch.randn(v.shape, generator=g) for k, v in initial_adapter(recipe).items()}
                for t in (1, 3, 4)}
    node = node_context({"partition-id": 2, "attack": "free-ride:1"})
    first = returned(train_reply(train_message(received[1], 1), node, config))
    assert all(torch.equal(v, received[1][k]) for k, v in first.items())  # no change seen yet: a zero update
    for before, t in ((1, 3), (3, 4)):  # not sampled in round 2: its step spans rounds 1-3
        honest = train_partition(recipe, 2, received[t], t).update
        submitted = returned(train_reply(train_message(received[t], t), node, config))
        update = {k: v - received[t][k] for k, v in submitted.items()}
        for k, v in update.items():
            step = received[t][k] - received[before][k]
            assert torch.allclose(v, step * (honest[k].norm() / step.norm()), rtol=1e-4, atol=1e-6), (t, k)
    assert sorted(k for k in node.state.array_records if k.startswith(RECEIVED_PREFIX)) == [
        f"{RECEIVED_PREFIX}3", f"{RECEIVED_PREFIX}4"]  # free-ride:1 reads two globals: older ones are dropped


def test_client_app_evaluates_the_global_adapter_it_is_sent_on_the_held_out_rows():
    """Flower's evaluate round: the reply's loss and accuracy are those of the adapter in the message, measured
    again here on another model instance, whichever adapter the node's cached model last held (the trained
    one, then the initial one, then the trained one again)."""
    from kfca_llm.data import load_heldout_examples
    from kfca_llm.fl.client import load_adapter_state
    from kfca_llm.fl.evaluate import evaluate_adapter
    from kfca_llm.flower.client_app import evaluate_reply
    from kfca_llm.modeling import load_model_and_tokenizer

    recipe = recipe_from_config(CONFIG, num_partitions=4)
    initial = initial_adapter(recipe)
    trained = {k: initial[k] + v for k, v in train_partition(recipe, 2, initial, 1).update.items()}
    model, tokenizer = load_model_and_tokenizer(recipe, device="cpu")
    examples = load_heldout_examples(recipe, tokenizer)

    def expected(state):
        load_adapter_state(model, state)
        return evaluate_adapter(model, examples, tokenizer.pad_token_id, torch.device("cpu"))

    assert abs(expected(trained)["loss"] - expected(initial)["loss"]) > 1e-3  # the two adapters tell apart
    set_task_identity()
    for state in (trained, initial, trained):
        message = Message(RecordDict({"arrays": ArrayRecord(state), "config": ConfigRecord({"server-round": 1})}),
                          dst_node_id=11, message_type="evaluate")
        metrics = evaluate_reply(message, node_context({"partition-id": 2}), CONFIG).content["metrics"]
        want = expected(state)
        assert metrics["num-examples"] == want["rows"] == len(examples) > 0
        assert metrics["eval-loss"] == pytest.approx(want["loss"], rel=1e-5)
        assert metrics["eval-accuracy"] == want["accuracy"]


def test_every_app_key_and_every_run_config_key_the_pages_use_is_declared_for_flwr_run():
    """``flwr run`` refuses a --run-config key the app's pyproject does not declare (Flower's own check, run
    here: ``fuse_dicts(..., check_keys=True)``); the declared app keys keep the code's defaults."""
    import re

    from doc_pages import page_names
    from flwr.common.config import fuse_dicts, parse_config_args

    from kfca_llm.flower.task import APP_KEYS

    declared = declared_config()
    assert set(APP_KEYS) <= set(declared)
    assert (declared["kfca.keep-signs"], declared["kfca.identity"], declared["kfca.resume"]) == (True, "auto", False)
    commands = [c for name in page_names()
                for c in re.findall(r"flwr run \. .*?--run-config \"([^\"]+)\"", (ROOT / name).read_text())]
    assert len(commands) >= 4  # the README's, and docs/flower.md's operator flow and local simulation
    for overrides in commands:
        fuse_dicts(declared, parse_config_args([overrides.replace("$PWD", "/srv")]), check_keys=True)


def local_simulation_commands() -> dict[str, list[str]]:
    """Page -> its ``flwr run .`` commands without a SuperLink connection (Flower's local simulation), each with
    its continuation lines joined."""
    import shlex

    from doc_pages import fenced_blocks, page, page_names

    found = {}
    for name in page_names():
        for block in fenced_blocks(page(name), "bash"):
            for command in block.replace("\\\n", " ").splitlines():
                words = shlex.split(command, comments=True)
                if words[:3] == ["flwr", "run", "."] and (len(words) == 3 or words[3].startswith("-")):
                    found.setdefault(name, []).append(words)
    return found


def test_the_pages_local_flwr_runs_start_enough_nodes_for_the_apps_attacker_and_skip_flowers_uv_sync():
    """Without --federation-config Flower starts 2 SuperNodes; the app's default kfca.attackers names partition 3,
    so every node failed. Without FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION the local SuperLink uv-syncs."""
    import re

    from doc_pages import page

    highest = max(int(part.split("=")[0]) for part in declared_config()["kfca.attackers"].split(","))
    commands = local_simulation_commands()
    assert {"README.md", "docs/flower.md", "docs/few-peers.md", "docs/robust-aggregation.md"} <= set(commands)
    for name, runs in commands.items():
        assert "export FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1" in page(name), name
        for words in runs:
            assert "--federation-config" in words, (name, words)
            federation = words[words.index("--federation-config") + 1]
            assert int(re.search(r"num-supernodes=(\d+)", federation)[1]) > highest, (name, words)
