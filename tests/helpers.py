"""Shared test constants and builders (imported by test modules; fixtures live in conftest.py)."""

from __future__ import annotations

import signal
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
RECIPES = ROOT / "recipes"
TINY = RECIPES / "tiny.toml"
# A short tiny federation: 3 rounds of 2 local steps, every round saved.
SHORT = ["num-server-rounds=3", "train.training-arguments.max-steps=2", "train.save-every-round=1"]


def short_recipe(*overrides: str):
    from kfca_llm.recipe import load_recipe

    return load_recipe(TINY, [*SHORT, *overrides])


def save_tiny_model(path, config_cls, seed: int, **dims) -> None:
    """A tiny causal LM (byte tokenizer) saved with ``save_pretrained``, for the real loading path.

    Dimensions are multiples of 64, the nf4 block size (bitsandbytes' CPU kernels need that)."""
    from transformers import AutoModelForCausalLM

    from kfca_llm.modeling import build_byte_tokenizer

    tok = build_byte_tokenizer()
    config = config_cls(**{**dict(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                                  pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id,
                                  eos_token_id=tok.eos_token_id), **dims})
    torch.manual_seed(seed)
    AutoModelForCausalLM.from_config(config).save_pretrained(path)
    tok.save_pretrained(path)


def counter_words(n_clients: int, n_words: int, sparse_task: bool = False):
    """(sign words [n_clients, n_words], task words [n_words]) as int32, from the partition hash itself
    (no library generator whose stream could change)."""
    import numpy as np

    from kfca_llm.partition import mix32

    index = np.arange(n_words, dtype=np.uint32)
    task = mix32(index ^ np.uint32(0x5678)) | mix32(index ^ np.uint32(0x9ABC))
    task[mix32(index ^ np.uint32(0x1111)) < np.uint32(2**32 // 10)] = 0
    if sparse_task:  # blocks of the compaction with fewer members than one 32-bit word
        task &= np.uint32(1) << (mix32(index) & np.uint32(31))
        task[mix32(index ^ np.uint32(0x2222)) > np.uint32(2**32 // 300)] = 0
    signs = mix32(np.arange(n_clients * n_words, dtype=np.uint32) ^ np.uint32(0x1234)).reshape(n_clients, n_words)
    return (signs & task).view(np.int32), task.view(np.int32)


# Hostile inputs: every case ends in a verdict or one error line, never a hang or a traceback.
KFCA = [sys.executable, "-m", "kfca_llm.cli"]
LIMIT_S = 60


@contextmanager
def limited(seconds: int = LIMIT_S):
    """Fail (TimeoutError) instead of hanging: a FIFO opened for reading, a quadratic regular expression."""
    def expire(signum, frame):
        raise TimeoutError(f"no answer within {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def cli(*args: str, cwd: Path = ROOT) -> tuple[int, str, str]:
    """``kfca-llm ARGS`` in a subprocess under ``LIMIT_S``: (exit status, stdout, stderr); never a traceback."""
    done = subprocess.run([*KFCA, *map(str, args)], cwd=cwd, capture_output=True, text=True, timeout=LIMIT_S)
    assert "Traceback" not in done.stderr, done.stderr[-2000:]
    return done.returncode, done.stdout, done.stderr


def run_main(capsys, *args) -> tuple[int, str, str]:
    """``kfca-llm ARGS`` in this process under ``limited``; an error exit (2) prints exactly one line."""
    from kfca_llm.cli import main

    with limited():
        code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    if code == 2:
        assert err.count("\n") == 1 and err.startswith("kfca-llm: error: "), err
    return code, out, err


def reseal(ledger) -> None:
    """Recompute every round's chain hash in place (what an operator or forger with write access does)."""
    import sqlite3

    from kfca_llm.flower import read_ledger
    from kfca_llm.flower.ledger_rows import GENESIS, chain_hasher

    contents = read_ledger(ledger)
    hash_round, prev = chain_hasher(contents), GENESIS
    with sqlite3.connect(ledger) as conn:
        for r in contents.rounds:
            digest = hash_round(r, prev)
            conn.execute("UPDATE rounds SET prev_hash = ?, chain_hash = ? WHERE run_id = ? AND round = ?",
                         (prev, digest, r.run_id, r.round))
            prev = digest
