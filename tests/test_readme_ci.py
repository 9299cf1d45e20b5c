"""The CI example (docs/ci-check.md; the README's front page quotes its command): the GitHub Actions job and
the plain shell step run the same command, and the shell step passes on the tiny recipe (one seed and two local
steps instead of three seeds and the recipe's own eight, to keep the suite fast; the rounds are as written)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import yaml
from doc_pages import one_block, page
from helpers import TINY

SECTION = page("docs/ci-check.md")
JOB = re.search(r"```yaml\n(.*?)```", SECTION, re.S)[1]
SHELL = re.search(r"```bash\n(.*?)```", SECTION, re.S)[1]
USER_RECIPE = "my-recipe.toml"


def job_steps() -> list[dict]:
    (job,) = yaml.safe_load(JOB).values()
    return job["steps"]


def test_the_job_is_short_and_runs_the_shell_steps_command():
    assert len(JOB.strip().splitlines()) < 10 and len(SHELL.strip().splitlines()) < 10
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


def test_the_shell_step_passes_on_the_tiny_recipe(tmp_path):
    script = (SHELL.replace(USER_RECIPE, f"{TINY} --set train.training-arguments.max-steps=2")
              .replace("--seeds 0,1,2", "--seeds 0"))
    assert script.count(str(TINY)) == 1 and "--seeds 0 " in script
    bin_dir = str(Path(sys.executable).parent)  # the environment running the tests has kfca-llm installed
    # pip finds kfca-llm installed (no index needed); one thread: the tiny model gains nothing from a second
    # one, and on cores shared with other jobs threads that wait for each other double the CPU time.
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "PIP_NO_INDEX": "1",
           "OMP_NUM_THREADS": "1", "NUMBA_NUM_THREADS": "1"}
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=1200)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "9/9 expectations hold" in done.stdout
    cases = ET.parse(tmp_path / "kfca-check.xml").getroot().findall("testsuite/testcase")
    assert len(cases) == 9 and all(c.find("failure") is None for c in cases)
    runs = tmp_path / "runs" / "tiny-seeds0"
    assert (runs / "summary.json").is_file() and (runs / "seed0" / "report.json").is_file()
