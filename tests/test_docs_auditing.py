"""docs/auditing.md: every command it shows runs as written (kfca-llm ones in a shell, in the folder the page
describes), and the operator's and participant's Flower commands pass Flower's own config parsing."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "auditing.md"
NODES = {1: "honest", 2: "honest", 3: "honest", 4: "flip", 5: "zero"}


def bash_lines() -> list[str]:
    blocks = re.findall(r"```bash\n(.*?)```", PAGE.read_text(), flags=re.S)
    return [line for block in blocks for line in block.splitlines() if line.strip()]


def test_the_page_shows_the_commands_this_test_runs():
    starts = sorted({line.split()[0].split("=")[0] for line in bash_lines()})
    assert starts == ["HEAD", "flower-supernode", "flwr", "kfca-llm"]


@pytest.fixture(scope="module")
def audit_folder(tmp_path_factory) -> Path:
    """What the page describes: the ledger and its store, a participant's receipts/, the published key, the
    participant's kept update of round 2 (node 2 of the served run) and the global it was sent then."""
    pytest.importorskip("flwr", reason="the ledger is written by KFCAStrategy (the flower extra)")
    sys.path.insert(0, str(ROOT / "tests" / "flower"))
    from flower_local import honest_update, serve_with_receipts
    from safetensors.numpy import save_file

    folder = serve_with_receipts(tmp_path_factory.mktemp("served"), keep_signs=True, nodes=NODES)
    (folder / "receipts-2").rename(folder / "receipts")
    shutil.copy(folder / "keys" / "server.key.pub", folder / "server.key.pub")
    save_file(honest_update(2, 2), str(folder / "mine.safetensors"))
    shutil.copy(folder / "sent-2" / "round2.safetensors", folder / "global-round2.safetensors")
    return folder


def run_as_written(lines: list[str], folder: Path, capsys) -> str:
    """The page's lines in order, stopping at the first that fails (``set -e``), in ``folder``; what they printed.

    The first ``kfca-llm`` line runs in bash as written, through the console script on PATH: that real process is
    what proves the installed command and a shell take the page's words. Each later ``kfca-llm`` line is the same
    command's ``main`` in this process, with the line's words as bash splits them (``shlex``, POSIX rules: the
    page's quotes), its ``"$NAME"`` from the ``NAME=$(...)`` lines above it, and ``> FILE`` written from what it
    printed: a fresh interpreter per line imported torch and numba again (~5 s of CPU each) to run the same code.
    A ``NAME=$(...)`` line runs in bash (its ``python -c`` imports no kfca_llm)."""
    from kfca_llm.cli import main

    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    variables, printed, shell_done = {}, [], False
    for line in lines:
        assignment = re.fullmatch(r"([A-Z_]+)=(\$\(.*\))", line)
        if assignment or not shell_done:
            script = (f"set -e\n{line}\nprintf %s \"${assignment[1]}\"\n" if assignment else f"set -e\n{line}\n")
            done = subprocess.run(["bash", "-c", script], cwd=folder, env={**env, **variables}, capture_output=True,
                                  text=True, timeout=300)
            assert done.returncode == 0, (line, done.stdout[-2000:] + done.stderr[-2000:])
            if assignment:
                variables[assignment[1]] = done.stdout
            else:
                assert line.split()[0] == "kfca-llm", line
                printed.append(done.stdout)
                shell_done = True
            continue
        words = shlex.split(re.sub(r'"\$([A-Z_]+)"', lambda m: shlex.quote(variables[m[1]]), line))
        assert words[0] == "kfca-llm" and all(w not in ("|", "&&", ";", "<", ">>") for w in words), line
        redirect = words[words.index(">") + 1] if ">" in words else None
        argv = words[1:words.index(">")] if redirect else words[1:]
        capsys.readouterr()
        cwd = os.getcwd()
        os.chdir(folder)
        try:
            code = main(argv)
        finally:
            os.chdir(cwd)
        out = capsys.readouterr().out
        assert code == 0, (line, out[-2000:])
        if redirect:
            (folder / redirect).write_text(out)
        else:
            printed.append(out)
    return "".join(printed)


def test_every_kfca_llm_command_runs_as_written_and_passes_on_an_honest_ledger(audit_folder, capsys):
    lines = [line for line in bash_lines() if line.split()[0] == "kfca-llm" or line.startswith("HEAD=")]
    stdout = run_as_written(lines, audit_folder, capsys)
    assert stdout.count("chain intact") == 3  # the plain run, --expect-head, --receipts (--json goes to a file)
    assert "3 receipt(s) checked, all in the ledger as signed" in stdout
    assert "this update is the one scored for participant" in stdout
    assert "value sketch: match:" in stdout and "the slack as the global sent implies" in stdout


def test_the_operators_flwr_run_command_passes_flowers_key_check_and_creates_the_key(tmp_path):
    pytest.importorskip("flwr", reason="the flower extra")
    import tomllib

    from flwr.common.config import flatten_dict, fuse_dicts, parse_config_args

    from kfca_llm.flower.server_app import build_strategy
    from kfca_llm.flower.task import recipe_from_config

    (line,) = [line for line in bash_lines() if line.startswith("flwr run")]
    overrides = shlex.split(line)[shlex.split(line).index("--run-config") + 1]
    declared = flatten_dict(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"])
    config = fuse_dicts(declared, parse_config_args([overrides]), check_keys=True)
    assert config["kfca.receipt-key"] == "/etc/kfca/server.key" and config["kfca.keep-signs"] is True
    here = {k: v.replace("/etc/kfca", str(tmp_path)).replace("/srv", str(tmp_path)) if isinstance(v, str) else v
            for k, v in config.items()}
    strategy = build_strategy(recipe_from_config(here), here)
    assert stat.S_IMODE(os.stat(tmp_path / "server.key").st_mode) == 0o600
    assert (tmp_path / "server.key.pub").read_text().startswith("-----BEGIN PUBLIC KEY-----")
    assert strategy.receipt_key is not None and strategy.keep_signs


def test_the_participants_node_config_parses_and_flower_supernode_takes_its_flags():
    pytest.importorskip("flwr", reason="the flower extra")
    from flwr.common.config import parse_config_args

    (line,) = [line for line in bash_lines() if line.startswith("flower-supernode")]
    words = shlex.split(line)
    node_config = parse_config_args([words[words.index("--node-config") + 1]])
    assert node_config == {"partition-id": 0, "num-partitions": 2, "participant": "alice",
                           "receipts-dir": "/home/alice/kfca-receipts"}
    help_text = subprocess.run([str(Path(sys.executable).parent / "flower-supernode"), "--help"], capture_output=True,
                               text=True, timeout=120).stdout
    assert all(flag in help_text for flag in words if flag.startswith("--"))
