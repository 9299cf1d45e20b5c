"""End to end: every reward from backend="triton" equals (==) the one from backend="cpu"."""

import numpy as np
import pytest
from conftest import random_updates
from safetensors.torch import save_file

import kfca_llm
from kfca_llm.errors import InputError

SHAPES = {"layers.0.q.lora_A": (4, 37), "layers.0.q.lora_B": (29, 4), "layers.1.v.lora_A": (4, 37),
          "layers.1.v.lora_B": (61,), "zero.bias": (5,)}


def _clients(rng, n):
    updates = random_updates(rng, n, SHAPES, zero_tensor="zero.bias")
    return {f"client-{int(rng.integers(10**6)):06d}": update for update in updates}


def _assert_same_report(a, b):
    assert a.rewards == b.rewards
    assert a.pairwise == b.pairwise
    assert a.bonus_agreement == b.bonus_agreement and a.penalty_agreement == b.penalty_agreement
    assert a.tasks == b.tasks
    assert a.backend == "triton" and b.backend == "cpu"


@pytest.mark.parametrize("penalty", ["expected", "sampled"])
@pytest.mark.parametrize("peers", [None, 2])
def test_rewards_equal_cpu_backend(penalty, peers, rng):
    updates = _clients(rng, 6)
    seed = int(rng.integers(2**32))
    fraction = float(rng.uniform(0.2, 0.8))
    kwargs = dict(peers=peers, seed=seed, penalty=penalty, bonus_fraction=fraction)
    report = kfca_llm.score_updates(updates, backend="triton", **kwargs)
    _assert_same_report(report, kfca_llm.score_updates(updates, backend="cpu", **kwargs))
    assert len(set(report.rewards.values())) > 1  # random clients do not all tie


def test_checkpoints_and_explicit_pairs_equal_cpu_backend(rng, tmp_path):
    updates = _clients(rng, 3)
    paths = {}
    for client, update in updates.items():
        paths[client] = tmp_path / f"{client}.safetensors"
        save_file({k: v.contiguous() for k, v in update.items()}, str(paths[client]))
    a, b, c = sorted(updates)
    kwargs = dict(seed=11, penalty="sampled", pairs=[(a, b), (c, a)])
    _assert_same_report(kfca_llm.score_checkpoints(paths, backend="triton", **kwargs),
                        kfca_llm.score_checkpoints(paths, backend="cpu", **kwargs))


def test_nonfinite_update_is_rejected_naming_client_and_tensor(rng):
    updates = _clients(rng, 3)
    bad_client = sorted(updates)[1]
    updates[bad_client]["layers.1.v.lora_B"][3] = np.nan
    with pytest.raises(InputError, match=f"{bad_client}.*layers.1.v.lora_B"):
        kfca_llm.score_updates(updates, backend="triton")
