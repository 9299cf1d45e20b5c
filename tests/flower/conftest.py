"""Fixtures of the Flower tests shared between modules."""

import pytest


@pytest.fixture(scope="session")
def pooled(tmp_path_factory):
    """(strategy, result, ledger) of ``pooled_strategy_run.run``, once per worker: the strategy's tests and the ledger's
    read it; a test that edits the ledger edits a copy, or restores it."""
    pytest.importorskip("flwr", reason="Flower is the optional extra kfca-llm[flower] (make install installs it)")
    from pooled_strategy_run import run

    ledger = tmp_path_factory.mktemp("pool") / "rewards.sqlite"
    return (*run(ledger), ledger)
