"""Installing: the Python version `make` and pyproject ask for, and the packages setuptools is told about."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def fake_old_python(folder: Path) -> Path:
    """An interpreter that says it is Python 3.10.13 (this one, with ``sys.version_info`` replaced)."""
    script = folder / "python3.10"
    pretend = "import sys; sys.version_info = (3, 10, 13, 'final', 0); sys.version = '3.10.13'; exec(sys.argv[1])"
    script.write_text(f'#!/bin/sh\nexec "{sys.executable}" -c "{pretend}" "$2"\n')
    script.chmod(0o755)
    return script


def test_make_stops_with_one_line_before_creating_anything_when_python_is_older_than_3_11(tmp_path):
    venv = tmp_path / "venv"
    done = subprocess.run(["make", "--no-print-directory", "install", f"VENV={venv}",
                           f"PYTHON={fake_old_python(tmp_path)}"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    (line, *_make_says_which_rule) = done.stderr.splitlines()
    assert line == f"make: {tmp_path}/python3.10 is Python 3.10.13; kfca-llm needs Python >= 3.11 (Flower does): " \
                   "make PYTHON=python3.11 ..."
    assert not venv.exists()  # stopped before the virtual environment and pip


def test_pyproject_and_readme_ask_for_python_3_11():
    """Flower needs 3.11 from 1.31 on; the flower extra asks 1.41-1.42."""
    project = PYPROJECT["project"]
    assert project["requires-python"] == ">=3.11"
    versions = sorted(c.rsplit(" :: ", 1)[1] for c in project["classifiers"] if c.startswith("Programming Language "
                                                                                             ":: Python :: 3."))
    assert versions and all(tuple(map(int, v.split("."))) >= (3, 11) for v in versions)
    assert not any("tomli" in d for d in project["dependencies"])  # tomllib is in every Python it installs on
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "Python >= 3.11" in readme and "3.10" not in readme


def importable_folders() -> set[str]:
    """Dotted names of the folders pip installs under kfca_llm (pyproject maps kernels/ and recipes/ into it)."""
    names = set()
    for package, folder in PYPROJECT["tool"]["setuptools"]["package-dir"].items() | {("kfca_llm", "kfca_llm")}:
        for path in [ROOT / folder, *(ROOT / folder).rglob("*")]:
            if path.is_dir() and path.name != "__pycache__" and any(p.is_file() for p in path.iterdir()):
                names.add(".".join([package, *path.relative_to(ROOT / folder).parts]))
    return names


def test_every_folder_installed_is_a_listed_package():
    """A data folder inside a package (recipes/expectations) that is not listed makes setuptools print ~45 lines
    of "Package would be ignored" on every install (and a later setuptools may leave it out)."""
    listed = set(PYPROJECT["tool"]["setuptools"]["packages"])
    assert "kfca_llm.recipes.expectations" in importable_folders()
    assert importable_folders() <= listed


CPU_INDEX = "--index-url https://download.pytorch.org/whl/cpu"


def test_torch_pip_options_reach_the_torch_install_and_the_readme_says_how_to_get_cpu_wheels(tmp_path):
    """Plain PyPI's torch==2.13.0 is the CUDA build on Linux x86-64; the CPU wheels need PyTorch's index."""
    planned = subprocess.run(["make", "--no-print-directory", "-n", "install", f"VENV={tmp_path / 'venv'}",
                              f"TORCH_PIP_OPTIONS={CPU_INDEX}"], cwd=ROOT, capture_output=True, text=True,
                             timeout=60, check=True).stdout
    (torch_install,) = [line for line in planned.splitlines() if '"torch==' in line]
    assert torch_install.endswith(f'pip install --quiet {CPU_INDEX} "torch==2.13.0"')
    readme = " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())
    assert f"TORCH_PIP_OPTIONS='{CPU_INDEX}'" in readme and "the CPU build `torch==2.13.0`" not in readme
