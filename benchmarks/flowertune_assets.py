"""The offline stand-ins ``flowertune_app.py`` runs Flower's general-NLP app on: a tiny Llama (``LlamaConfig``), a
byte-level BPE tokenizer trained here and an alpaca-style data set (columns instruction, input, output; generated
from a word list), all written locally: nothing is downloaded."""

from __future__ import annotations

import json
import random
from pathlib import Path

PREAMBLE = "Below is an instruction that describes a task. Write a response that appropriately completes the request."
WORDS = ("apple bird cat dog egg fish goat hat ink jam kite lamp moon nest owl pear queen rose sun tree umbrella van "
         "whale yak zebra red blue green black white one two three four five six seven eight nine ten river hill "
         "stone cloud rain snow wind fire").split()
TASKS = {"Sort these words alphabetically": sorted,
         "Reverse the order of these words": lambda w: w[::-1],
         "Repeat the first and the last of these words": lambda w: [w[0], w[-1]],
         "List these words without the first one": lambda w: w[1:]}


def alpaca_rows(n: int = 400, seed: int = 0) -> list[dict[str, str]]:
    """``n`` alpaca-style rows (instruction, input, output), the same for the same seed: a word task on 3-5 words;
    ``input`` names the topic (the general-NLP app, like alpaca-gpt4's many rows without one, ignores it)."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        task = list(TASKS)[i % len(TASKS)]
        words = rng.sample(WORDS, rng.randint(3, 5))
        rows.append({"instruction": f"{task}: {' '.join(words)}.", "input": "" if i % 3 else "words",
                     "output": " ".join(TASKS[task](words)) + "."})
    return rows


def prompt(row: dict[str, str]) -> str:
    """The general-NLP app's alpaca prompt of a row (``dataset.formatting_prompts_func``), to train the tokenizer on."""
    return f"{PREAMBLE}\n### Instruction:\n{row['instruction']}\n### Response: {row['output']}"


def build_tokenizer(texts: list[str], path: Path, vocab_size: int = 400):
    """A byte-level BPE tokenizer trained on ``texts``, saved as a fast tokenizer ``AutoTokenizer`` loads."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<s>", "</s>"],
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                                       show_progress=False))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>")
    fast.save_pretrained(path)
    return fast


def build_model(path: Path, tokenizer, seed: int = 0) -> None:
    """A tiny Llama (2 layers, hidden 64) for ``tokenizer``, saved beside it (safetensors)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                         tie_word_embeddings=False)
    LlamaForCausalLM(config).save_pretrained(path)


def build_assets(root: Path, rows: int = 400) -> tuple[Path, Path]:
    """Write the tiny model with its tokenizer (``root/model``) and the data set (``root/data/train.jsonl``, which
    ``datasets.load_dataset(root/data)``, so flwr-datasets' ``FederatedDataset``, loads as split ``train``)."""
    model_dir, data_dir = root / "model", root / "data"
    data = alpaca_rows(rows)
    data_dir.mkdir(parents=True, exist_ok=True)
    (data_dir / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in data), encoding="utf-8")
    build_model(model_dir, build_tokenizer([prompt(r) for r in data], model_dir))
    return model_dir, data_dir
