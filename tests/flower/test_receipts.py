"""Signed receipts: the server key's handling, delivery through Flower messages, what a node keeps."""

import json
import os
import stat

import pytest

pytest.importorskip("flwr", reason="Flower is the optional extra kfca-llm[flower] (make install installs it)")

from flower_local import LocalGrid, initial_arrays, numpy_node, pid  # noqa: E402
from flwr.app import ConfigRecord  # noqa: E402
from flwr.serverapp.strategy import FedAvg  # noqa: E402

from kfca_llm import InputError  # noqa: E402
from kfca_llm.flower import KFCAStrategy, read_ledger, verify_ledger  # noqa: E402
from kfca_llm.flower.receipts import (RECEIPTS_RECORD, load_or_create_server_key, public_hex,  # noqa: E402
                                      read_public_key, receipts_in_message, save_receipts)

NODES = {1: "honest", 2: "honest", 3: "honest", 4: "flip"}


def keeping(kind, folder, seen):
    """A numpy node that keeps the receipts its messages carry (by message type) and trains as ``kind``."""
    answer = numpy_node(kind)

    def reply(message):
        texts = receipts_in_message(message.content.config_records)
        seen.append((message.metadata.message_type, len(texts)))
        save_receipts(texts, folder)
        return answer(message)

    return reply


def serve(tmp_path, *, rounds=3, evaluate=0.0, **options):
    seen = {n: [] for n in NODES}
    strategy = KFCAStrategy(FedAvg(fraction_evaluate=evaluate), ledger=tmp_path / "rewards.sqlite", seed=1,
                            receipt_key=tmp_path / "server.key", **options)
    grid = LocalGrid({n: keeping(kind, tmp_path / f"node{n}", seen[n]) for n, kind in NODES.items()})
    strategy.start(grid=grid, initial_arrays=initial_arrays(), num_rounds=rounds)
    return strategy, seen


def test_each_paid_participant_gets_its_rounds_receipts_in_its_next_messages(tmp_path):
    strategy, seen = serve(tmp_path, rounds=3)
    # Round t's receipt rides in round t+1's training message (no evaluate round here): the last stays due.
    assert seen[4] == [("train", 0), ("train", 1), ("train", 1)]
    assert sorted(strategy._post.due) == sorted(pid(n) for n in NODES)
    contents = read_ledger(tmp_path / "rewards.sqlite")
    for node in NODES:
        bodies = [json.loads(p.read_text())["receipt"] for p in sorted((tmp_path / f"node{node}").iterdir())]
        assert sorted(b["round"] for b in bodies) == [1, 2]
        for body in bodies:
            (row,) = [r for r in contents.rewards if (r.round, r.participant) == (body["round"], pid(node))]
            (round_row,) = [r for r in contents.rounds if r.round == body["round"]]
            assert (body["reward"], body["sign_sha256"], body["chain_hash"]) == (row.reward, row.sign_sha256,
                                                                                round_row.chain_hash)


def test_the_evaluate_round_delivers_the_last_rounds_receipt(tmp_path):
    strategy, seen = serve(tmp_path, rounds=2, evaluate=1.0)
    # Round t's evaluate message carries round t's receipt; the node's reply to it ends the delivery.
    assert seen[1] == [("train", 0), ("evaluate", 1), ("train", 0), ("evaluate", 1)]
    assert strategy._post.due == {}  # every node replied to a message carrying its receipts
    assert len(list((tmp_path / "node1").iterdir())) == 2
    check = verify_ledger(tmp_path / "rewards.sqlite", receipts=tmp_path / "node1",
                          server_key=tmp_path / "server.key.pub")
    assert check.ok and check.receipts_checked == 2 and check.receipt_errors == []


def test_the_server_key_is_private_its_public_half_published_and_recorded_in_the_ledger(tmp_path):
    strategy, _ = serve(tmp_path, rounds=1)
    assert stat.S_IMODE(os.stat(tmp_path / "server.key").st_mode) == 0o600
    published = read_public_key(tmp_path / "server.key.pub")
    assert public_hex(published) == strategy.receipt_key == read_ledger(tmp_path / "rewards.sqlite").runs[0].receipt_key
    assert public_hex(read_public_key(strategy.receipt_key)) == strategy.receipt_key  # the 64 hex digits work too
    # The next start signs with the same key (it is read, not replaced).
    assert public_hex(load_or_create_server_key(tmp_path / "server.key").public_key()) == strategy.receipt_key


def test_a_resumed_run_must_sign_with_the_key_its_receipts_were_signed_with(tmp_path):
    serve(tmp_path, rounds=1)
    with pytest.raises(InputError, match="cannot resume: the run's receipts are signed with the server key"):
        KFCAStrategy(FedAvg(), ledger=tmp_path / "rewards.sqlite", seed=1, resume=True,
                     receipt_key=tmp_path / "other.key")
    with pytest.raises(InputError, match="receipt_key needs a ledger"):
        KFCAStrategy(FedAvg(), ledger=None, receipt_key=tmp_path / "server.key")


@pytest.mark.parametrize("content, why", [(b"not a key", "not an unencrypted PEM private key"),
                                          (None, "is not a regular file")])
def test_a_bad_server_key_file_is_one_clear_error(tmp_path, content, why):
    path = tmp_path / "server.key"
    if content is None:
        path.mkdir()
    else:
        path.write_bytes(content)
    with pytest.raises(InputError, match=why):
        KFCAStrategy(FedAvg(), ledger=tmp_path / "rewards.sqlite", receipt_key=path)


def test_a_node_keeps_only_well_formed_receipts(tmp_path):
    strategy, _ = serve(tmp_path, rounds=2)
    good = next(iter(strategy._post.due.values()))[0]
    record = {RECEIPTS_RECORD: ConfigRecord({"receipts": [good, "{", json.dumps({"receipt": {}, "signature": "x"}),
                                                           "[" * 50_000]})}
    kept = save_receipts(receipts_in_message(record), tmp_path / "kept")
    assert [p.read_text() for p in kept] == [good]
    assert save_receipts(receipts_in_message(record), tmp_path / "kept") == kept  # the same file, not a second


def test_the_recipes_client_app_keeps_its_receipts_in_its_receipts_dir(tmp_path):
    from flower_local import set_task_identity
    from flwr.app import ArrayRecord, Context, Message, RecordDict

    from kfca_llm.flower.client_app import train_reply
    from kfca_llm.flower.task import initial_adapter, recipe_from_config

    strategy, _ = serve(tmp_path, rounds=1)
    due = strategy._post.due[pid(4)]
    config = {"train.training-arguments.max-steps": 1, "num-server-rounds": 2}
    set_task_identity()
    content = RecordDict({"arrays": ArrayRecord(initial_adapter(recipe_from_config(config, num_partitions=4))),
                          "config": ConfigRecord({"server-round": 2}), RECEIPTS_RECORD: ConfigRecord({"receipts": due})})
    context = Context(run_id=1, node_id=11, state=RecordDict(), run_config={},
                      node_config={"num-partitions": 4, "partition-id": 1, "receipts-dir": str(tmp_path / "mine")})
    train_reply(Message(content, dst_node_id=11, message_type="train"), context, config)
    assert [p.read_text() for p in (tmp_path / "mine").iterdir()] == due
    check = verify_ledger(tmp_path / "rewards.sqlite", receipts=tmp_path / "mine", server_key=tmp_path / "server.key.pub")
    assert check.ok and check.receipts_checked == 1
