"""The README's runnable examples run as written."""

from __future__ import annotations

import re
from pathlib import Path

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()
BLOCKS = re.findall(r"```python\n(.*?)```", README, re.S)


def _block(marker: str) -> str:
    found = [b for b in BLOCKS if marker in b]
    assert len(found) == 1, f"expected one README block with {marker!r}"
    return found[0]


def test_streaming_example_runs_and_scores_every_client(capsys):
    scope: dict = {}
    exec(compile(_block("SignPacker(shapes"), "README.md", "exec"), scope)
    assert set(scope["report"].rewards) == {"alice", "bob", "carol"}
    assert "alice" in capsys.readouterr().out


def test_custom_attack_example_registers_a_working_attack(monkeypatch):
    import torch

    from kfca_llm import attacks

    monkeypatch.setattr(attacks, "_REGISTRY", dict(attacks._REGISTRY))
    exec(compile(_block("register_attack"), "README.md", "exec"), {})
    attack = attacks.resolve_attack("halve")
    honest = {"w": torch.ones(3)}
    assert torch.equal(attack(honest, [], torch.Generator())["w"], torch.full((3,), 0.5))
