"""`make test` runs two xdist workers: the modules sharing a federation run must land on one worker."""

import os
from pathlib import Path

import torch
from conftest import SHARED_RUNS, shared_run_scopes, worker_threads

ROOT = Path(__file__).resolve().parents[1]


def test_every_module_using_a_shared_federation_run_is_scheduled_with_the_others_using_it():
    scopes = shared_run_scopes(ROOT, ROOT / "tests")
    assert set(scopes.values()) == set(SHARED_RUNS)
    assert scopes["tests/test_federated_ordering.py"] == scopes["tests/engine/test_duplicates.py"] == "tiny_federation"
    assert scopes["tests/test_federated.py"] == scopes["tests/test_round_timing.py"] == "short_federation"
    # a module that names no shared run keeps its own scope (it is not listed)
    assert "tests/test_recipe.py" not in scopes


def test_every_slow_scope_names_a_module_or_a_shared_run():
    from conftest import SLOW_SCOPES

    assert all(scope in SHARED_RUNS or (ROOT / scope).is_file() for scope in SLOW_SCOPES), SLOW_SCOPES


def test_the_scheduler_hands_out_the_slowest_scope_first_then_the_ones_with_most_tests():
    """Three work units: the slow single-test real-process module goes out first (xdist's own order, most
    tests first, made it the last), then the bigger of two unmeasured modules."""
    from conftest import pytest_xdist_make_scheduler

    class Config:
        rootpath = ROOT

        @staticmethod
        def getvalue(name):
            return {"dist": "load", "tx": ["2*popen"]}[name]

    class Node:
        def __init__(self):
            self.sent = []

        def send_runtest_some(self, indexes):
            self.sent.append(indexes)

    scheduler = pytest_xdist_make_scheduler(Config(), None)
    collection = ["tests/test_tensors.py::a", "tests/test_recipe.py::a", "tests/test_recipe.py::b",
                  "tests/test_recipe.py::c", "tests/flower/test_superlink.py::a"]
    node = Node()
    scheduler.registered_collections[node] = collection
    for nodeid in collection:
        scheduler.workqueue.setdefault(scheduler._split_scope(nodeid), {})[nodeid] = False
    for _ in range(3):
        scheduler._assign_work_unit(node)
    assert node.sent == [[4], [1, 2, 3], [0]]


def test_an_xdist_worker_runs_torch_on_its_share_of_the_cores():
    worker = {"PYTEST_XDIST_WORKER": "gw0", "PYTEST_XDIST_WORKER_COUNT": "2"}
    assert [worker_threads(worker, cores) for cores in (1, 2, 3, 16)] == [1, 1, 1, 8]
    assert worker_threads({}, 16) is None and worker_threads({**worker, "OMP_NUM_THREADS": "4"}, 16) is None
    if os.environ.get("PYTEST_XDIST_WORKER"):  # this session: the worker's torch and the processes it starts
        assert torch.get_num_threads() == int(os.environ["OMP_NUM_THREADS"]) >= 1


def test_the_interpreters_language_is_patched_once_per_launch_not_again_in_each_helper_call(monkeypatch):
    """conftest's patch_language_once: Triton's own patch runs where the language is unpatched (a launch starting),
    and nothing runs inside a launch (its helpers see the launch's patch)."""
    from types import SimpleNamespace

    import triton.language as tl
    from conftest import patch_language_once

    calls = []
    interpreter = SimpleNamespace(_patch_lang=lambda fn: calls.append(fn) or "triton's scope")
    patch_language_once(interpreter, tl)
    kernel = SimpleNamespace(__globals__={"tl": tl})
    assert interpreter._patch_lang(kernel) == "triton's scope" and calls == [kernel]
    monkeypatch.setattr(tl, "load", lambda *args, **kwargs: None)  # what Triton's patch puts in place
    interpreter._patch_lang(kernel).restore()
    assert calls == [kernel]
    bare = SimpleNamespace(__globals__={})  # no language in sight: Triton's function (and its assertion) decides
    assert interpreter._patch_lang(bare) == "triton's scope" and calls == [kernel, bare]
