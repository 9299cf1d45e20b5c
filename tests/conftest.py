"""Test setup: without a CUDA device, Triton kernels run under the interpreter on CPU tensors.

TRITON_INTERPRET must be set before anything imports triton (kernels read it when decorated),
so it is set here, at collection time, before any test module is imported. Kernel tests put their
tensors on the ``device`` fixture: CUDA where the kernels run compiled, the CPU where they run
interpreted (a compiled kernel never gets CPU tensors, an interpreted one never CUDA tensors).
"""

import multiprocessing.util
import os
import runpy
import subprocess
import sys
from pathlib import Path

import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"


def worker_threads(environ, cores: int) -> int | None:
    """Torch threads of a pytest-xdist worker: its share of the cores (None: not a worker, or OMP_NUM_THREADS set).

    With the default, a thread per core in each of `make test`'s two workers, the threads of one parallel region
    wait, spinning, for a core the other worker holds: one federation test took 69 s instead of 14 s at load 8."""
    if not environ.get("PYTEST_XDIST_WORKER") or "OMP_NUM_THREADS" in environ:
        return None
    return max(1, cores // int(environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))


WORKER_THREADS = worker_threads(os.environ, os.cpu_count() or 1)
if WORKER_THREADS is not None:  # this worker's torch, and every process it starts
    os.environ["OMP_NUM_THREADS"] = str(WORKER_THREADS)
    torch.set_num_threads(WORKER_THREADS)


import zlib  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402

FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def random_values(rng: np.random.Generator, numel: int, dtype: torch.dtype, zero_fraction: float = 0.2):
    """Gaussian values with exact +0.0 and -0.0 entries mixed in (never zeros alone)."""
    values = rng.standard_normal(numel)
    roll = rng.random(numel)
    values[roll < zero_fraction / 2] = 0.0
    values[(roll >= zero_fraction / 2) & (roll < zero_fraction)] = -0.0
    return torch.from_numpy(values).to(dtype)


def random_updates(rng: np.random.Generator, n_clients: int, shapes: dict, *, zero_tensor: str | None = None):
    """Per-client state dicts over ``shapes``; each tensor gets a random float dtype.

    ``zero_tensor`` (if given) is structurally zero: every client's values there are +-0.0.
    """
    dtypes = {name: FLOAT_DTYPES[int(rng.integers(len(FLOAT_DTYPES)))] for name in shapes}
    updates = []
    for _ in range(n_clients):
        update = {}
        for name, shape in shapes.items():
            numel = int(np.prod(shape))
            values = random_values(rng, numel, dtypes[name], zero_fraction=float(rng.uniform(0.0, 0.6)))
            if name == zero_tensor:
                values = torch.where(torch.from_numpy(rng.random(numel) < 0.5), 0.0, -0.0).to(dtypes[name])
            update[name] = values.reshape(shape)
        updates.append(update)
    return updates


KERNELS_INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def patch_language_once(interpreter, tl):
    """Triton's interpreter patches triton.language for a launch (and restores it after), but also again at every
    call of a @triton.jit helper inside the kernel: ~5 scans of the language's members per call, 40% of a pack
    kernel's interpreted time. Where the helper's language is patched already (a launch is running), the launch's
    patch stands; otherwise Triton's own function runs. Results are unchanged: the same functions are in place."""
    patch = interpreter._patch_lang

    class Unchanged:
        def restore(self):
            pass

    def patch_lang(fn):
        langs = [value for value in fn.__globals__.values() if value is tl or value is tl.core]
        if langs and not any(tl.core.is_builtin(lang.load) for lang in langs):
            return Unchanged()
        return patch(fn)

    interpreter._patch_lang = patch_lang


if KERNELS_INTERPRETED:
    import triton.language as tl
    from triton.runtime import interpreter

    if hasattr(interpreter, "_patch_lang") and hasattr(tl.core, "is_builtin"):
        patch_language_once(interpreter, tl)


@pytest.fixture(scope="session")
def device() -> torch.device:
    """Where the Triton kernels' tensors live in this session (see the module docstring)."""
    return torch.device("cpu" if KERNELS_INTERPRETED else "cuda")


@pytest.fixture
def rng(request) -> np.random.Generator:
    """A generator seeded from the test's name, so every test draws its own fixed inputs."""
    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))


# --- benchmark scripts in the worker --------------------------------------------------------------------

REPOSITORY = Path(__file__).resolve().parents[1]


