"""One function closes a round (``kfca_llm.fl.pool_close.close_round``): the live ``KFCAStrategy``, ``verify`` and a
resumed ``KFCAStrategy`` all reach it, whatever name they bind it by (the spy matches its code object)."""

import sys
import threading
from contextlib import contextmanager

import pytest

pytest.importorskip("flwr", reason="Flower is the optional extra kfca-llm[flower] (make install installs it)")

from flower_ledger_server import serve  # noqa: E402

from kfca_llm.fl import pool_close  # noqa: E402
from kfca_llm.flower import verify_ledger  # noqa: E402


@contextmanager
def closing_calls():
    """(calling function, round) of each ``close_round`` call made inside the block."""
    calls, code = [], pool_close.close_round.__code__

    def profile(frame, event, arg):
        if event == "call" and frame.f_code is code:
            calls.append((frame.f_back.f_code.co_name, frame.f_locals["closing"].round))

    sys.setprofile(profile)
    threading.setprofile(profile)
    try:
        yield calls
    finally:
        sys.setprofile(None)
        threading.setprofile(None)


def test_the_live_run_verify_and_a_resumed_run_close_each_round_with_one_function(tmp_path):
    ledger = tmp_path / "rewards.sqlite"
    with closing_calls() as live:
        serve(ledger, rounds=2, keep_signs=True, report=lambda line: None)
    assert live == [("score_round", 1), ("score_round", 2)]
    with closing_calls() as resumed:  # the ledger replayed (``PoolTracker._advance``), then round 3 live
        strategy = serve(ledger, rounds=3, keep_signs=True, resume=True, report=lambda line: None)
    assert strategy.round_offset == 2
    assert resumed == [("_advance", 1), ("_advance", 2), ("score_round", 3)]
    with closing_calls() as verified:  # each round is checked on the pool of the rounds before it
        check = verify_ledger(ledger)
    assert check.ok and [r.status for r in check.rounds] == ["match"] * 3
    assert verified == [("_advance", 1), ("_advance", 2)]
