"""``benchmarks/flowertune_app.py`` and ``flowertune_assets.py``: the parts that are ours (the tiny model, tokenizer
and data set it builds, the changes it makes to Flower's app, the figures it counts); none needs Flower's
repository."""

import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import flowertune_app as app  # noqa: E402
import flowertune_assets as assets  # noqa: E402

# KFCA's own-resubmission warnings as kfca_llm.flower.round_scoring logs them (Flower's log prefix included).
W = "\x1b[93mWARNING \x1b[0m:   KFCA: round "
COPY = "a copy, scored on this round's peers without the pool and paid at most 0"
LOG = (f"{W}7: name:partition-3 resubmitted an earlier update of their own (name:partition-3@2): {COPY} (-0.0123); "
       "charged back 0.0456, what that update was paid\n"
       f"{W}9: name:partition-5 resubmitted an earlier update of their own (name:partition-5@4): {COPY} (+0.0000); "
       "nothing to charge back (charged already, or not paid)\n"
       f"{W}9: name:partition-0 resubmitted an earlier update of their own (name:partition-0@6): {COPY} (-0.2000); "
       "charged back 0.1000, what that update was paid\n"
       f"{W}11: name:partition-12 resubmitted an earlier update of their own (own resubmission: scored without the "
       "pool, on this round's peers, the pool's term counted as 0)\n"
       f"{W}12 is undetermined for name:partition-1: fewer than min_peers=2 distinct peers\n"
       f"{W}13: name:partition-4's update turned against its own earlier ones (it reverses name:partition-4@8, which "
       "its rounds judged honest): paid at most 0 (-0.0100); forfeited 0.0300, what name:partition-4@8 had been paid "
       "(pool rule 8)\n")


def test_resubmissions_reads_each_form_of_kfcas_warning():
    assert app.resubmissions(LOG) == {7: {"name:partition-3": 0.0456},
                                      9: {"name:partition-5": 0.0, "name:partition-0": 0.1},
                                      11: {"name:partition-12": None}}
    assert app.partition("name:partition-12") == 12
    assert app.forfeits(LOG) == {13: {"name:partition-4"}}


def test_figures_count_honest_participations_resubmissions_and_the_flippers_meetings():
    rounds = [{"round": 1, "rewards": {"1": 0.0, "2": 0.0}, "undetermined": [1, 2]},
              {"round": 7, "rewards": {"0": -0.3, "3": 0.2}, "undetermined": []},     # right
              {"round": 8, "rewards": {"0": 0.1, "2": -0.05}, "undetermined": []},    # wrong, honest < 0
              {"round": 9, "rewards": {"0": -0.1, "5": 0.0}, "undetermined": []},     # wrong: partner not > 0
              {"round": 10, "rewards": {"3": 0.1, "5": 0.0}, "undetermined": [], "forfeited": [3]}]
    f = app.figures(rounds, LOG)
    assert f["honest_participations"] == 7
    assert f["honest_taken_for_own_resubmissions"] == 2           # partitions 3 and 5, not the flipper, not round 11's
    assert f["honest_charged_back"] == 1 and f["honest_charged_back_sum"] == pytest.approx(0.0456)
    assert f["honest_paid_below_0"] == 1
    assert f["honest_forfeits"] == 1                                # round 10's (a round without the key: none)
    assert f["honest_nodes_at_0"] == 2 and f["honest_nodes"] == 4   # 1 and 5 total 0; 2 totals -0.05
    assert [(m["round"], m["right"]) for m in f["flipper_meetings"]] == [(7, True), (8, False), (9, False)]
    assert f["flipper_partners_right"] == 1
    assert f["mean_reward"]["0"] == pytest.approx(-0.1) and f["participations"] == {"0": 3, "1": 1, "2": 2, "3": 2,
                                                                                     "5": 2}
    assert f["flipper_below_every_honest"]                           # -0.1 < -0.025 (node 2), 0, 0, +0.15
    rounds[2]["rewards"]["2"] = -0.5                                  # node 2's mean -0.25 is now below the flipper's
    assert not app.figures(rounds, LOG)["flipper_below_every_honest"]
    f["sign_identical"] = [(0, [7, 9]), (3, [7, 10]), (5, [2, 4, 9])]   # the flipper's left out: 1 + 2
    run = {"rule": "3 (0.02)", "name": "r", "figures": f, "wall_s": 61.2, "utc": "2026-11-28 17:00", "load": "1 2 3"}
    row = "| 3 (0.02) | r | 7 | 2 | 1 | 1 | 3 | - | 1 | 2 of 4 | 1 of 3 | yes | 61 s | 2026-11-28 17:00 | ? -> 1 2 3 |"
    assert app.table([run]).splitlines()[2] == row  # a run without value sketches (before pool rule 11)
    f.update(honest_own_pairs=40, honest_own_pairs_same_values=0, honest_own_pairs_least_apart=0.96)
    assert app.table([run]).splitlines()[2] == row.replace("| - |", "| 0 of 40 (0.96) |")


