"""Backend dispatch: auto picks by device, an unusable backend fails loudly, never falls back."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

import kfca_llm
from kfca_llm import InputError, SignPacker
from kfca_llm.engine import available_backends, get_backend


def _updates(seed=0):
    g = torch.Generator().manual_seed(seed)
    base = torch.randn(3000, generator=g)
    return {f"c{i}": base + torch.randn(3000, generator=g) for i in range(3)}


def test_auto_uses_the_cpu_engine_for_cpu_tensors():
    assert set(available_backends()) >= {"cpu", "triton"}
    assert kfca_llm.score_updates(_updates()).backend == "cpu"
    assert SignPacker({"w": (4,)}, ["a", "b"], device="cpu").backend.name == "cpu"


def test_the_old_name_numpy_still_gives_the_cpu_backend_with_a_deprecation_warning():
    assert "numpy" not in available_backends()
    with pytest.warns(DeprecationWarning, match="'numpy' is now called 'cpu'"):
        assert get_backend("numpy") is get_backend("cpu")
    ups = _updates(2)
    with pytest.warns(DeprecationWarning):
        old = kfca_llm.score_updates(ups, backend="numpy")
    assert old.backend == "cpu" and old.rewards == kfca_llm.score_updates(ups, backend="cpu").rewards
    with pytest.raises(InputError, match="unknown backend"):
        get_backend(["cpu"])  # not a name: refused, not a TypeError


def test_the_cli_accepts_the_old_name_and_says_it_is_deprecated(tmp_path):
    from safetensors.torch import save_file

    paths = []
    for client, update in _updates(3).items():
        paths.append(str(tmp_path / f"{client}.safetensors"))
        save_file({"w": update}, paths[-1])
    done = subprocess.run([sys.executable, "-m", "kfca_llm.cli", "score", *paths, "--backend", "numpy"],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "backend cpu" in done.stdout and "'numpy' is now called 'cpu'" in done.stderr


def test_forced_triton_under_the_interpreter_equals_cpu():
    # conftest enables TRITON_INTERPRET=1 where there is no GPU
    ups = _updates(1)
    triton = kfca_llm.score_updates(ups, backend="triton")
    assert triton.backend == "triton"
    assert triton.pairwise == kfca_llm.score_updates(ups, backend="cpu").pairwise


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
