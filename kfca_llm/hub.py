"""The Hugging Face hub, reached or not: a real recipe's model and data set come from it (or its cache).

Offline, the hub client retries every request for about a minute before the libraries fail with two
tracebacks; ``require_cached_sources`` answers at once instead. Only the standard library and, once the hub
is known to be out of reach, ``huggingface_hub``'s cache lookups: the hub client reads ``HF_HUB_OFFLINE`` when
it is first imported, so this runs before anything imports transformers or datasets.
"""

from __future__ import annotations

import os
from pathlib import Path

from .errors import InputError

_TRUE = ("1", "true", "yes", "on")


def hub_offline() -> bool:
    """Hugging Face's own offline switches (read now, not at import, so a caller's setting counts)."""
    return any(os.environ.get(name, "").strip().lower() in _TRUE for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def hub_reachable(timeout: float = 5.0) -> bool:
    """One request to the hub's endpoint (proxies honoured). Any HTTP answer counts as reachable; the
    hub client's own retries would otherwise spend a minute and a half failing offline."""
    import urllib.error
    import urllib.request

    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
    try:
        urllib.request.urlopen(urllib.request.Request(endpoint, method="HEAD"), timeout=timeout).close()
    except urllib.error.HTTPError:
        return True
    except (OSError, ValueError):
        return False
    return True


def require_cached_sources(models: list[str], datasets: list[str]) -> None:
    """Before a run: when the hub cannot be reached (or ``HF_HUB_OFFLINE`` is set), read only the cache
    (``HF_HUB_OFFLINE=1`` for this process: no retries) and refuse, in one line, what the cache lacks.
    ``models``/``datasets``: the hub ids the run would download (local folders are not listed)."""
    if not (models or datasets):
        return
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
    if hub_offline():
        why = "HF_HUB_OFFLINE is set"
    elif hub_reachable():
        return
    else:
        why = f"{endpoint} cannot be reached"
    os.environ["HF_HUB_OFFLINE"] = os.environ["HF_DATASETS_OFFLINE"] = "1"
    missing = [f"model {m}" for m in models if not _in_cache(m, "model")]
    missing += [f"data set {d}" for d in datasets if not _in_cache(d, "dataset")]
    if missing:
        raise InputError(f"{' and '.join(missing)} not in the Hugging Face cache and {why}: pass --model-dir / "
                         "--data-dir (local copies), or fill the cache on a machine with network access")


def _in_cache(repo_id: str, repo_type: str) -> bool:
    """A snapshot of the repository in the hub cache (a data set also counts when datasets' own cache holds it).
    The folders are read from the environment now: ``huggingface_hub.constants`` keeps those of its import."""
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    home = Path(os.environ.get("HF_HOME") or constants.HF_HOME)
    try:
        snapshot_download(repo_id, repo_type=repo_type, local_files_only=True,
                          cache_dir=os.environ.get("HF_HUB_CACHE") or home / "hub")
        return True
    except (LocalEntryNotFoundError, OSError, ValueError):
        pass
    datasets_cache = Path(os.environ.get("HF_DATASETS_CACHE") or home / "datasets")
    return repo_type == "dataset" and (datasets_cache / repo_id.replace("/", "___")).is_dir()