def test_identical_signs_names_each_participant_whose_packed_signs_repeat():
    rows = [SimpleNamespace(participant=f"name:partition-{p}", round=t, sign_sha256=h)
            for p, t, h in ((3, 9, "b"), (3, 2, "b"), (3, 5, "c"), (4, 5, "b"), (1, 1, "a"), (1, 7, "a"), (1, 8, "a"))]
    assert app.identical_signs(rows) == [(1, [1, 7, 8]), (3, [2, 9])]   # not 3@5 (other signs), not 4@5 (another node)


def fake_app(root: Path) -> Path:
    """The lines of Flower's general-NLP app that the benchmark changes, each once."""
    (root / "flowertune_generalnlp").mkdir(parents=True)
    (root / "pyproject.toml").write_text('[tool.flwr.app.config]\nmodel.name = "mistralai/Mistral-7B-v0.3"\n'
                                         'num-server-rounds = 200\n[tool.flwr.app.config.static]\n'
                                         'dataset.name = "flwrlabs/alpaca-gpt4"\n')
    (root / "flowertune_generalnlp" / "server_app.py").write_text(
        "def main(grid, context):\n    strategy = make()\n\n    # Start strategy, run FedAvg for `num_rounds`\n"
        "    strategy.start()\n")
    (root / "flowertune_generalnlp" / "client_app.py").write_text(
        "def train(msg, context):\n    partition_id = context.node_config['partition-id']\n"
        "    model_record = ArrayRecord(get_peft_model_state_dict(model))\n    metric_record = 1\n"
        '    content = RecordDict({"arrays": model_record, "metrics": metric_record})\n    return content\n')
    return root


def test_patch_app_changes_the_ids_wraps_the_strategy_and_refuses_another_app(tmp_path):
    dest = app.patch_app(fake_app(tmp_path / "src"), tmp_path / "dest", Path("/m"), Path("/d"))
    toml = (dest / "pyproject.toml").read_text()
    assert 'model.name = "/m"' in toml and 'dataset.name = "/d"' in toml and "kfca.own-replay-limit = -1.0" in toml
    server = (dest / "flowertune_generalnlp" / "server_app.py").read_text()
    assert server.index("KFCAStrategy(strategy") < server.index("strategy.start()")
    for name in ("server_app.py", "client_app.py"):
        compile((dest / "flowertune_generalnlp" / name).read_text(), name, "exec")
    (tmp_path / "src" / "pyproject.toml").write_text('model.name = "other"\n')
    with pytest.raises(ValueError, match="model.name"):
        app.patch_app(tmp_path / "src", tmp_path / "dest2", Path("/m"), Path("/d"))


def test_the_server_wrap_passes_the_own_replay_limit_only_when_asked(tmp_path):
    from flwr.serverapp.strategy import FedAvg

    from kfca_llm.fl.pool_store import PoolSettings

    for limit, expected in ((0.02, 0.02), (-1.0, PoolSettings().own_replay_limit)):
        scope = {"strategy": FedAvg(), "context": SimpleNamespace(run_config={
            "kfca.ledger": str(tmp_path / f"r{limit}.sqlite"), "kfca.own-replay-limit": limit})}
        exec(textwrap.dedent(app.SERVER_WRAP), scope)
        assert scope["strategy"].pool.settings.own_replay_limit == expected
        assert scope["strategy"].identity == "declared" and isinstance(scope["strategy"].strategy, FedAvg)


