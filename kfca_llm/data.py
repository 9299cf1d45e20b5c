"""Per-domain prompt formatting, response-only loss masking, IID client partitions and batching.

The loss covers only the response tokens (and the end-of-sequence token): the prompt tokens are labelled
-100. This replaces TRL's completion-only collator that FlowerTune's apps used and newer TRL removed; the
prompt and the response are tokenised separately so the masked span is exactly the prompt's tokens.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from . import synthetic
from .errors import InputError
from .fl.seeds import SET_ASIDE
from .recipe import DOMAINS, SYNTHETIC_DATASET, Recipe

IGNORE_INDEX = -100
COLUMNS = ("instruction", "input", "output")
ALPACA_PREAMBLE = (
    "Below is an instruction that describes a task. "
    "Write a response that appropriately completes the request."
)


def domain_instruction(row: Mapping[str, Any], domain: str) -> str:
    """The instruction text per FlowerTune's domain rule."""
    if domain == "general-nlp":
        return str(row["instruction"])  # the input column is ignored by the reference app
    if domain in ("finance", "code"):
        return f"{row['instruction']} {row['input']}"
    if domain == "medical":
        return str(row["input"])  # the input column becomes the instruction; the original one is dropped
    raise ValueError(f"unknown domain {domain!r}; expected one of {DOMAINS}")


def format_example(row: Mapping[str, Any], domain: str, *, prompt_format: str = "alpaca",
                   tokenizer: Any = None) -> tuple[str, str]:
    """(prompt, response) for one row. ``prompt_format="chat-template"`` needs the tokenizer whose chat
    template renders a single user turn; the response is then the assistant turn as the template writes
    it (with its end-of-turn marker)."""
    missing = [c for c in COLUMNS if c not in row]
    if missing:
        raise ValueError(f"row lacks column(s) {missing} of the {domain} schema {COLUMNS}")
    instruction = domain_instruction(row, domain)
    output = str(row["output"])
    if prompt_format == "alpaca":
        return f"{ALPACA_PREAMBLE}\n\n### Instruction:\n{instruction}\n\n### Response:\n", output
    if prompt_format == "chat-template":
        if tokenizer is None or not getattr(tokenizer, "chat_template", None):
            raise ValueError("prompt format 'chat-template' needs a tokenizer that has a chat template")
        user = [{"role": "user", "content": instruction}]
        prompt = tokenizer.apply_chat_template(user, tokenize=False, add_generation_prompt=True)
        full = tokenizer.apply_chat_template(user + [{"role": "assistant", "content": output}], tokenize=False)
        if not full.startswith(prompt):
            raise ValueError("the chat template's rendering of the answered conversation does not start with "
                             "its generation prompt; cannot split prompt from response")
        return prompt, full[len(prompt):]
    raise ValueError(f"unknown prompt format {prompt_format!r}; expected 'alpaca' or 'chat-template'")


def encode_example(tokenizer: Any, prompt: str, response: str, seq_length: int) -> dict[str, list[int]]:
    """Token ids and labels (-100 on every prompt token), response + eos kept, truncated to seq_length."""
    # A prompt rendered by a chat template may already hold the BOS token: do not add a second one.
    bos = getattr(tokenizer, "bos_token", None)
    add_special = not (bos and prompt.startswith(bos))
    prompt_ids = list(tokenizer(prompt, add_special_tokens=add_special)["input_ids"])
    response_ids = list(tokenizer(response, add_special_tokens=False)["input_ids"])
    eos_id = tokenizer.eos_token_id
    if eos_id is not None and (not response_ids or response_ids[-1] != eos_id):
        response_ids.append(eos_id)
    input_ids = (prompt_ids + response_ids)[:seq_length]
    labels = ([IGNORE_INDEX] * len(prompt_ids) + response_ids)[:seq_length]
    return {"input_ids": input_ids, "labels": labels}


