"""A participant's own check (``kfca-llm verify --node-update``, ``flower.node_check``): its round recorded its values
as its update has them. A value sketch rewritten in the ledger (values or slack) and re-sealed passes the chain and the
recomputation; the participant's check catches it."""

import hashlib
import json
import random
import shutil
import sqlite3
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("flwr", reason="Flower is the optional extra kfca-llm[flower] (make install installs it)")

from flower_local import LocalGrid, initial_arrays, reply_with  # noqa: E402
from flwr.app import Array, ArrayRecord  # noqa: E402
from flwr.serverapp.strategy import FedAvg  # noqa: E402
from pooled_strategy_run import update  # noqa: E402
from safetensors.numpy import save_file  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from helpers import reseal  # noqa: E402

from kfca_llm.cli import main  # noqa: E402
from kfca_llm.fl.pool_values import sketches_bytes, sketches_from_bytes, value_samples  # noqa: E402
from kfca_llm.flower import KFCAStrategy, read_ledger, verify_ledger  # noqa: E402
from kfca_llm.flower.ledger import signs_path  # noqa: E402
from kfca_llm.engine.layout import Layout  # noqa: E402

ROUND = 3


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """Four pooled rounds at two nodes a round (value sketches recorded, signs kept); each node's update as it computed
    it and the global it was sent, by (node, round)."""
    folder = tmp_path_factory.mktemp("node_check")
    sent_of, update_of = {}, {}

    def node(message):
        n, t = message.metadata.dst_node_id, int(message.content["config"]["server-round"])
        sent = {k: a.numpy() for k, a in message.content["arrays"].items()}
        sent_of[n, t], update_of[n, t] = sent, update(n, t)
        return reply_with(message, ArrayRecord({k: Array(sent[k] + u) for k, u in update_of[n, t].items()}))

    random.seed(7)
    ledger = folder / "rewards.sqlite"
    strategy = KFCAStrategy(FedAvg(fraction_train=0.1, fraction_evaluate=0.0), ledger=ledger, keep_signs=True)
    strategy.start(grid=LocalGrid({n: node for n in range(1, 21)}), initial_arrays=initial_arrays(), num_rounds=4)
    row = next(r for r in read_ledger(ledger).rewards if r.round == ROUND)
    mine, sent = folder / "mine.safetensors", folder / "sent.npz"
    save_file(update_of[int(row.node_id), ROUND], str(mine))
    np.savez(sent, **sent_of[int(row.node_id), ROUND])
    return ledger, row, mine, sent


def samples(ledger) -> int:
    """How many values the round's sketches sample (every coordinate of this small model)."""
    round_row = next(r for r in read_ledger(ledger).rounds if r.round == ROUND)
    return value_samples(Layout.from_shapes(dict(round_row.layout)))


def forged(ledger, tmp_path, row, change) -> Path:
    """A copy of ``ledger`` whose round ``ROUND`` records ``change(sketch)`` as ``row``'s participant's value sketch,
    re-sealed (what a server rewriting its ledger does)."""
    copy = tmp_path / "forged.sqlite"
    shutil.copy(ledger, copy)
    shutil.copytree(f"{ledger}.d", f"{copy}.d")
    round_row = next(r for r in read_ledger(copy).rounds if r.round == ROUND)
    samples = value_samples(Layout.from_shapes(dict(round_row.layout)))
    people = [r.participant for r in read_ledger(copy).rewards if r.round == ROUND]
    sketches = sketches_from_bytes(signs_path(copy, round_row.values_sha256).read_bytes(), people,
                                   round_row.valid_replies, samples)
    sketches[row.participant] = change(sketches[row.participant].copy())
    data = sketches_bytes(sketches)
    sha = hashlib.sha256(data).hexdigest()
    signs_path(copy, sha).write_bytes(data)
    with sqlite3.connect(copy) as conn:
        conn.execute("UPDATE rounds SET values_sha256 = ? WHERE round = ?", (sha, ROUND))
    reseal(copy)
    check = verify_ledger(copy)
    assert check.ok and check.chain_errors == [], check  # the forgery passes the ledger's own audit
    return copy