@pytest.fixture
def run_script(monkeypatch, capsys):
    """Runs a benchmark script as `python SCRIPT ARGS` would, in this process (a fresh interpreter would import
    torch, numba and triton again for each script), and returns what it printed. Only for scripts that leave
    module attributes alone (a script that patches a module for its run needs its own interpreter, as
    test_benchmarks_smoke's `_run` gives it); the worker's torch thread count is restored all the same."""
    def run(args):
        script = REPOSITORY / args[0]
        monkeypatch.chdir(REPOSITORY)
        monkeypatch.syspath_prepend(str(script.parent))
        monkeypatch.setattr(sys, "argv", [str(script), *args[1:]])
        threads = torch.get_num_threads()
        capsys.readouterr()
        try:
            runpy.run_path(str(script), run_name="__main__")
        except SystemExit as exit:
            assert exit.code in (None, 0), capsys.readouterr()
        finally:
            torch.set_num_threads(threads)
        return capsys.readouterr().out
    return run


# --- the two tiers: `make test` (not slow) and `make test-slow` (benchmarks/SUITE_TIME.md) ---------------------

def refuse_processes(monkeypatch, nodeid: str) -> None:
    """Makes every way a test could start a process fail the test, naming it: a test that starts processes (Flower,
    Ray, accelerate, pip, a fresh interpreter) is listed slow (tests/slow_tests.txt), so that `make test` stays
    under three minutes as tests are added. ``pytest.fail`` raises a BaseException: a library's ``except
    Exception`` does not swallow it."""
    def refuse(what):
        def start(*args, **kwargs):
            pytest.fail(f"{nodeid} starts a process ({what}); a test that starts processes is listed in "
                        "tests/slow_tests.txt (`make test` leaves it to `make test-slow`)", pytrace=False)
        return start

    monkeypatch.setattr(subprocess.Popen, "_execute_child", refuse("subprocess"))
    monkeypatch.setattr(multiprocessing.util, "spawnv_passfds", refuse("multiprocessing spawn"))
    monkeypatch.setattr(os, "fork", refuse("os.fork"))
    monkeypatch.setattr(os, "posix_spawn", refuse("os.posix_spawn"))
    monkeypatch.setattr(os, "system", refuse("os.system"))


