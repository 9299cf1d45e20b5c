"""docs/few-peers.md shows what the code does: its settings table, the log line, the ledger's CSV header and
commands that parse."""

import importlib.util
import inspect
import logging
import random
import shlex
import sys

import pytest

pytest.importorskip("flwr", reason="Flower is the optional extra kfca-llm[flower] (make install installs it)")

from flwr.serverapp.strategy import FedAvg  # noqa: E402
from flower_local import LocalGrid, initial_arrays, numpy_node  # noqa: E402

sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[1]))
from doc_pages import ROOT, fenced_blocks, markdown_table, one_block, page  # noqa: E402

from kfca_llm.cli import build_parser, main  # noqa: E402
from kfca_llm.fl.peer_pool import PoolSettings  # noqa: E402
from kfca_llm.flower import KFCAStrategy  # noqa: E402
from kfca_llm.flower.ledger_rows import DISTINGUISHABLE_Z  # noqa: E402
from kfca_llm.recipe import KfcaConfig  # noqa: E402

PAGE = "docs/few-peers.md"


def test_settings_table_is_the_strategys_the_recipes_and_the_pools_defaults():
    rows = markdown_table(page(PAGE), "| `KFCAStrategy` argument")
    signature = inspect.signature(KFCAStrategy.__init__).parameters
    recipe_fields = {info.alias: (name, info.default) for name, info in KfcaConfig.model_fields.items()}
    pool_field = {"min_peers": "min_peers", "pool_window": "window", "pool_peers": "pool_peers", "pool_weight": "weight"}
    assert [r[0].strip("`") for r in rows] == list(pool_field)
    for argument, key, default, _ in rows:
        argument, key = argument.strip("`"), key.strip("`").removeprefix("kfca.")
        assert str(signature[argument].default) == default
        assert str(recipe_fields[key][1]) == default
        assert str(getattr(PoolSettings(), pool_field[argument])) == default


def test_reference_table_is_the_strategys_and_the_recipes_defaults():
    rows = markdown_table(page(PAGE), "| reference setting")
    signature = inspect.signature(KFCAStrategy.__init__).parameters
    recipe_fields = {info.alias: info.default for info in KfcaConfig.model_fields.values()}
    assert [(r[0], r[1]) for r in rows] == [("`reference`", "`kfca.reference-rows`"),
                                             ("`reference_weight`", "`kfca.reference-weight`")]
    assert rows[0][2] == f"{signature['reference'].default} / {recipe_fields['reference-rows']}"
    assert rows[1][2] == str(signature["reference_weight"].default) == str(recipe_fields["reference-weight"])


def twenty_honest_nodes(caplog, level: int, rounds: int) -> KFCAStrategy:
    """The default strategy at 20 x 0.1 over honest numpy nodes, its log captured at ``level``."""
    random.seed(0)
    strategy = KFCAStrategy(FedAvg(fraction_train=0.1, fraction_evaluate=0.0), ledger=None)
    with caplog.at_level(level, logger="flwr"):
        strategy.start(grid=LocalGrid({n: numpy_node("honest") for n in range(1, 21)}), initial_arrays=initial_arrays(),
                       num_rounds=rounds)
    return strategy


def test_the_log_line_is_the_one_the_strategy_writes(caplog):
    shown = one_block(PAGE, "text", "is undetermined").strip()
    strategy = twenty_honest_nodes(caplog, logging.WARNING, rounds=1)
    (logged,) = [r.getMessage() for r in caplog.records if "is undetermined" in r.getMessage()]
    assert logged == shown.replace("A, B", ", ".join(strategy.undetermined[1]))


def test_the_settlement_log_line_is_the_one_the_strategy_writes(caplog):
    shown = one_block(PAGE, "text", "undetermined round 1: paid").strip()
    strategy = twenty_honest_nodes(caplog, logging.INFO, rounds=12)
    settled = [s for ss in strategy.settlements.values() for s in ss if s.round == 1]
    assert settled
    first = settled[0]
    expected = (shown.replace("round 7", f"round {first.settled_in}").replace("A's", f"{first.participant}'s")
                .replace("+0.1008", f"{first.reward:+.4f}"))
    assert expected in [r.getMessage() for r in caplog.records]


def test_the_csv_header_is_the_one_kfca_llm_ledger_prints(tmp_path, capsys):
    ledger = tmp_path / "rewards.sqlite"
    random.seed(0)
    KFCAStrategy(FedAvg(fraction_train=0.1, fraction_evaluate=0.0), ledger=ledger).start(
        grid=LocalGrid({n: numpy_node("honest") for n in range(1, 21)}), initial_arrays=initial_arrays(), num_rounds=2)
    capsys.readouterr()
    assert main(["ledger", str(ledger), "--csv"]) == 0
    printed = capsys.readouterr().out.splitlines()[0]
    assert printed == one_block(PAGE, "text", "participant,label").strip()
    assert f"more than {DISTINGUISHABLE_Z} standard errors away" in page(PAGE)


def _script_parser(path: str):
    spec = importlib.util.spec_from_file_location(path.replace("/", "_"), ROOT / path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.build_parser()


def test_every_command_of_the_page_parses():
    commands = [line for block in fenced_blocks(page(PAGE), "bash") for line in block.replace("\\\n", " ").splitlines()
                if line.strip()]
    assert len(commands) == 8
    for line in commands:
        words = shlex.split(line.split("  #")[0])
        if words[0] == "export":
            assert words[1] == "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1"
        elif words[0] == "kfca-llm":
            build_parser(words[1]).parse_args(words[1:])
        elif words[0] == "flwr":  # its --run-config keys: test_app checks them against the app's declared keys
            assert words[1:3] == ["run", "."] and "kfca.reference-rows=32" in line
        else:
            assert words[0] == ".venv/bin/python" and words[1].startswith("benchmarks/")
            _script_parser(words[1]).parse_args(words[2:])
