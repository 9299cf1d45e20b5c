"""numba settings of the CPU kernels: where compiled kernels are cached, and which threads run them.

Every module that defines ``cache=True`` kernels (``kernels/*/cpu.py``, ``kfca_llm/engine/duplicates.py``)
calls ``configure_numba()`` first.

**Cache** (``cache=True``): compiled once, reused by every process. numba writes next to the source
(the module's ``__pycache__``) or, when the package is installed read-only, in the user's cache folder
(``~/.cache/numba``). Where neither is writable (a read-only image whose HOME is not writable either)
numba refuses to import a cached function at all; we then point it at a per-user folder in the
temporary directory. ``NUMBA_CACHE_DIR`` set by the user always wins.

**Threads**: where OpenMP is available, numba's default threading layer is OpenMP, whose workers keep
spinning after a parallel kernel returns; in a federation, where every round scores and then trains
with torch, they took the cores from torch's own threads (the tiny demo: 161 s with OpenMP against
41 s with the workqueue layer on the same busy 2-core machine). The kernels are a few coarse parallel
loops per call, for which numba's own ``workqueue`` layer is as good, and its workers sleep when idle.
Waking them costs 0.2-0.5 ms a launch on a 2-core CI machine, so a round is packed in one launch and
small inputs take single-threaded builds (``serial_and_parallel``).
``NUMBA_THREADING_LAYER`` set by the user always wins.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from types import FunctionType


def _writable(directory: Path) -> bool:
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=directory):
            pass
    except OSError:
        return False
    return True


def fallback_cache_dir(package_dir: Path, user_cache_dir: Path) -> Path | None:
    """None when numba's own locations work, else the temporary folder to use instead."""
    if _writable(package_dir / "__pycache__") or _writable(user_cache_dir):
        return None
    user = os.getuid() if hasattr(os, "getuid") else "user"
    return Path(tempfile.gettempdir()) / f"kfca-llm-numba-{user}"


def configure_numba() -> None:
    """Call before defining ``cache=True`` kernels (and so before numba's first parallel launch)."""
    import numba
    from numba.misc.appdirs import AppDirs

    if "NUMBA_THREADING_LAYER" not in os.environ:
        numba.config.THREADING_LAYER = "workqueue"
    if numba.config.CACHE_DIR:
        return
    fallback = fallback_cache_dir(Path(__file__).parent, Path(AppDirs(appname="numba", appauthor=False).user_cache_dir))
    if fallback is not None:
        numba.config.CACHE_DIR = str(fallback)


def serial_and_parallel(function):
    """(single-threaded, multi-threaded) compiled builds of one kernel, indexed by ``parallel``.

    Small inputs take the first: waking the thread pool costs more than their whole pass (0.2-0.5 ms
    per launch on a 2-core CI machine, milliseconds on a busy one). The copy has its own name so the
    two never share a cache entry.
    """
    from numba import njit

    serial = FunctionType(function.__code__, function.__globals__, function.__name__ + "_serial")
    serial.__qualname__ = function.__qualname__ + "_serial"
    return njit(cache=True)(serial), njit(parallel=True, cache=True)(function)
