"""Shapley values vs KFCA on adapter updates: a linear toy and the tiny LLM federation with attackers."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kfca_llm import InputError
from kfca_llm.valuation.adapters import ROUND_METHODS, mean_values, reconstruct, value_round


def _regression_round(seed: int = 0):
    """Four honest clients take gradient steps on a shared least-squares task; a flip and a zero attacker."""
    g = torch.Generator().manual_seed(seed)
    d = 200
    truth = torch.randn(d, generator=g)
    x_held = torch.randn(256, d, generator=g)
    y_held = x_held @ truth
    global_state = {"w": torch.zeros(d)}

    def local_update(k: int) -> dict:
        x = torch.randn(64, d, generator=g)
        y = x @ truth + 0.5 * torch.randn(64, generator=g)
        w = torch.zeros(d)
        for _ in range(20):
            w = w - 0.05 * x.T @ (x @ w - y) / 64
        return {"w": w}

    updates = {f"honest-{k}": local_update(k) for k in range(4)}
    updates["flip"] = {"w": -local_update(4)["w"]}  # trains honestly, submits the negation
    updates["zero"] = {"w": torch.zeros(d)}
    sizes = {c: 64 for c in updates}
    loss = lambda state: float(((x_held @ state["w"] - y_held) ** 2).mean())  # noqa: E731
    return global_state, updates, sizes, loss


def test_flip_and_zero_get_the_lowest_values_from_every_method():
    global_state, updates, sizes, loss = _regression_round()
    r = value_round(global_state, updates, sizes, loss, seed=3)
    assert list(r.values) == list(ROUND_METHODS) == ["mr_sv", "gtg_shapley", "kfca_qp"]
    for method in ROUND_METHODS:
        values = dict(zip(r.clients, r.values[method]))
        honest = min(v for c, v in values.items() if c.startswith("honest"))
        assert max(values["flip"], values["zero"]) < honest, method
    # MR-SV is the exact Shapley value of v = -loss: efficiency
    assert sum(r.values["mr_sv"]) == pytest.approx(r.v_grand - r.v_empty, rel=1e-9)
    assert r.coalitions["mr_sv"] == 2 ** 6 and 0 < r.coalitions["gtg_shapley"] <= 2 ** 6
    assert r.distance_to_mr["kfca_qp"]["spearman"] > 0.5


def test_reconstruct_weights_and_inputs():
    g, updates, sizes, _ = _regression_round()
    ups = [updates["honest-0"], updates["honest-1"]]
    out = reconstruct(g, ups, np.array([0.25, 0.75]))
    torch.testing.assert_close(out["w"], 0.25 * ups[0]["w"] + 0.75 * ups[1]["w"])
    with pytest.raises(InputError, match="at least two clients"):
        value_round(g, {"a": ups[0]}, {"a": 1}, lambda s: 0.0)
    with pytest.raises(InputError, match="no positive number of examples"):
        value_round(g, {"a": ups[0], "b": ups[1]}, {"a": 1}, lambda s: 0.0)


def test_tiny_llm_run_with_fixed_attackers():
    """simulate --valuation's observer on a tiny federation: a flip and a zero client get the lowest values."""
    from helpers import short_recipe

    from kfca_llm.fl.rounds import FederationOptions, run_federation
    from kfca_llm.valuation.llm_rounds import RoundValuer

    # 5 clients (3 honest: an honest client's peers must be mostly honest for KFCA), one round,
    # 4 held-out rows: 32 coalitions for MR-SV and up to 32 more for GTG-Shapley
    recipe = short_recipe("num-clients=5", "strategy.fraction-train=1.0", "kfca.attacks=[]",
                          'kfca.attackers=["1=flip", "2=zero"]', "num-server-rounds=1",
                          "train.training-arguments.max-steps=2")
    valuer = RoundValuer(recipe, held_out_rows=4)
    run_federation(recipe, FederationOptions(progress=False, on_round=valuer))
    assert len(valuer.rounds) == 1 and valuer.rounds[0].clients == [f"client-{i:03d}" for i in range(5)]
    assert sorted(valuer.fixed_attacks.values()) == ["flip", "zero"]
    means = mean_values(valuer.rounds)
    flip, zero = sorted(valuer.fixed_attacks, key=lambda c: valuer.fixed_attacks[c])
    for method, values in means.items():
        honest = [v for c, v in values.items() if c not in valuer.fixed_attacks]
        assert max(values[flip], values[zero]) < min(honest), (method, values)
    assert "MR-SV" in valuer.table()
