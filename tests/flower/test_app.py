"""The Flower app's pieces without a simulation engine: run config -> recipe, node attacks, the ClientApp body."""

import pytest

pytest.importorskip("flwr", reason="Flower is the optional extra kfca-llm[flower] (make install installs it)")

import torch  # noqa: E402
from flower_local import set_task_identity  # noqa: E402
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, RecordDict  # noqa: E402

from kfca_llm import InputError  # noqa: E402
from kfca_llm.flower.client_app import train_reply  # noqa: E402
from kfca_llm.flower.task import initial_adapter, node_attack, recipe_from_config, train_partition  # noqa: E402

CONFIG = {"train.training-arguments.max-steps": 1, "num-server-rounds": 2}


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


def test_the_server_app_pays_copies_by_the_recipes_kfca_duplicates(tmp_path):
    from kfca_llm.flower.server_app import build_strategy

    ledger = {"kfca.ledger": str(tmp_path / "rewards.sqlite")}
    assert build_strategy(recipe_from_config(CONFIG), ledger).duplicates == "zero"
    split = recipe_from_config({**CONFIG, "kfca.duplicates": "split"})
    assert build_strategy(split, ledger).duplicates == "split"


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
    with pytest.raises(InputError, match="cannot resume: scoring setting 'identity'"):
        build_strategy(recipe, {**config, "kfca.resume": True, "kfca.identity": "public-key"})


def test_a_node_attacks_through_its_node_config_or_kfca_attackers():
    recipe = recipe_from_config({"kfca.attackers": "1=flip"}, num_partitions=4)
    assert node_attack(recipe, {"partition-id": 1}, 1) == "flip"
    assert node_attack(recipe, {"partition-id": 2}, 2) is None
    assert node_attack(recipe, {"partition-id": 2, "attack": "lagged:3"}, 2) == "lagged:3"
    with pytest.raises(InputError, match="unknown attack 'flop'"):
        node_attack(recipe, {"attack": "flop"}, 0)
    with pytest.raises(InputError, match="outside 0..3"):
        recipe_from_config({"kfca.attackers": "7=flip"}, num_partitions=4)


def _message(arrays, server_round):
    set_task_identity()
    content = RecordDict({"arrays": ArrayRecord(arrays), "config": ConfigRecord({"server-round": server_round})})
    return Message(content, dst_node_id=11, message_type="train")


def _context(node_config):
    return Context(run_id=1, node_id=11, node_config={"num-partitions": 4, **node_config}, state=RecordDict(),
                   run_config={})


def _returned(reply):
    return {k: torch.from_numpy(a.numpy()) for k, a in reply.content["arrays"].items()}


def test_client_app_replies_global_plus_update_and_attacks_on_its_own_history():
    recipe = recipe_from_config(CONFIG, num_partitions=4)
    global1 = initial_adapter(recipe)
    trained = train_partition(recipe, 2, global1, 1)
    honest1 = trained.update

    reply = train_reply(_message(global1, 1), _context({"partition-id": 2}), CONFIG)
    assert reply.content["metrics"]["num-examples"] == trained.num_examples
    assert all(torch.equal(v, global1[k] + honest1[k]) for k, v in _returned(reply).items())

    flip = train_reply(_message(global1, 1), _context({"partition-id": 2, "attack": "flip"}), CONFIG)
    assert all(torch.equal(v, global1[k] - honest1[k]) for k, v in _returned(flip).items())

    # lagged:1 replays the node's previous honest update (kept in its context state across rounds).
    lagger = _context({"partition-id": 2, "attack": "lagged:1"})
    train_reply(_message(global1, 1), lagger, CONFIG)
    global2 = {k: v + 0.01 for k, v in global1.items()}
    lagged = train_reply(_message(global2, 2), lagger, CONFIG)
    assert all(torch.equal(v, global2[k] + honest1[k]) for k, v in _returned(lagged).items())


def test_every_app_key_and_every_run_config_key_the_pages_use_is_declared_for_flwr_run():
    """``flwr run`` refuses a --run-config key the app's pyproject does not declare (Flower's own check, run
    here: ``fuse_dicts(..., check_keys=True)``); the declared app keys keep the code's defaults."""
    import re
    import tomllib
    from pathlib import Path

    from doc_pages import page_names
    from flwr.common.config import flatten_dict, fuse_dicts, parse_config_args

    from kfca_llm.flower.task import APP_KEYS

    root = Path(__file__).resolve().parents[2]
    declared = flatten_dict(tomllib.loads((root / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"])
    assert set(APP_KEYS) <= set(declared)
    assert (declared["kfca.keep-signs"], declared["kfca.identity"], declared["kfca.resume"]) == (False, "auto", False)
    commands = [c for name in page_names()
                for c in re.findall(r"flwr run \. .*?--run-config \"([^\"]+)\"", (root / name).read_text())]
    assert len(commands) >= 4  # the README's, and docs/flower.md's operator flow and local simulation
    for overrides in commands:
        fuse_dicts(declared, parse_config_args([overrides.replace("$PWD", "/srv")]), check_keys=True)


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
