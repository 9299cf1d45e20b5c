"""Backend dispatch: auto picks by device, an unusable backend fails loudly, never falls back."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

import kfca_llm
from kfca_llm import SignPacker
from kfca_llm.engine import available_backends


def _updates(seed=0):
    g = torch.Generator().manual_seed(seed)
    base = torch.randn(3000, generator=g)
    return {f"c{i}": base + torch.randn(3000, generator=g) for i in range(3)}


def test_auto_uses_the_cpu_engine_for_cpu_tensors():
    assert set(available_backends()) >= {"numpy", "triton"}
    assert kfca_llm.score_updates(_updates()).backend == "numpy"
    assert SignPacker({"w": (4,)}, ["a", "b"], device="cpu").backend.name == "numpy"


def test_forced_triton_under_the_interpreter_equals_numpy():
    # conftest enables TRITON_INTERPRET=1 where there is no GPU
    ups = _updates(1)
    triton = kfca_llm.score_updates(ups, backend="triton")
    assert triton.backend == "triton"
    assert triton.pairwise == kfca_llm.score_updates(ups, backend="numpy").pairwise


def test_triton_without_gpu_or_interpreter_raises_with_the_reason():
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present, so the triton backend is usable and cannot be refused")
    code = (
        "import kfca_llm, torch\n"
        "from kfca_llm.engine import BackendUnavailable\n"
        "try:\n"
        "    kfca_llm.score_updates({'a': torch.randn(64), 'b': torch.randn(64)}, backend='triton')\n"
        "except BackendUnavailable as e:\n"
        "    print('REFUSED', e)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.startswith("REFUSED") and "CUDA" in out
