"""The ledger alone decides whether a run's packed signs are kept (``Ledger.keep_signs``): a resumed run goes on as
the run it continues recorded, whatever it was told, and a strategy without a ledger keeps nothing."""

import pytest

pytest.importorskip("flwr", reason="Flower is the optional extra kfca-llm[flower] (make install installs it)")

from flower_ledger_server import serve  # noqa: E402
from flwr.serverapp.strategy import FedAvg  # noqa: E402

from kfca_llm.flower import KFCAStrategy, read_ledger, verify_ledger  # noqa: E402


@pytest.mark.parametrize("recorded", [True, False])
def test_a_resumed_run_keeps_signs_as_its_run_recorded(tmp_path, recorded):
    ledger = tmp_path / "rewards.sqlite"
    serve(ledger, rounds=1, keep_signs=recorded, report=lambda line: None)
    resumed = serve(ledger, rounds=2, keep_signs=not recorded, resume=True, report=lambda line: None)
    assert resumed.round_offset == 1 and resumed.keep_signs is recorded
    contents = read_ledger(ledger)
    assert [r.keep_signs for r in contents.runs] == [recorded]
    assert [r.signs_kept for r in contents.rounds] == [recorded, recorded]
    assert verify_ledger(ledger).ok


def test_nothing_is_kept_without_a_ledger():
    assert KFCAStrategy(FedAvg(), ledger=None, keep_signs=True).keep_signs is False
