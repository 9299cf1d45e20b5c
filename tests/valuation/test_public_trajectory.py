"""The valuation's KFCA-QP conditions on the recorded federation's public trajectory (issue 43): the global's steps
before each round, aligned with it, and ``public_steps = 0`` gives the unconditioned rewards bit for bit."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from kfca_llm.api import score_updates
from kfca_llm.engine.public import OFF, PublicConditioning
from kfca_llm.mechanism import delta_matrix
from kfca_llm.valuation.cnn_federation import FederationConfig, FederationRecord
from kfca_llm.valuation.methods import ValuationProblem, kfca_qp, mc_kfca_qp
from kfca_llm.valuation.noniid import RoundSignals, analyse_round, conditional_delta, public_strata

P, HONEST, ROUNDS = 4000, 3, 5
RIDER = HONEST  # the last client


def _federation(seed: int = 0) -> FederationRecord:
    """Three honest clients follow a drift that half renews every round (so the newest step is not predicted by the
    older ones); the fourth trains nothing and replays the global's newest step (noise in round 0: nothing public)."""
    g = torch.Generator().manual_seed(seed)
    drift = torch.randn(P, generator=g)
    flat, globals_, updates = torch.zeros(P), [], []
    for t in range(ROUNDS):
        drift = 0.5 * drift + torch.randn(P, generator=g)
        honest = [drift + 1.5 * torch.randn(P, generator=g) for _ in range(HONEST)]
        rider = flat - globals_[-1] if globals_ else torch.randn(P, generator=g)
        globals_.append(flat)
        updates.append(torch.stack([*honest, rider]))
        flat = flat + updates[-1].mean(dim=0)
    return FederationRecord(globals_, updates, flat, np.full(HONEST + 1, 100))


def _problem(record: FederationRecord, conditioning=PublicConditioning()) -> ValuationProblem:
    # KFCA-QP reads only the record, the seed, the number of clients and (MC KFCA-QP) of parameters
    return ValuationProblem(SimpleNamespace(num_parameters=P), [None] * (HONEST + 1), None, FederationConfig(rounds=ROUNDS, seed=3), record,
                            None, None, conditioning)


def test_the_records_public_steps_are_the_globals_changes_before_the_round():
    record = _federation()
    g = record.globals
    assert record.public_steps(0, 16) == []  # round 0: nothing public yet
    for actual, expected in zip(record.public_steps(3, 16), [g[1] - g[0], g[2] - g[1], g[3] - g[2]]):
        assert torch.equal(actual, expected)  # oldest first, the newest: the global sent in round 3 minus round 2's
    assert [torch.equal(a, b) for a, b in zip(record.public_steps(4, 2), [g[3] - g[2], g[4] - g[3]])] == [True, True]
    assert record.public_steps(4, 0) == []


def _pays_information_only(rewards: np.ndarray) -> bool:
    """Honest clients paid, the free rider within bonus-sample noise of 0 (the sum of 5 rounds of it)."""
    return rewards[:RIDER].min() > 0 and abs(rewards[RIDER]) < 0.2 * rewards[:RIDER].min()


def test_a_free_rider_replaying_the_newest_step_earns_nothing_once_conditioned():
    record = _federation()
    plain = kfca_qp(_problem(record, OFF)).rewards
    assert plain[RIDER] > 0.5 * plain[:RIDER].min()  # unconditioned, replaying the trajectory pays
    assert _pays_information_only(kfca_qp(_problem(record)).rewards)
    # the steps shifted by one round: older, the replay is not constant within the strata and it is paid; newer (this
    # round's own mean among them), the strata explain the honest clients' agreement too and no one is paid
    shifted = {
        "one round older": lambda t, count: record.public_steps(t - 1, count) if t >= 1 else [],
        "one round newer": lambda t, count: [record.globals[s] - record.globals[s - 1]
                                             for s in range(max(1, t - count + 2), min(t + 2, ROUNDS))],
    }
    for name, steps in shifted.items():
        misaligned = dataclasses.replace(record)
        object.__setattr__(misaligned, "public_steps", steps)
        rewards = kfca_qp(_problem(misaligned)).rewards
        assert not _pays_information_only(rewards), (name, rewards)


def test_mc_kfca_qp_conditions_on_the_same_coordinates():
    record = _federation()
    conditioned = mc_kfca_qp(_problem(record)).rewards
    plain = mc_kfca_qp(_problem(record, OFF)).rewards
    assert conditioned[RIDER] < 0.3 * plain[RIDER]


def test_off_is_the_unconditioned_engine_bit_for_bit():
    record = _federation()
    names = [f"client-{i:02d}" for i in range(HONEST + 1)]
    expected = sum(np.array([score_updates(dict(zip(names, record.updates[t])), seed=3 + t).rewards[c] for c in names])
                   for t in range(ROUNDS))
    assert kfca_qp(_problem(record, OFF)).rewards.tolist() == expected.tolist()


