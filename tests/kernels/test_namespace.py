"""The repository's kernels/ folder never shadows Hugging Face's top-level ``kernels`` package."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _import_kernels_from_repo_root(extra_path: str | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    if extra_path:
        env["PYTHONPATH"] = extra_path
    code = "import kernels, sys; print(kernels.__name__, getattr(kernels, 'MARKER', None))"
    # `python -c` from the repository root puts the root on sys.path, as `python -m` does
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True)


def test_without_hf_kernels_the_probes_see_no_kernels_package():
    code = ("from transformers.utils.import_utils import is_kernels_available\n"
            "print(is_kernels_available())\n"
            "try:\n    from kernels import get_kernel\nexcept ImportError:\n    print('no get_kernel')\n")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\n")[:2] == ["False", "no get_kernel"]


def test_with_hf_kernels_installed_the_real_package_is_imported(tmp_path):
    fake = tmp_path / "kernels"
    fake.mkdir()
    (fake / "__init__.py").write_text("MARKER = 'huggingface-kernels'\ndef get_kernel(*a, **k):\n    return None\n")
    result = _import_kernels_from_repo_root(str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["kernels", "huggingface-kernels"]


def test_the_subpackages_still_import():
    import kfca_llm.kernels.sign_pack.cpu as sign_pack

    assert sign_pack.__name__ == "kfca_llm.kernels.sign_pack.cpu" and callable(sign_pack.sign_pack)
