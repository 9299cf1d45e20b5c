import pytest
import torch

from kfca_llm.data import (
    ALPACA_PREAMBLE, IGNORE_INDEX, collate, encode_example, format_example, load_client_datasets, partition_iid,
)
from kfca_llm.modeling import build_byte_tokenizer
from kfca_llm.recipe import DOMAINS, load_recipe
from kfca_llm.synthetic import make_rows

from helpers import TINY

ROW = {"instruction": "Classify the tone.", "input": "Shares rose 5%.", "output": "positive"}


@pytest.fixture(scope="module")
def tok():
    return build_byte_tokenizer()


@pytest.mark.parametrize("domain, instruction", [
    ("general-nlp", "Classify the tone."),
    ("finance", "Classify the tone. Shares rose 5%."),
    ("code", "Classify the tone. Shares rose 5%."),
    ("medical", "Shares rose 5%."),
])
def test_alpaca_formatting_per_domain(domain, instruction):
    prompt, response = format_example(ROW, domain)
    assert prompt == f"{ALPACA_PREAMBLE}\n\n### Instruction:\n{instruction}\n\n### Response:\n"
    assert response == "positive"
    assert ALPACA_PREAMBLE == ("Below is an instruction that describes a task. Write a response that "
                               "appropriately completes the request.")


def test_chat_template_formatting_splits_at_the_generation_prompt(tok):
    prompt, response = format_example(ROW, "medical", prompt_format="chat-template", tokenizer=tok)
    assert prompt == "<|im_start|>user\nShares rose 5%.<|im_end|>\n<|im_start|>assistant\n"
    assert response == "positive<|im_end|>\n"
    with pytest.raises(ValueError, match="chat template"):
        format_example(ROW, "medical", prompt_format="chat-template")


def test_formatting_rejects_rows_outside_the_schema():
    with pytest.raises(ValueError, match="input"):
        format_example({"instruction": "x", "output": "y"}, "finance")
    with pytest.raises(ValueError, match="domain"):
        format_example(ROW, "law")


@pytest.mark.parametrize("domain", DOMAINS)
@pytest.mark.parametrize("fmt", ["alpaca", "chat-template"])
def test_masked_tokens_are_exactly_the_prompt(tok, domain, fmt):
    for row in make_rows(domain, 5, seed=11):
        prompt, response = format_example(row, domain, prompt_format=fmt, tokenizer=tok)
        item = encode_example(tok, prompt, response, seq_length=4096)
        ids, labels = item["input_ids"], item["labels"]
        n_masked = sum(1 for label in labels if label == IGNORE_INDEX)
        assert labels[:n_masked] == [IGNORE_INDEX] * n_masked  # the mask is a prefix
        assert ids[n_masked:] == labels[n_masked:]
        # the masked prefix decodes to BOS + prompt, the rest to response + EOS
        assert tok.decode(ids[:n_masked]) == tok.bos_token + prompt
        assert tok.decode(ids[n_masked:]) == response + tok.eos_token
        assert ids[-1] == tok.eos_token_id


def test_encoding_truncates_to_seq_length(tok):
    prompt, response = format_example(ROW, "finance")
    full = encode_example(tok, prompt, response, seq_length=10_000)
    cut = encode_example(tok, prompt, response, seq_length=len(full["input_ids"]) - 3)
    assert cut["input_ids"] == full["input_ids"][:-3] and cut["labels"] == full["labels"][:-3]


def test_collate_right_pads_and_masks_padding():
    batch = [{"input_ids": [5, 6, 7], "labels": [-100, 6, 7]}, {"input_ids": [8], "labels": [8]}]
    out = collate(batch, pad_token_id=0)
    assert out["input_ids"].tolist() == [[5, 6, 7], [8, 0, 0]]
    assert out["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]
    assert out["labels"].tolist() == [[-100, 6, 7], [8, -100, -100]]
    assert all(v.dtype == torch.long for v in out.values())


def test_partition_is_equal_size_disjoint_and_seeded():
    parts = partition_iid(103, 5, seed=3)
    assert [len(p) for p in parts] == [20] * 5
    flat = [int(i) for p in parts for i in p]
    assert len(set(flat)) == 100 and all(0 <= i < 103 for i in flat)
    assert [p.tolist() for p in partition_iid(103, 5, seed=3)] == [p.tolist() for p in parts]
    assert [p.tolist() for p in partition_iid(103, 5, seed=4)] != [p.tolist() for p in parts]


def test_synthetic_client_datasets(tok):
    r = load_recipe(TINY, ["num-clients=4", "dataset.num-rows=42"])
    clients = load_client_datasets(r, tok)
    assert [len(c) for c in clients] == [10] * 4
    for item in (x for c in clients for x in c):
        assert len(item["input_ids"]) <= r.train.seq_length
        assert any(label != IGNORE_INDEX for label in item["labels"])
    again = load_client_datasets(r, tok)
    assert again == clients


@pytest.mark.parametrize("domain", DOMAINS)
def test_synthetic_rows_follow_the_schema_and_are_deterministic(domain):
    rows = make_rows(domain, 50, seed=5)
    assert len(rows) == 50 and all(set(r) == {"instruction", "input", "output"} for r in rows)
    assert rows == make_rows(domain, 50, seed=5)
    assert rows != make_rows(domain, 50, seed=6)
    # the output is a function of the text the domain's rule keeps: same instruction -> same output
    seen = {}
    for row in make_rows(domain, 400, seed=1):
        key = format_example(row, domain)[0]
        assert seen.setdefault(key, row["output"]) == row["output"]
    assert len(set(r["output"] for r in rows)) > 1


def test_finance_label_follows_the_news_verb():
    # The verb phrases written out here, not read from the module: the mapping is what is tested.
    verbs = {"positive": ("soared", "jumped", "beat forecasts", "raised its dividend", "rallied"),
             "negative": ("plunged", "missed forecasts", "cut its dividend", "slumped", "warned on profit")}
    rows = make_rows("finance", 200, seed=2)
    assert {r["output"] for r in rows} == {"positive", "negative", "neutral"}
    for row in rows:
        found = [label for label, phrases in verbs.items() if any(f" {v} " in row["input"] for v in phrases)]
        assert found == ([row["output"]] if row["output"] != "neutral" else []), row


@pytest.mark.parametrize("domain", DOMAINS)
def test_tiny_recipe_fits_every_domain_untruncated(tok, domain):
    # the simulation may switch the tiny recipe's domain: no row may lose its response to truncation
    r = load_recipe(TINY, [f"domain=\"{domain}\""])
    clients = load_client_datasets(r, tok)
    share = r.dataset.num_rows // r.num_clients
    assert [len(c) for c in clients] == [share] * r.num_clients
    assert all(item["input_ids"][-1] == tok.eos_token_id for c in clients for item in c)
