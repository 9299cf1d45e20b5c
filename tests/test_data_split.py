"""A real data set's rows set aside for the held-out evaluation and the trusted reference (``data.real_split``),
through the real loading path (``datasets.save_to_disk`` / ``load_from_disk``)."""

import datasets
import numpy as np
import pytest

from helpers import TINY
from kfca_llm.data import (
    encode_example, format_example, load_client_datasets, load_heldout_examples, load_reference_examples, real_split,
)
from kfca_llm.modeling import build_byte_tokenizer
from kfca_llm.recipe import load_recipe
from kfca_llm.synthetic import make_rows


def _recipe(*keys):
    return load_recipe(TINY, ["dataset.name=someone/finance-rows", "num-clients=4", *keys])


@pytest.mark.parametrize("held, reference", [(10, 0), (10, 7), (0, 5), (25, 25)])
def test_the_split_sets_rows_aside_disjoint_and_covers_the_rest(held, reference):
    recipe = _recipe(f"dataset.heldout-rows={held}", f"kfca.reference-rows={reference}", "kfca.seed=3")
    heldout, ref, train = real_split(101, recipe)
    assert (len(heldout), len(ref), len(train)) == (held, reference, 101 - held - reference)
    assert sorted([*heldout, *ref, *train]) == list(range(101))
    # The held-out rows stay where they are when the reference's count changes, and move with the seed.
    assert np.array_equal(heldout, real_split(101, _recipe(f"dataset.heldout-rows={held}", "kfca.seed=3"))[0])
    if held:
        assert not np.array_equal(heldout, real_split(101, _recipe(f"dataset.heldout-rows={held}", "kfca.seed=4"))[0])


def test_with_nothing_set_aside_the_clients_rows_are_the_plain_seeded_subsample():
    recipe = _recipe("dataset.heldout-rows=0", "dataset.num-rows=30", "kfca.seed=9")
    assert np.array_equal(real_split(101, recipe)[2],
                          np.sort(np.random.default_rng(9).choice(101, 30, replace=False)))
    # With rows set aside, the subsample is drawn from the rest only.
    heldout, _, train = real_split(101, _recipe("dataset.heldout-rows=20", "dataset.num-rows=30", "kfca.seed=9"))
    assert len(train) == 30 and not set(train) & set(heldout)


def test_a_split_that_leaves_nothing_to_train_on_is_refused_naming_both_keys():
    with pytest.raises(ValueError, match="dataset.heldout-rows = 60 and kfca.reference-rows = 41 leaves none"):
        real_split(101, _recipe("dataset.heldout-rows=60", "kfca.reference-rows=41"))


def test_held_out_and_reference_rows_of_a_saved_data_set_are_never_a_clients(tmp_path):
    rows = make_rows("general-nlp", 90, seed=1)
    for k, row in enumerate(rows):  # every row distinct, so that rows can be told apart by their encoding
        row["instruction"] = f"{row['instruction']} #{k}"
    datasets.DatasetDict({"train": datasets.Dataset.from_list(rows)}).save_to_disk(str(tmp_path))
    recipe = load_recipe(TINY, ["num-clients=4", "dataset.heldout-rows=12", "kfca.reference-rows=8", "kfca.seed=2"])
    tok = build_byte_tokenizer()
    heldout = load_heldout_examples(recipe, tok, data_dir=tmp_path)
    reference = load_reference_examples(recipe, tok, 8, data_dir=tmp_path)
    clients = load_client_datasets(recipe, tok, data_dir=tmp_path)
    held_index, ref_index, _ = real_split(90, recipe)

    def encoded(indices):
        return [encode_example(tok, *format_example(rows[i], recipe.domain, prompt_format=recipe.train.prompt_format,
                                                    tokenizer=tok), recipe.train.seq_length)["input_ids"]
                for i in indices]

    assert [e["input_ids"] for e in heldout] == encoded(held_index)
    assert [e["input_ids"] for e in reference] == encoded(ref_index)
    trained = {tuple(e["input_ids"]) for client in clients for e in client}
    assert len(trained) == 4 * (70 // 4)
    assert not trained & {tuple(e["input_ids"]) for e in [*heldout, *reference]}
    with pytest.raises(ValueError, match="sets aside kfca.reference-rows = 8 rows"):
        load_reference_examples(recipe, tok, 5, data_dir=tmp_path)


def test_no_held_out_rows_means_no_evaluation(tmp_path):
    recipe = load_recipe(TINY, ["dataset.heldout-rows=0"])
    assert load_heldout_examples(recipe, build_byte_tokenizer()) == []


def test_simulate_on_a_data_set_too_small_for_its_held_out_rows_prints_one_error_line(tmp_path, capsys):
    from kfca_llm.cli import main

    datasets.DatasetDict({"train": datasets.Dataset.from_list(make_rows("general-nlp", 30, seed=0))}).save_to_disk(
        str(tmp_path / "data"))
    capsys.readouterr()  # the data set's own saving progress
    assert main(["simulate", "--data-dir", str(tmp_path / "data"), "--rounds", "1", "--out", str(tmp_path / "run"),
                 "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "kfca-llm: error: the data set has 30 rows" in err and "heldout-rows = 64" in err
