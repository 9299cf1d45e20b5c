"""The CI example (docs/ci-check.md; the README's front page quotes its command): the GitHub Actions job and
the plain shell step run the same command, and the shell step passes on the tiny recipe (one seed and two local
steps instead of three seeds and the recipe's own eight, to keep the suite fast; the rounds are as written),
installing kfca-llm from a checkout (``./kfca-llm``: a copy of this repository) as the page shows."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sysconfig
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import yaml
from doc_pages import one_block, page
from helpers import TINY

ROOT = Path(__file__).resolve().parents[1]

SECTION = page("docs/ci-check.md")
JOB = re.search(r"```yaml\n(.*?)```", SECTION, re.S)[1]
SHELL = re.search(r"```bash\n(.*?)```", SECTION, re.S)[1]
USER_RECIPE = "my-recipe.toml"


def job_steps() -> list[dict]:
    (job,) = yaml.safe_load(JOB).values()
    return job["steps"]


def test_the_job_is_short_and_runs_the_shell_steps_command():
    # 10 lines: kfca-llm has no release on the package index, so the job checks it out (one more step)
    assert len(JOB.strip().splitlines()) <= 10 and len(SHELL.strip().splitlines()) < 10
    commands = [line for line in SHELL.strip().splitlines() if not line.startswith("export ")]
    (run,) = [step["run"] for step in job_steps() if "run" in step]
    assert run == " && ".join(commands)
    assert USER_RECIPE in run and "--junit kfca-check.xml" in run


def test_the_front_pages_check_command_is_the_shell_steps():
    (front,) = [line for line in one_block("README.md", "bash", "kfca-llm check").splitlines() if line.strip()]
    assert front in SHELL.splitlines()


def test_the_job_caches_the_model_folder_and_reports_the_junit_file():
    steps = {step["uses"].split("@")[0]: step for step in job_steps() if "uses" in step}
    assert steps["actions/cache"]["with"]["path"] == "~/.cache/huggingface"  # where HF_HOME points by default
    assert USER_RECIPE in steps["actions/cache"]["with"]["key"]
    assert steps["mikepenz/action-junit-report"]["with"]["report_paths"] == "kfca-check.xml"
    assert steps["mikepenz/action-junit-report"]["if"] == "always()"  # also (above all) when the check fails


def test_the_job_installs_kfca_llm_from_a_checkout_of_its_repository():
    """No release is on the package index: the job checks kfca-llm out into a folder and installs that."""
    (run,) = [step["run"] for step in job_steps() if "run" in step]
    (checkout,) = [step["with"] for step in job_steps() if step.get("uses", "").startswith("actions/checkout")
                   and "with" in step]
    assert checkout["repository"].endswith("/kfca-llm") and checkout["path"] == "kfca-llm"
    assert run.startswith("pip install ./kfca-llm && ") and "pip install ./kfca-llm" in SHELL.splitlines()


def fresh_environment(folder: Path) -> Path:
    """A virtual environment without kfca-llm that sees the test environment's packages (torch, ...: pip finds
    every dependency installed, no index needed) and its pip; its bin folder."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True, timeout=120)
    python = folder / "bin" / "python"
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True, timeout=60).stdout.strip()
    # A plain path line: the test environment's own .pth files (its editable kfca-llm) are not read.
    (Path(site) / "test-environment.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    (folder / "bin" / "pip").write_text(f'#!/bin/sh\nexec "{python}" -m pip "$@"\n')
    (folder / "bin" / "pip").chmod(0o755)
    return folder / "bin"


def test_the_shell_step_passes_on_the_tiny_recipe(tmp_path):
    script = (SHELL.replace(USER_RECIPE, f"{TINY} --set train.training-arguments.max-steps=2")
              .replace("--seeds 0,1,2", "--seeds 0"))
    assert script.count(str(TINY)) == 1 and "--seeds 0 " in script
    # ./kfca-llm: this repository as a checkout has it (pip builds in the folder it installs from: a copy)
    shutil.copytree(ROOT, tmp_path / "kfca-llm", ignore=shutil.ignore_patterns(
        ".git", ".venv", "runs", "build", "*.egg-info", "__pycache__", ".pytest_cache", ".ruff_cache"))
    bin_dir = fresh_environment(tmp_path / "venv")
    # No index: pip builds kfca-llm with the setuptools it has (no isolated build environment to download) and
    # finds its dependencies installed. One thread: the tiny model gains nothing from a second one, and on cores
    # shared with other jobs threads that wait for each other double the CPU time.
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "PIP_NO_INDEX": "1",
           "PIP_NO_BUILD_ISOLATION": "0", "OMP_NUM_THREADS": "1", "NUMBA_NUM_THREADS": "1"}
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=1200)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "10/10 expectations hold" in done.stdout
    cases = ET.parse(tmp_path / "kfca-check.xml").getroot().findall("testsuite/testcase")
    assert len(cases) == 10 and all(c.find("failure") is None for c in cases)
    (runs,) = (tmp_path / "runs").glob("tiny-*-seeds0")  # --rounds and --set: a folder of their own
    assert (runs / "summary.json").is_file() and (runs / "seed0" / "report.json").is_file()
    # the check ran the kfca-llm the step installed from ./kfca-llm, not the test environment's
    installed = subprocess.run([str(bin_dir / "python"), "-c", "import kfca_llm; print(kfca_llm.__file__)"],
                               cwd=tmp_path, capture_output=True, text=True, check=True, timeout=60).stdout.strip()
    assert Path(installed).is_relative_to(tmp_path / "venv") and (bin_dir / "kfca-llm").is_file()
