"""The checks ``KFCAStrategy`` runs on its options before it touches a ledger: each bad option fails at
construction, naming itself, not in round 1."""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable

import numpy as np
from flwr.serverapp.strategy import Strategy

from ..engine import get_backend
from ..engine.duplicates import check_duplicate_policy
from ..engine.public import PublicConditioning
from ..errors import InputError
from ..fl.aggregate import REPLY_AGGREGATIONS
from ..partition import check_bonus_fraction, check_penalty, check_seed
from .identity import check_identity_mode


def check_options(strategy, peers, seed, penalty, bonus_fraction, backend, ledger, aggregation, duplicates,
                  identity) -> None:
    if not isinstance(strategy, Strategy):
        raise InputError(f"strategy must be a Flower message-API Strategy (flwr.serverapp.strategy), "
                         f"got {type(strategy).__name__}")
    if peers is not None and (isinstance(peers, bool) or not isinstance(peers, (int, np.integer)) or peers < 1):
        raise InputError(f"peers must be None (every other node) or an integer >= 1, got {peers!r}")
    check_seed(seed)
    check_penalty(penalty)
    check_bonus_fraction(bonus_fraction)
    if backend != "auto":
        get_backend(backend)  # an unknown backend, or one that cannot run, says why now, not in round 1
    if ledger is not None and not isinstance(ledger, (str, os.PathLike)):
        raise InputError(f"ledger must be a file path or None, got {type(ledger).__name__}")
    check_duplicate_policy(duplicates)
    check_identity_mode(identity)
    if aggregation not in REPLY_AGGREGATIONS:
        raise InputError(f"aggregation must be one of {REPLY_AGGREGATIONS}, got {aggregation!r}")
    if aggregation == "reward-weighted" and not isinstance(getattr(strategy, "weighted_by_key", None), str):
        raise InputError(f"aggregation='reward-weighted' scales the wrapped strategy's weight key, but "
                         f"{type(strategy).__name__} has no `weighted_by_key`")


def takes_keyword(function: Callable, name: str) -> bool:
    try:
        parameters = inspect.signature(function).parameters
    except (TypeError, ValueError):  # a callable without a readable signature takes the arrays only
        return False
    return name in parameters or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())


def check_conditioning(public_steps: int, public_buckets: int, penalty: str) -> PublicConditioning:
    """The public strata's settings (``engine.public``); the sampled penalty is not drawn within strata."""
    conditioning = PublicConditioning(public_steps, public_buckets)
    if conditioning.enabled and penalty == "sampled":
        raise InputError('penalty="sampled" draws its penalty tasks from the whole task sets; the public strata '
                         '(public_steps) need penalty="expected", or public_steps=0')
    return conditioning