@pytest.hookimpl(tryfirst=True)  # before pytest's own `-m` deselection reads the marks
def pytest_collection_modifyitems(config, items):
    """Marks the tests tests/slow_tests.txt lists ``slow``."""
    from slow_tests import is_slow, slow_entries

    entries = slow_entries()
    for item in items:
        if is_slow(item.nodeid, entries):
            item.add_marker(pytest.mark.slow)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Outside the slow tier no process starts, in the test or in the fixtures set up for it (a module's Ray run)."""
    if item.get_closest_marker("slow") is not None:
        return (yield)
    with pytest.MonkeyPatch.context() as patch:
        refuse_processes(patch, item.nodeid)
        return (yield)


# --- tiny federations, each run once per test session --------------------------------------------------

ORDERING_SEED = 0


@pytest.fixture(scope="session")
def tiny_federation():
    """The default tiny run (recipes/tiny.toml as shipped, seed 0): the attack-ordering regression."""
    from helpers import TINY

    from kfca_llm.fl.rounds import FederationOptions, run_federation
    from kfca_llm.recipe import load_recipe

    recipe = load_recipe(TINY, [f"kfca.seed={ORDERING_SEED}"])
    return run_federation(recipe, FederationOptions(progress=False))


@pytest.fixture(scope="session")
def short_federation(tmp_path_factory):
    """3 rounds, 2 steps, six analysis strategies, everything saved: (recipe, out_dir, result)."""
    from helpers import short_recipe

    from kfca_llm.fl.rounds import FederationOptions, run_federation

    out = tmp_path_factory.mktemp("fed")
    recipe = short_recipe('kfca.attacks=["honest", "flip", "stale", "lagged:1", "zero", "sparse:0.5"]',
                          "train.save-client-updates=true")
    return recipe, out, run_federation(recipe, FederationOptions(out_dir=out, progress=False))


@pytest.fixture(scope="session")
def pooled(tmp_path_factory):
    """(strategy, result, ledger) of ``tests/flower/pooled_strategy_run.run`` (a 24-round KFCAStrategy run at two a
    round, in process): the peer pool's strategy and ledger tests read it; a test that edits the ledger edits a copy,
    or restores it. Not a ``SHARED_RUNS`` fixture: a few seconds, computed again on the other worker if it needs it."""
    pytest.importorskip("flwr", reason="Flower is the optional extra kfca-llm[flower] (make install installs it)")
    sys.path.insert(0, str(Path(__file__).parent / "flower"))
    from pooled_strategy_run import run

    ledger = tmp_path_factory.mktemp("pool") / "rewards.sqlite"
    return (*run(ledger), ledger)


# --- parallel runs (pytest-xdist: `make test` runs two workers) --------------------------------------------

SHARED_RUNS = ("tiny_federation", "short_federation")
"""Session fixtures that run a federation: each worker running a test that uses one computes it again."""


def shared_run_scopes(root: Path, tests: Path) -> dict[str, str]:
    """Test module (its node id's path) -> the scope of the first ``SHARED_RUNS`` fixture it names."""
    scopes = {}
    for path in sorted(tests.rglob("test_*.py")):
        text = path.read_text(encoding="utf-8")
        fixture = next((name for name in SHARED_RUNS if name in text), None)
        if fixture is not None:
            scopes[path.relative_to(root).as_posix()] = fixture
    return scopes


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist: plain `pytest` runs without the plugin
def pytest_xdist_make_scheduler(config, log):
    """Whole modules per worker (a module fixture is computed once), and the modules that share a federation run
    (``SHARED_RUNS``) on one worker, so that run is computed once too. xdist's ``--dist loadgroup`` would do the
    latter from ``xdist_group`` marks, but pytest-xdist 3.8 never groups under pytest 9.2 (it renames the test
    ids through ``item._nodeid``, which pytest 9 no longer reads)."""
    if config.getvalue("dist") != "load":
        return None
    from xdist.scheduler import LoadScopeScheduling

    scopes = shared_run_scopes(config.rootpath, Path(__file__).parent)

    class ModulesAndSharedRuns(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return scopes.get(module, module)

        def _assign_work_unit(self, node) -> None:
            # Longest first: hand out the heaviest scope left, so that what remains at the end is short and
            # neither worker idles while the other runs a long module (xdist's own order, most tests first,
            # put the single-test real-process module last).
            heaviest = max(self.workqueue, key=lambda scope: scope_weight(scope, len(self.workqueue[scope])))
            self.workqueue.move_to_end(heaviest, last=False)
            super()._assign_work_unit(node)

    return ModulesAndSharedRuns(config, log)


SLOW_SCOPES = {
    "tests/flower/test_superlink.py": 106,
    "tests/test_pool_naive.py": 106,
    "tests/test_benchmarks_smoke.py": 79,
    "tests/valuation/test_fidelity_experiment.py": 68,
    "tiny_federation": 64,
    "tests/flower/test_wrapped_simulation.py": 63,
    "tests/test_simulate_few_peers.py": 55,
    "tests/engine/test_flat_updates.py": 46,
    "tests/test_readme_ci.py": 38,
    "tests/kernels/test_sampled_penalty.py": 38,
    "tests/flower/test_ledger.py": 38,
    "tests/test_docs_auditing.py": 35,
    "tests/flower/test_simulation.py": 33,
    "tests/test_federated_multiprocess.py": 33,
    "tests/test_simulate.py": 32,
    "tests/kernels/test_pair_counts.py": 30,
    "tests/engine/test_triton_backend.py": 27,
    "short_federation": 24,
    "tests/test_cli.py": 23,
    "tests/valuation/test_noniid_sweep.py": 22,
    "tests/kernels/test_sign_pack.py": 19,
    "tests/test_plots.py": 19,
    "tests/test_aggregation.py": 16,
    "tests/flower/test_server_app.py": 15,
    "tests/test_attacks_public.py": 14,
    "tests/test_reference.py": 14,
    "tests/flower/test_free_riders_strategy.py": 12,
    "tests/engine/test_dispatch.py": 11,
    "tests/test_hostile_files.py": 10,
}
"""Seconds a scheduling scope (a module, or a ``SHARED_RUNS`` fixture's modules) took in one `make test --durations=120`
of 1334 tests at load 5-7 (2026-11-28, benchmarks/SUITE_TIME.md): the sum of its tests among the 120 slowest, the
scopes from 10 s, three of them (test_docs_auditing, test_hostile_files, test_simulate_few_peers) scaled by what
their cuts saved back to back. Busy seconds, and a scope's many short tests are missing: a guess, enough to order."""


def scope_weight(scope: str, tests: int) -> tuple[float, int]:
    """The order the scheduler hands out scopes in: measured seconds (``SLOW_SCOPES``), then number of tests."""
    return SLOW_SCOPES.get(scope, 0.0), tests
