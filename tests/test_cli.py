"""The command line's own options, and a warning no kfca-llm process may print (subcommands are tested beside their modules)."""

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_version_prints_the_packaged_version_and_exits_0(capsys):
    from kfca_llm.cli import main

    packaged = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out.strip() == f"kfca-llm {packaged}"


def test_no_arguments_print_the_help_not_an_error(capsys):
    from kfca_llm.cli import SUBCOMMANDS, main

    assert main([]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("usage: kfca-llm") and all(name in out for name in SUBCOMMANDS) and err == ""


def test_no_bitsandbytes_kernel_warning_in_a_flower_worker_started_from_the_repository_root():
    """From the repository root (``flwr run .``, ``python -m``, Ray workers: the working directory is on
    ``sys.path``) ``import kernels`` finds this repository's kernels/ folder; bitsandbytes, imported by peft, then
    fails ``from kernels import get_kernel`` and warns on CPUs with AVX512-BF16 (it warns as well where no
    ``kernels`` exists at all). A Flower worker loads the ClientApp first, then trains (peft)."""
    probe = ("from kfca_llm.flower.client_app import app\n"
             "import peft\n"
             "import importlib.util, bitsandbytes.functional as F\n"
             "print(importlib.util.find_spec('kernels').origin)\n"
             "print(bool(F.has_avx512bf16()))\n")
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    origin, probed = done.stdout.split()[-2:]
    assert origin == str(ROOT / "kernels" / "__init__.py")  # the repository's folder answers the probe
    if probed != "True":
        pytest.skip("bitsandbytes looks for the hub kernel only on CPUs with AVX512-BF16; this one has none")
    assert "gemm_4bit_forward" not in done.stderr and "kernels-community" not in done.stderr, done.stderr
