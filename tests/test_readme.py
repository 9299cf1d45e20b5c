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


def test_the_main_jobs_table_is_what_the_default_run_prints(tiny_federation):
    """The README quotes the default run's table (``make demo``: recipes/tiny.toml, seed 0); the session's tiny run
    is that run. Cells are compared to their last printed digit with one unit of slack: other CPUs may round a
    few near-zero coordinates of the training differently."""
    from kfca_llm.simulate import reward_table

    def rows(text: str) -> list[list[str]]:
        return [[c.strip() for c in line.strip("│").split("│")] for line in text.splitlines()
                if line.startswith("│") and line.split("│")[1].strip().isdigit()]

    quoted = README.split("The table of a default run", 1)[1].split("```", 2)[1]
    printed = rows(reward_table(tiny_federation.to_report()))
    assert [r[1] for r in rows(quoted)] == [r[1] for r in printed]  # the same ranking
    for ours, theirs in zip(rows(quoted), printed):
        for cell, value in zip(ours[2:], theirs[2:]):
            if cell.endswith("%"):
                assert abs(int(cell[:-1]) - int(value[:-1])) <= 1, (ours, theirs)
            else:
                assert abs(float(cell) - float(value)) <= 1.5e-4, (ours, theirs)
    honest = re.search(r"honest clients' own mean reward: ([+-][0-9.]+)", quoted)
    assert honest and abs(float(honest[1]) - tiny_federation.to_report()["honest_clients"]["mean_reward"]) <= 1.5e-4
