"""Where numba keeps the compiled CPU kernels (``cache=True``): compiled once, reused by every process.

numba writes next to the source (``engine/__pycache__``) or, when the package is installed read-only,
in the user's cache folder (``~/.cache/numba``). Where neither is writable (a read-only image whose
HOME is not writable either) numba refuses to import a cached function at all; we then point it at a
per-user folder in the temporary directory. ``NUMBA_CACHE_DIR`` set by the user always wins.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


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


def ensure_numba_cache() -> None:
    """Call before defining ``cache=True`` kernels."""
    import numba
    from numba.misc.appdirs import AppDirs

    if numba.config.CACHE_DIR:
        return
    fallback = fallback_cache_dir(Path(__file__).parent, Path(AppDirs(appname="numba", appauthor=False).user_cache_dir))
    if fallback is not None:
        numba.config.CACHE_DIR = str(fallback)
