"""KFCA rewards for Flower apps (the ``flower`` extra: ``pip install -e '.[flower]'`` in a clone of kfca-llm).

``KFCAStrategy`` wraps any Flower message-API strategy and pays every training reply to a participant
identity (``identity``); the ledger (``read_ledger``) keeps what was paid, ``audit.verify_ledger`` checks it.
The ledger needs only the standard library, so reading one works without Flower installed; the strategy
is imported on first use.
"""

from .ledger import read_ledger
from .ledger_rows import FailureRow, LedgerContents, RewardRow, RoundRow

__all__ = ["AGGREGATION_MODES", "FailureRow", "KFCAStrategy", "LedgerContents", "RewardRow", "RoundRow",
           "declare_participant", "read_ledger", "update_sha256", "verify_ledger"]


def __getattr__(name: str):
    if name in ("KFCAStrategy", "AGGREGATION_MODES"):
        from . import strategy

        return getattr(strategy, name)
    if name == "declare_participant":
        from . import replies

        return replies.declare_participant
    if name in ("update_sha256", "verify_ledger"):
        from . import audit

        return getattr(audit, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
