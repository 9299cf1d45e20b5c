"""Users' attacks from the command line (``--plugins``) and from installed packages (entry points)."""

from __future__ import annotations

import pytest
from helpers import run_main

from kfca_llm import attack_registry, attacks, plugins

HALVE = """
from kfca_llm.attacks import register_attack

@register_attack("{name}")
def halve(honest, history, generator):
    return {{k: v / 2 for k, v in honest.items()}}
"""


@pytest.fixture(autouse=True)
def own_registry(monkeypatch):
    """Each test registers into a copy of the registry; entry points are looked up again."""
    monkeypatch.setattr(attack_registry, "_REGISTRY", dict(attack_registry._REGISTRY))
    monkeypatch.setattr(plugins, "_entry_points_loaded", False)


def test_an_attack_registered_in_a_file_is_usable_from_the_command_line(tmp_path, capsys):
    (tmp_path / "my_attacks.py").write_text(HALVE.format(name="halve"))
    code, _, err = run_main(capsys, "simulate", "--attacks", "honest,halve", "--dry-run")
    assert code == 2 and "unknown attack 'halve'" in err and "--plugins" in err
    code, out, _ = run_main(capsys, "simulate", "--plugins", tmp_path / "my_attacks.py", "--attacks", "honest,halve",
                            "--dry-run")
    assert code == 0 and "attacks honest, halve" in out


def test_a_plugin_module_is_imported_by_name_from_the_python_path(tmp_path, capsys, monkeypatch):
    (tmp_path / "halving_attacks.py").write_text(HALVE.format(name="halve-by-name"))
    monkeypatch.syspath_prepend(tmp_path)
    (tmp_path / "e.toml").write_text('[[expect]]\ncheck = "honest > halve-by-name"\n')
    code, out, _ = run_main(capsys, "check", "--plugins", "halving_attacks", "--attacks", "honest,halve-by-name",
                            "--expect", tmp_path / "e.toml", "--seeds", "0", "--dry-run")
    assert code == 0 and "halve-by-name" in out


@pytest.mark.parametrize("plugin, message", [
    ("{tmp}/missing.py", "no such file"),
    ("no_such_plugin_module", "no module 'no_such_plugin_module' on sys.path"),
    ("{tmp}/broken.py", "--plugins {tmp}/broken.py: ZeroDivisionError: division by zero"),
])
def test_a_plugin_that_cannot_be_loaded_is_one_error_line(tmp_path, capsys, plugin, message):
    (tmp_path / "broken.py").write_text("1 / 0\n")
    code, _, err = run_main(capsys, "simulate", "--plugins", plugin.format(tmp=tmp_path), "--dry-run")
    assert code == 2 and message.format(tmp=tmp_path) in err


def test_an_installed_packages_entry_point_registers_its_attacks_when_a_spec_needs_them(tmp_path, monkeypatch):
    (tmp_path / "packaged_attacks.py").write_text(HALVE.format(name="halve-packaged"))
    dist = tmp_path / "packaged_attacks-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: packaged-attacks\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(f"[{plugins.ENTRY_POINT_GROUP}]\nhalve = packaged_attacks\n")
    monkeypatch.syspath_prepend(tmp_path)
    import torch

    attack = attacks.resolve_attack("halve-packaged")
    assert torch.equal(attack({"w": torch.ones(2)}, [], torch.Generator())["w"], torch.full((2,), 0.5))