@pytest.mark.parametrize("partition_id", [app.FLIPPER, 1])
def test_the_client_patch_flips_partition_0s_update_and_declares_the_partition(partition_id):
    from flwr.app import ArrayRecord, MetricRecord, RecordDict

    sent, trained = {"w": torch.tensor([1.0, 2.0])}, {"w": torch.tensor([1.5, 1.0])}
    scope = {"partition_id": partition_id, "model": None, "ArrayRecord": ArrayRecord, "RecordDict": RecordDict,
             "get_peft_model_state_dict": lambda model: dict(trained), "metric_record": MetricRecord({"loss": 1.0}),
             "msg": SimpleNamespace(content={"arrays": ArrayRecord(sent)})}
    exec(textwrap.dedent(app.CLIENT_FLIP + "\n" + app.CLIENT_DECLARE), scope)
    got = scope["model_record"].to_torch_state_dict()["w"]
    expected = torch.tensor([0.5, 3.0]) if partition_id == app.FLIPPER else trained["w"]   # 2 x sent - trained
    assert torch.equal(got, expected)
    assert scope["content"]["kfca.identity"]["participant"] == f"partition-{partition_id}"


def test_build_assets_writes_a_tiny_llama_tokenizer_and_data_set_the_app_can_load(tmp_path):
    import datasets
    from transformers import AutoModelForCausalLM, AutoTokenizer

    rows = assets.alpaca_rows
    assert rows(400) == rows(400) and rows(400) != rows(400, seed=1)
    model_dir, data_dir = assets.build_assets(tmp_path, rows=400)
    rows = datasets.load_dataset(str(data_dir))["train"]
    assert rows.num_rows == 400 and set(rows.column_names) == {"instruction", "input", "output"}
    assert rows[0] == assets.alpaca_rows(400)[0]
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir), use_fast=True, padding_side="right")
    model = AutoModelForCausalLM.from_pretrained(str(model_dir))
    assert model.config.model_type == "llama" and model.config.vocab_size == len(tokenizer)
    # The app's collator masks the prompt up to "\n### Response:" tokenised without its first two tokens: those
    # must lie within the 64 tokens every example is cut to (else the example has no loss at all).
    template = tokenizer.encode("\n### Response:", add_special_tokens=False)[2:]
    assert template
    for row in assets.alpaca_rows(400):
        ids = tokenizer.encode(assets.prompt(row))[:64]
        assert any(ids[i:i + len(template)] == template for i in range(len(ids))), row


def test_own_pairs_counts_honest_repeats_of_every_sign_and_of_every_sampled_value():
    """From a ledger's rows and kept value sketches: partition 3 repeats every sign with other values (a retrain),
    partition 4 every sign and value (a replay), the flipper is left out, and a round without sketches counts none."""
    import numpy as np

    from kfca_llm.fl.pool_values import sketches_bytes

    layout = (("w", (3, 4)),)
    values = {t: {f"name:partition-{p}": np.array([np.arange(12.0) * (1 + t * (p == 3)), np.full(12, 1e-9)])
                  for p in (0, 3, 4)} for t in (1, 2)}
    store = {f"v{t}": sketches_bytes(values[t]) for t in (1, 2)}
    rounds = [SimpleNamespace(round=t, values_sha256=f"v{t}", layout=layout, valid_replies=3, signs_kept=True)
              for t in (1, 2)]
    rows = [SimpleNamespace(participant=p, round=t, sign_sha256=f"s{p[-1]}") for t in (1, 2) for p in values[t]]

    def read(sha, rows=1, size=None):
        return np.frombuffer(store[sha], dtype="<i4")

    figures = app.own_pairs(SimpleNamespace(rewards=rows, rounds=rounds), read)
    assert figures == {"honest_own_pairs": 2, "honest_own_pairs_same_signs": 2, "honest_own_pairs_same_values": 1,
                       "honest_own_pairs_least_apart": 0.0}
    rounds[1].values_sha256 = None
    assert app.own_pairs(SimpleNamespace(rewards=rows, rounds=rounds), read)["honest_own_pairs_same_values"] is None
    rounds[1].values_sha256, rounds[1].signs_kept = "v2", False  # a digest recorded, the file not kept
    assert app.own_pairs(SimpleNamespace(rewards=rows, rounds=rounds), read)["honest_own_pairs_same_values"] is None