def _signals(record: FederationRecord, t: int) -> RoundSignals:
    preds = np.zeros((HONEST + 1, 50), dtype=np.int64)
    return RoundSignals(record.updates[t], preds, record.public_steps(t, 16))


def test_public_strata_are_the_engines_planes():
    step = torch.tensor([-1.0, 2.0, -3.0, 0.5, 0.0, -0.25, 4.0, 1.0] * 5)
    strata = public_strata([step], PublicConditioning(steps=1, magnitude_buckets=2))
    big = step.abs() >= step.abs().kthvalue(step.numel() // 2 + 1).values  # the upper magnitude bucket
    np.testing.assert_array_equal(strata, ((step < 0).long() + 2 * big.long()).numpy())
    assert public_strata([], PublicConditioning()) is None
    assert public_strata([step], OFF) is None


def test_the_sweep_pays_and_expects_within_the_strata():
    record = _federation()
    out = analyse_round(_signals(record, 3), num_labels=2, seed=1)
    plain = analyse_round(_signals(record, 3), num_labels=2, seed=1, conditioning=OFF)
    assert plain["honest_expected"][RIDER] > 0.05 and plain["honest_reward"][RIDER] > 0.05
    # constant within every stratum: its conditional delta is 0 exactly, its payment is bonus-sample noise
    assert abs(out["honest_expected"][RIDER]) < 1e-12 and abs(out["honest_reward"][RIDER]) < 0.02
    # the conditional delta is what the engine pays on: the expectation is the payment, up to the bonus sample
    np.testing.assert_allclose(out["honest_expected"], out["honest_reward"], atol=0.02)
    assert min(out["honest_expected"][:RIDER]) > 0.05


def test_the_sweep_off_is_the_plain_analysis_bit_for_bit():
    record = _federation()
    off = analyse_round(_signals(record, 3), num_labels=2, seed=1, conditioning=OFF)
    without = analyse_round(RoundSignals(record.updates[3], np.zeros((HONEST + 1, 50), dtype=np.int64)),
                            num_labels=2, seed=1)
    assert off == without
    r = np.random.default_rng(0).integers(0, 2, (2, 300))
    np.testing.assert_array_equal(conditional_delta(r[0], r[1], None, 2), delta_matrix(r[0], r[1], 2))


def test_the_config_defaults_are_the_engines():
    from kfca_llm.valuation.fidelity import FidelityConfig
    from kfca_llm.valuation.noniid import NonIIDConfig

    default = PublicConditioning()
    for cfg in (FidelityConfig(), NonIIDConfig()):
        assert (cfg.public_steps, cfg.public_buckets) == (default.steps, default.magnitude_buckets)
    with pytest.raises(ValueError, match="public steps"):
        NonIIDConfig(public_steps=9)


def test_simulate_valuations_kfca_qp_reads_the_globals_before_each_round(monkeypatch):
    """``simulate --valuation``: the observer hands KFCA-QP the steps between the globals of the rounds it saw, the
    newest being this round's global minus the last round's, under the recipe's conditioning."""
    from kfca_llm.recipe import load_recipe
    from kfca_llm.valuation import llm_rounds

    seen = []
    monkeypatch.setattr(llm_rounds, "value_round", lambda *args, **kwargs: seen.append(kwargs))
    valuer = llm_rounds.RoundValuer(load_recipe("tiny"))
    monkeypatch.setattr(valuer, "_examples", lambda tokenizer: [])
    globals_ = [{"w": torch.full((3,), float(t * t))} for t in range(4)]  # steps 1, 3, 5: each its own
    for t, g in enumerate(globals_, start=1):
        valuer(SimpleNamespace(round=t, model=None, tokenizer=None, pad_token_id=0, device="cpu", global_state=g,
                               submissions=[]))
    assert [len(k["public"]) for k in seen] == [0, 1, 2, 3]
    assert [float(step["w"][0]) for step in seen[-1]["public"]] == [1.0, 3.0, 5.0]  # oldest first, up to this round
    assert seen[-1]["conditioning"] == load_recipe("tiny").kfca.conditioning


def test_value_rounds_kfca_qp_is_the_engine_conditioned_on_the_steps_it_is_given():
    from kfca_llm.valuation.adapters import value_round

    record = _federation()
    names = [f"c{i}" for i in range(HONEST + 1)]
    updates = {c: {"w": u} for c, u in zip(names, record.updates[3])}
    steps = [{"w": s} for s in record.public_steps(3, 16)]
    loss = lambda state: float(state["w"].pow(2).mean())  # noqa: E731
    valued = value_round({"w": record.globals[3]}, updates, dict.fromkeys(names, 1), loss, seed=5, public=steps)
    expected = score_updates(updates, seed=5, public=steps).rewards
    assert valued.values["kfca_qp"] == [expected[c] for c in names]
    assert abs(valued.values["kfca_qp"][RIDER]) < 0.02 < score_updates(updates, seed=5).rewards[names[RIDER]]
