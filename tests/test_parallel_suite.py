"""`make test` runs two xdist workers: the modules sharing a federation run must land on one worker."""

from pathlib import Path

from conftest import SHARED_RUNS, shared_run_scopes

ROOT = Path(__file__).resolve().parents[1]


def test_every_module_using_a_shared_federation_run_is_scheduled_with_the_others_using_it():
    scopes = shared_run_scopes(ROOT, ROOT / "tests")
    assert set(scopes.values()) == set(SHARED_RUNS)
    assert scopes["tests/test_federated_ordering.py"] == scopes["tests/engine/test_duplicates.py"] == "tiny_federation"
    assert scopes["tests/test_federated.py"] == scopes["tests/test_round_timing.py"] == "short_federation"
    # a module that names no shared run keeps its own scope (it is not listed)
    assert "tests/test_recipe.py" not in scopes
