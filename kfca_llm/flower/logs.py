"""What Flower logs about the app, told as the app's user needs it: the ledger's round numbers on a resumed
run, and a wrong setting on one line."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

from ..errors import InputError

FLOWER_LOGGER = "flwr"
ROUND_HEADER = "[ROUND %s/%s]"
"""Flower 1.42's line at the start of each round (``flwr/serverapp/strategy/strategy.py``, ``Strategy.start``)."""


class InputErrorOnOneLine(logging.Filter):
    """Flower's processes log an app's exception with its traceback (Flower 1.42: ``flwr/simulation/app.py`` and
    ``flwr/superlink/runtime/run_serverapp.py``, ``log(ERROR, "%s raised an exception", ..., exc_info=ex)``)
    and then mark the run failed. A wrong setting (``InputError``) is the user's to fix: one line, the
    message, no traceback; the run still ends as failed."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, InputError):
            record.msg, record.args = "%s: InputError: %s", (record.getMessage(), " ".join(str(exc).split()))
            record.exc_info, record.exc_text = None, None
        return True


def report_input_errors_on_one_line() -> None:
    """Install ``InputErrorOnOneLine`` on Flower's logger (once per process)."""
    flower_logger = logging.getLogger(FLOWER_LOGGER)
    if not any(isinstance(f, InputErrorOnOneLine) for f in flower_logger.filters):
        flower_logger.addFilter(InputErrorOnOneLine())


class _RoundOffset(logging.Filter):
    def __init__(self, offset: int):
        super().__init__()
        self.offset = offset

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg == ROUND_HEADER and isinstance(record.args, tuple) and len(record.args) == 2:
            record.args = tuple(int(n) + self.offset for n in record.args)
        return True


@contextmanager
def ledger_round_numbers(offset: int) -> Iterator[None]:
    """Flower counts a run's rounds from 1; a run resumed after ``offset`` rounds logs round 1 of 1 for what
    the ledger records as round ``offset + 1``. Inside this block the round header says the ledger's round."""
    if offset == 0:
        yield
        return
    flower_logger, shift = logging.getLogger(FLOWER_LOGGER), _RoundOffset(offset)
    flower_logger.addFilter(shift)
    try:
        yield
    finally:
        flower_logger.removeFilter(shift)
