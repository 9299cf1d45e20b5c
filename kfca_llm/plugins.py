"""Users' own attacks: modules named on the command line (``--plugins``) and installed packages' entry points.

A plugin is a module that registers attacks when imported (``@register_attack``). ``kfca-llm simulate --plugins
my_attacks.py`` (a file) or ``--plugins my_package.attacks`` (importable from ``sys.path``/``PYTHONPATH``) imports
it before the recipe is read; a package declaring the entry-point group ``kfca_llm.attacks`` is imported the first
time a spec names an attack nobody registered, in every process (a Flower ClientApp and ServerApp too).
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Sequence
from importlib import import_module
from importlib.metadata import entry_points
from pathlib import Path

from .errors import InputError

ENTRY_POINT_GROUP = "kfca_llm.attacks"
_entry_points_loaded = False


def load_attack_entry_points() -> bool:
    """Import the modules of the ``kfca_llm.attacks`` entry points, once per process; True when this call
    imported one (so an unknown attack name is worth looking up again)."""
    global _entry_points_loaded
    if _entry_points_loaded:
        return False
    _entry_points_loaded = True
    found = entry_points(group=ENTRY_POINT_GROUP)
    for point in found:
        try:
            point.load()
        except Exception as exc:  # the user's code: one line naming it, not a traceback through ours
            raise InputError(f"entry point {point.name} = {point.value} (group {ENTRY_POINT_GROUP}) failed to load: "
                             f"{type(exc).__name__}: {exc}") from None
    return bool(found)


def load_plugins(names: Sequence[str]) -> None:
    """Import each plugin: a ``.py`` file, or a module name importable from ``sys.path``."""
    for name in names:
        try:
            _load(name)
        except InputError:
            raise
        except Exception as exc:
            raise InputError(f"--plugins {name}: {type(exc).__name__}: {exc}") from None


def _load(name: str) -> None:
    if not name.endswith(".py"):
        try:
            import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name.split(".")[0] and exc.name != name:
                raise  # the plugin itself imports something missing
            raise InputError(f"--plugins {name}: no module {name!r} on sys.path (PYTHONPATH); give a file "
                             "as my_attacks.py") from None
        return
    path = Path(name)
    if not path.is_file():
        raise InputError(f"--plugins {name}: no such file")
    module_name = f"kfca_llm_plugin_{path.stem}"
    if getattr(sys.modules.get(module_name), "__file__", None) == str(path):
        return  # imported already (one recipe per --seeds entry or domain)
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # dataclasses and pickling look their module up here
    spec.loader.exec_module(module)
