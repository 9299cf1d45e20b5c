"""numba settings of the CPU kernels (kernels/numba_setup.py): the threading layer and the cache folder."""

from __future__ import annotations

import os
import subprocess
import sys

from kfca_llm.kernels.numba_setup import fallback_cache_dir


def test_parallel_kernels_run_on_the_workqueue_layer():
    """OpenMP workers keep spinning after a parallel kernel and starve torch's training threads:
    the kernels pick numba's workqueue layer unless the user chose one."""
    code = ("import numba, torch, kfca_llm\n"
            "kfca_llm.score_updates({'a': torch.randn(4_000_000), 'b': torch.randn(4_000_000)}, backend='cpu')\n"
            "print(numba.threading_layer())")
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_THREADING_LAYER"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[-1] == "workqueue"


def test_numba_cache_falls_back_to_a_temporary_folder(tmp_path):
    blocker = tmp_path / "file"  # nothing can be created below a regular file, not even by root
    blocker.write_text("")
    assert fallback_cache_dir(tmp_path / "pkg", blocker / "numba") is None  # the package folder works
    assert fallback_cache_dir(blocker / "pkg", tmp_path / "user") is None  # the user cache works
    fallback = fallback_cache_dir(blocker / "pkg", blocker / "numba")
    assert fallback is not None and fallback.name.startswith("kfca-llm-numba-")