def test_the_participants_own_values_match_with_and_without_the_global(run, capsys):
    ledger, row, mine, sent = run
    assert main(["verify", str(ledger), "--node-update", str(mine), "--round", str(ROUND), "--sent", str(sent)]) == 0
    out = capsys.readouterr().out
    assert f"participant {row.participant}" in out
    assert f"value sketch: match: {samples(ledger)} sampled values within their recorded slack, the slack as the" in out
    assert main(["verify", str(ledger), "--node-update", str(mine), "--round", str(ROUND)]) == 0
    assert "the slack is not checked: give the global you were sent" in capsys.readouterr().out
    assert main(["verify", str(ledger), "--node-update", str(mine), "--round", str(ROUND), "--sent", str(sent),
                 "--json"]) == 0
    (match,) = json.loads(capsys.readouterr().out)["matches"]
    assert match["participant"] == row.participant
    assert match["values"]["status"] == "match" and match["values"]["slack_checked"] is True


def test_values_rewritten_in_the_ledger_are_caught_by_the_participant_alone(run, tmp_path, capsys):
    """The recorded values moved by ten times their slack (as an earlier update's would be): the chain holds, and the
    recomputation rebuilds the round from the forged sketch; only the participant's check fails."""
    ledger, row, mine, sent = run

    def moved(sketch):
        sketch[0] += 10 * sketch[1] + 1e-9
        return sketch

    copy = forged(ledger, tmp_path, row, moved)
    assert main(["verify", str(copy), "--node-update", str(mine), "--round", str(ROUND)]) == 1
    n = samples(ledger)
    assert f"value sketch: differ: {n} of {n} sampled values differ from this update's" in capsys.readouterr().out


def test_a_widened_slack_is_caught_given_the_global_sent(run, tmp_path, capsys):
    """The slack widened a thousandfold (values that differ would then pass as one replay's): without the global the
    participant cannot bound it, and the check says so; with it, the check fails."""
    ledger, row, mine, sent = run

    def widened(sketch):
        sketch[1] *= 1000
        return sketch

    copy = forged(ledger, tmp_path, row, widened)
    assert main(["verify", str(copy), "--node-update", str(mine), "--round", str(ROUND)]) == 0
    assert "the slack is not checked" in capsys.readouterr().out
    assert main(["verify", str(copy), "--node-update", str(mine), "--round", str(ROUND), "--sent", str(sent)]) == 1
    n = samples(ledger)
    assert f"{n} of {n} recorded slacks are wider than this update and the global" in capsys.readouterr().out


def test_a_global_of_another_shape_is_an_input_error_naming_the_tensor(run, tmp_path, capsys):
    ledger, _, mine, sent = run
    with np.load(sent) as data:
        arrays = {k: data[k] for k in data.files}
    name = sorted(arrays)[0]
    arrays[name] = arrays[name].reshape(-1)[:-1]
    bad = tmp_path / "bad.npz"
    np.savez(bad, **arrays)
    assert main(["verify", str(ledger), "--node-update", str(mine), "--round", str(ROUND), "--sent", str(bad)]) == 2
    assert f"the global sent's tensor {name!r}" in capsys.readouterr().err


def test_a_missing_sketch_file_is_damaged_and_fails_the_check(run, tmp_path, capsys):
    ledger, _, mine, _ = run
    copy = tmp_path / "missing.sqlite"
    shutil.copy(ledger, copy)
    shutil.copytree(f"{ledger}.d", f"{copy}.d")
    round_row = next(r for r in read_ledger(copy).rounds if r.round == ROUND)
    signs_path(copy, round_row.values_sha256).unlink()
    assert main(["verify", str(copy), "--node-update", str(mine), "--round", str(ROUND)]) == 1
    assert "value sketch: damaged: the round's value sketches cannot be read" in capsys.readouterr().out