def _load_real(recipe: Recipe, data_dir: str | Path | None):
    """The real data set's train split (``datasets.Dataset``), its schema checked."""
    import datasets  # heavy import, only on the real path

    ds = recipe.dataset
    if data_dir is not None:
        loaded = datasets.load_from_disk(str(data_dir))
        if isinstance(loaded, datasets.DatasetDict):
            if "train" not in loaded:
                raise InputError(f"{data_dir} holds splits {list(loaded)}, none named 'train'")
            loaded = loaded["train"]
    else:
        loaded = datasets.load_dataset(ds.name, split="train")
    missing = [c for c in COLUMNS if c not in loaded.column_names]
    if missing:
        raise InputError(f"data set {data_dir or ds.name} lacks column(s) {missing}; "
                         f"the {recipe.domain} schema is {COLUMNS}")
    return loaded


def real_split(n_rows: int, recipe: Recipe) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(held-out, reference, training) row indices of a real data set of ``n_rows`` rows.

    One seeded permutation sets aside ``dataset.heldout-rows`` rows and then ``kfca.reference-rows`` rows (so the
    held-out rows do not move when the reference's count does); the clients' rows are the rest, or their seeded
    ``dataset.num-rows`` subsample. With nothing set aside the training rows are those of a plain subsample."""
    held, reference = recipe.dataset.heldout_rows, recipe.kfca.reference_rows
    if held + reference >= n_rows:
        raise InputError(f"the data set has {n_rows} rows: setting aside dataset.heldout-rows = {held} and "
                         f"kfca.reference-rows = {reference} leaves none to train on")
    aside = (np.random.default_rng([recipe.kfca.seed, SET_ASIDE]).permutation(n_rows)[:held + reference]
             if held + reference else np.zeros(0, dtype=np.int64))
    rest = np.setdiff1d(np.arange(n_rows), aside)
    num_rows = recipe.dataset.num_rows
    if num_rows is not None and num_rows < len(rest):
        rest = rest[np.sort(np.random.default_rng(recipe.kfca.seed).choice(len(rest), num_rows, replace=False))]
    return np.sort(aside[:held]), np.sort(aside[held:]), rest


def _rows(loaded, indices: np.ndarray) -> list[dict[str, Any]]:
    return [dict(r) for r in loaded.select(indices.tolist()).select_columns(list(COLUMNS))]


def _load_rows(recipe: Recipe, data_dir: str | Path | None) -> list[dict[str, Any]]:
    """The clients' rows: synthetic, the generator's first ``num-rows``; real, ``real_split``'s training rows."""
    ds = recipe.dataset
    if data_dir is None and ds.name == SYNTHETIC_DATASET:
        return synthetic.make_rows(recipe.domain, ds.num_rows or 0, recipe.kfca.seed)
    loaded = _load_real(recipe, data_dir)
    return _rows(loaded, real_split(len(loaded), recipe)[2])


def partition_iid(n_rows: int, num_clients: int, seed: int) -> list[np.ndarray]:
    """Seeded shuffle split into equal-size parts (the remainder rows are left out, as equal sizes demand)."""
    per_client = n_rows // num_clients
    if per_client == 0:
        raise ValueError(f"{n_rows} rows cannot give each of {num_clients} clients a row")
    order = np.random.default_rng(seed).permutation(n_rows)
    return [order[i * per_client:(i + 1) * per_client] for i in range(num_clients)]


def load_client_datasets(recipe: Recipe, tokenizer: Any, *, data_dir: str | Path | None = None
                         ) -> list[list[dict[str, list[int]]]]:
    """IID equal-size partition of the recipe's data set into ``recipe.num_clients`` encoded lists.

    Examples whose response is truncated away entirely (prompt alone fills ``seq_length``) carry no loss
    and are dropped after the partition, so a client's list may be a little shorter than its share.
    """
    rows = _load_rows(recipe, data_dir)
    parts = partition_iid(len(rows), recipe.num_clients, recipe.kfca.seed)
    fmt, seq = recipe.train.prompt_format, recipe.train.seq_length
    clients = []
    for idx in parts:
        encoded = []
        for i in idx:
            prompt, response = format_example(rows[i], recipe.domain, prompt_format=fmt, tokenizer=tokenizer)
            item = encode_example(tokenizer, prompt, response, seq)
            if any(label != IGNORE_INDEX for label in item["labels"]):
                encoded.append(item)
        clients.append(encoded)
    return clients


def _encode_rows(recipe: Recipe, tokenizer: Any, rows: Sequence[Mapping[str, Any]]) -> list[dict[str, list[int]]]:
    """Rows encoded as the clients' are, less those whose response the sequence length cuts away entirely."""
    fmt, seq = recipe.train.prompt_format, recipe.train.seq_length
    encoded = [encode_example(tokenizer, *format_example(row, recipe.domain, prompt_format=fmt, tokenizer=tokenizer),
                              seq) for row in rows]
    return [item for item in encoded if any(label != IGNORE_INDEX for label in item["labels"])]


def load_heldout_examples(recipe: Recipe, tokenizer: Any, *, data_dir: str | Path | None = None
                          ) -> list[dict[str, list[int]]]:
    """Encoded held-out rows (``dataset.heldout-rows``), never trained on as rows. Synthetic: the generator's
    rows after the training rows (same distribution; the synthetic tasks have few distinct questions, so their
    content does recur; every row has one exact answer). Real: the rows ``real_split`` sets aside."""
    ds = recipe.dataset
    if not ds.heldout_rows:
        return []
    if data_dir is None and ds.name == SYNTHETIC_DATASET:
        train_rows = ds.num_rows or 0
        return _encode_rows(recipe, tokenizer,
                            synthetic.make_rows(recipe.domain, train_rows + ds.heldout_rows, recipe.kfca.seed)[train_rows:])
    loaded = _load_real(recipe, data_dir)
    return _encode_rows(recipe, tokenizer, _rows(loaded, real_split(len(loaded), recipe)[0]))


def collate(batch: Sequence[Mapping[str, Sequence[int]]], pad_token_id: int) -> dict[str, torch.Tensor]:
    """Right-pad a batch: input_ids (pad id), attention_mask (0 on padding), labels (-100 on padding)."""
    if not batch:
        raise ValueError("cannot collate an empty batch")
    width = max(len(item["input_ids"]) for item in batch)
    input_ids = torch.full((len(batch), width), pad_token_id, dtype=torch.long)
    labels = torch.full((len(batch), width), IGNORE_INDEX, dtype=torch.long)
    attention = torch.zeros((len(batch), width), dtype=torch.long)
    for row, item in enumerate(batch):
        n = len(item["input_ids"])
        input_ids[row, :n] = torch.tensor(item["input_ids"], dtype=torch.long)
        labels[row, :n] = torch.tensor(item["labels"], dtype=torch.long)
        attention[row, :n] = 1
    return {"input_ids": input_ids, "attention_mask": attention, "labels": labels}


def load_reference_examples(recipe: Recipe, tokenizer: Any, n_rows: int, *, data_dir: str | Path | None = None
                            ) -> list[dict[str, list[int]]]:
    """Encoded rows no client has, for the server's trusted reference (``kfca.reference-rows``, FLTrust's root
    set). Synthetic: the generator's ``n_rows`` rows after the training and the held-out rows. Real: the rows
    ``real_split`` sets aside for it (``n_rows`` must be the recipe's ``kfca.reference-rows``)."""
    ds = recipe.dataset
    if data_dir is None and ds.name == SYNTHETIC_DATASET:
        start = (ds.num_rows or 0) + ds.heldout_rows
        return _encode_rows(recipe, tokenizer, synthetic.make_rows(recipe.domain, start + n_rows, recipe.kfca.seed)[start:])
    if n_rows != recipe.kfca.reference_rows:
        raise InputError(f"a real data set sets aside kfca.reference-rows = {recipe.kfca.reference_rows} rows for the "
                         f"reference, not {n_rows}")
    loaded = _load_real(recipe, data_dir)
    return _encode_rows(recipe, tokenizer, _rows(loaded, real_split(len(loaded), recipe)[1]))
