"""Free riders (kfca_llm/attacks_public.py): what they submit from a hand-built trajectory of globals."""

import pytest
import torch

from kfca_llm.attacks import AttackContext, resolve_attack, resolve_attacks
from kfca_llm.attacks_public import public_window, public_windows
from kfca_llm.errors import InputError

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
FREE_RIDERS = ["free-ride:1", "free-ride:3", "free-ride-flip:2", "free-ride-noise:0.05", "free-ride-signs:1"]


def _state(seed: int, scale: float = 1.0, device="cpu", dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return {"b.lora_B.weight": (torch.randn(16, 8, generator=g) * 2.0 * scale).to(device=device, dtype=dtype),
            "a.lora_A.weight": (torch.randn(8, 16, generator=g) * 0.3 * scale).to(device=device, dtype=dtype)}


def _trajectory(n: int):
    """n globals a client received, oldest first (float32 on the CPU, as the round loop keeps them)."""
    return [_state(50 + r) for r in range(n)]


def _context(public, device="cpu", dtype=torch.float32, seed=7):
    return AttackContext(client="client-000", round=len(public), honest=_state(1, 0.01, device, dtype), history=[],
                         generator=torch.Generator().manual_seed(seed), public=public)


def _at_honest_norm(step, honest):
    return {k: step[k] * (honest[k].norm() / step[k].norm()) for k in step}


def _close(a, b):
    return a.keys() == b.keys() and all(torch.allclose(a[k], b[k], rtol=1e-5, atol=1e-7) for k in a)


@pytest.mark.parametrize("spec", FREE_RIDERS)
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_free_riders_keep_shape_dtype_device_and_are_seeded(spec, device, dtype):
    public = _trajectory(4)
    kept = [{k: v.clone() for k, v in g.items()} for g in public]
    context = _context(public, device, dtype)
    out = resolve_attack(spec).submit(context)
    assert all(torch.equal(public[r][k], kept[r][k]) for r in range(4) for k in kept[r])  # inputs untouched
    assert list(out) == list(context.honest)
    for k, v in out.items():
        assert v.shape == context.honest[k].shape and v.dtype == dtype and v.device == context.honest[k].device
    again = resolve_attack(spec).submit(_context(public, device, dtype))
    assert all(torch.equal(out[k], again[k]) for k in out)


def test_free_ride_is_the_newest_global_step_over_k_rounds_at_the_honest_norm_per_tensor():
    public = _trajectory(5)
    context = _context(public)
    for k in (1, 2, 4):
        step = {n: public[-1][n] - public[-1 - k][n] for n in public[0]}
        out = resolve_attack(f"free-ride:{k}").submit(context)
        assert _close(out, _at_honest_norm(step, context.honest)), k
        assert all(torch.isclose(out[n].norm(), context.honest[n].norm()) for n in out)
        flipped = resolve_attack(f"free-ride-flip:{k}").submit(context)
        assert all(torch.equal(flipped[n], -out[n]) for n in out)


def test_a_client_that_received_fewer_globals_steps_from_the_oldest():
    public = _trajectory(3)
    out = resolve_attack("free-ride:5").submit(_context(public))
    step = {n: public[2][n] - public[0][n] for n in public[0]}
    assert _close(out, _at_honest_norm(step, _context(public).honest))


@pytest.mark.parametrize("spec", FREE_RIDERS)
def test_every_free_rider_submits_zeros_in_its_first_round(spec):
    out = resolve_attack(spec).submit(_context(_trajectory(1)))
    assert all(torch.count_nonzero(v) == 0 for v in out.values())


def test_the_disguised_free_rider_adds_noise_of_sigma_times_the_step():
    public = _trajectory(3)
    context = _context(public)
    plain = resolve_attack("free-ride:1").submit(context)
    noisy = resolve_attack("free-ride-noise:0.2").submit(context)
    for n in plain:
        ratio = float((noisy[n] - plain[n]).norm() / plain[n].norm())
        assert 0.15 < ratio < 0.25, (n, ratio)
    assert _close(resolve_attack("free-ride-noise:0").submit(context), plain)
    other = resolve_attack("free-ride-noise:0.2").submit(_context(public, seed=8))
    assert not torch.equal(other["a.lora_A.weight"], noisy["a.lora_A.weight"])


def test_the_signs_free_rider_keeps_the_steps_signs_with_magnitudes_of_its_own():
    public = _trajectory(4)
    public[-1]["a.lora_A.weight"][0, :4] = public[-3]["a.lora_A.weight"][0, :4]  # no change there
    context = _context(public)
    out = resolve_attack("free-ride-signs:2").submit(context)
    for n in out:
        step = public[-1][n] - public[-3][n]
        assert torch.equal(out[n].sign(), step.sign())
        std = float(context.honest[n].std(correction=0))
        assert 0.6 < float(out[n].abs().mean()) / (std * (2 / torch.pi) ** 0.5) < 1.4  # |N(0, std)|
    assert torch.count_nonzero(out["a.lora_A.weight"][0, :4]) == 0
    step1 = {n: public[-1][n] - public[-2][n] for n in public[0]}
    assert all(torch.equal(resolve_attack("free-ride-signs:1").submit(context)[n].sign(), step1[n].sign())
               for n in step1)


def test_a_free_rider_without_a_trajectory_is_a_clean_error():
    with pytest.raises(InputError, match="AttackContext.public"):
        resolve_attack("free-ride:1").submit(_context([]))


def test_the_window_is_what_each_spec_reads():
    assert public_window("free-ride:3") == 4 and public_window("free-ride-signs:1") == 2
    assert public_window("free-ride-noise:0.05") == 2 and public_window("lagged:3") == 0
    assert public_windows(["honest", "free-ride-flip:2", "free-ride:1"]) == 3 and public_windows(["flip"]) == 0


def test_a_registered_public_attack_declares_its_window(monkeypatch):
    from kfca_llm import attack_registry, attacks, attacks_public

    monkeypatch.setattr(attack_registry, "_REGISTRY", dict(attack_registry._REGISTRY))  # the user attack stays in this test
    monkeypatch.setattr(attacks_public, "_WINDOWS", dict(attacks_public._WINDOWS))

    @attacks_public.register_public_attack("replay-global", "replay-global:K", window=lambda k: k, parse=int)
    def replay_global(context, k):
        return {name: context.public[-k][name].clone() for name in context.honest}

    assert public_window("replay-global:3") == 3 and "replay-global:K" in attacks.valid_specs()
    public = _trajectory(4)
    out = resolve_attack("replay-global:2").submit(_context(public))
    assert all(torch.equal(out[n], public[-2][n]) for n in out)


@pytest.mark.parametrize("bad", ["free-ride", "free-ride:0", "free-ride:x", "free-ride-flip:-1",
                                 "free-ride-noise:-0.1", "free-ride-noise:inf", "free-ride-signs:1.5"])
def test_bad_free_rider_specs_raise_listing_them(bad):
    with pytest.raises(InputError) as info:
        resolve_attack(bad)
    assert "free-ride:K" in str(info.value) and "free-ride-noise:SIGMA" in str(info.value)


def test_free_riders_are_valid_in_a_recipe():
    from helpers import short_recipe

    from kfca_llm.recipe import fixed_attackers

    recipe = short_recipe(f"kfca.attacks={['honest', *FREE_RIDERS]!r}".replace("'", '"'),
                          'kfca.attackers=["3=free-ride:1"]')
    assert list(recipe.kfca.attacks) == ["honest", *FREE_RIDERS]
    assert fixed_attackers(recipe) == {3: "free-ride:1"}
    assert [a.spec for a in resolve_attacks(FREE_RIDERS)] == FREE_RIDERS


# --- in simulate's round loop ----------------------------------------------------------------------

# Seed 0 samples client 4 in rounds 2-4 (its first global is not the initial one) and client 5 in rounds 1 and 5
# (its step spans the four rounds it missed).
FEDERATION = ['kfca.attacks=["honest", "free-ride:1", "free-ride:2"]',
              'kfca.attackers=["4=free-ride:1", "5=free-ride:1"]', "num-server-rounds=5"]
FIXED_ROUNDS = {"client-004": [2, 3, 4], "client-005": [1, 5]}


@pytest.fixture(scope="module")
def free_rider_run(tmp_path_factory):
    """5 short rounds with free riders analysed and one fixed: (recipe, out, result, per round: its starting global
    and its submissions by (client, strategy))."""
    from helpers import short_recipe

    from kfca_llm.fl.rounds import FederationOptions, run_federation

    recipe, out, rounds = short_recipe(*FEDERATION), tmp_path_factory.mktemp("free-riders"), []
    observe = lambda ctx: rounds.append((ctx.global_state, {(s.client, s.strategy): s.update for s in ctx.submissions}))
    result = run_federation(recipe, FederationOptions(out_dir=out, progress=False, on_round=observe, evaluate=False))
    return recipe, out, result, rounds


def _direction(update):
    return {n: v / v.norm() for n, v in update.items()}


def test_simulate_gives_free_riders_the_globals_their_client_received_newest_last(free_rider_run):
    _, _, result, rounds = free_rider_run
    globals_ = [g for g, _ in rounds]  # globals_[t - 1]: the global round t started from
    for t, (_, submitted) in enumerate(rounds, start=1):
        honest = submitted[("client-000", "honest")]
        for k in (1, 2):
            out = submitted[("client-000", f"free-ride:{k}")]
            if t == 1:
                assert all(torch.count_nonzero(v) == 0 for v in out.values())
                continue
            step = {n: globals_[t - 1][n] - globals_[max(t - 1 - k, 0)][n] for n in honest}
            assert _close(out, _at_honest_norm(step, honest)), (t, k)
    # A fixed free rider received the globals of the rounds it was sampled in: it steps between those.
    for client, sampled in FIXED_ROUNDS.items():
        assert [r.round for r in result.rounds if client in r.clients] == sampled
        first = rounds[sampled[0] - 1][1][(client, "free-ride:1")]
        assert all(torch.count_nonzero(v) == 0 for v in first.values())
        for before, t in zip(sampled, sampled[1:]):
            out = rounds[t - 1][1][(client, "free-ride:1")]
            step = {n: globals_[t - 1][n] - globals_[before - 1][n] for n in out}
            assert _close(_direction(out), _direction(step)), (client, before, t)


def test_a_resumed_run_gives_free_riders_the_globals_received_before_the_interruption(free_rider_run, tmp_path):
    import shutil
    from dataclasses import asdict

    from kfca_llm.fl.rounds import FederationOptions, run_federation
    from kfca_llm.fl.state import last_complete_round, round_dir

    recipe, out, result, _ = free_rider_run
    resumed_dir = tmp_path / "resumed"
    shutil.copytree(out, resumed_dir)
    for t in (4, 5):  # stopped after round 3: client 5's next step reaches back to round 1
        shutil.rmtree(round_dir(resumed_dir, t))
        shutil.rmtree(resumed_dir / "state" / f"round-{t:03d}")
    assert last_complete_round(resumed_dir) == 3
    resumed = run_federation(recipe, FederationOptions(out_dir=resumed_dir, resume=True, progress=False,
                                                       evaluate=False))
    assert [asdict(r) for r in resumed.rounds] == [asdict(r) for r in result.rounds]
    (resumed_dir / "state" / "round-005" / "public.safetensors").unlink()
    with pytest.raises(InputError, match="public.safetensors is missing"):
        run_federation(recipe, FederationOptions(out_dir=resumed_dir, resume=True, progress=False, evaluate=False))


def test_simulate_accepts_free_riders_as_strategies_and_as_fixed_attackers(tmp_path, capsys):
    from kfca_llm.cli import main

    assert main(["simulate", "--dry-run", "--attacks", ",".join(["honest", *FREE_RIDERS]),
                 "--set", 'kfca.attackers=["3=free-ride-noise:0.05"]', "--out", str(tmp_path / "x")]) == 0
    assert "free-ride-signs:1" in capsys.readouterr().out
    assert main(["simulate", "--dry-run", "--attacks", "honest,free-ride:0", "--out", str(tmp_path / "x")]) == 2
    assert "free-ride:K" in capsys.readouterr().err


def test_check_measures_expectations_that_name_free_riders(free_rider_run, tmp_path, capsys):
    from kfca_llm.cli import main
    from kfca_llm.report import write_json

    _, _, result, _ = free_rider_run
    write_json(tmp_path / "report.json", result.to_report())
    expect = tmp_path / "free-riders.toml"
    expect.write_text('[[expect]]\nname = "a free rider earns little"\ncheck = "free-ride:1 < 0.1 x honest"\n\n'
                      '[[expect]]\nname = "a two-round free rider is measured"\ncheck = "free-ride:2 > -1 x honest"\n')
    code = main(["check", str(tmp_path / "report.json"), "--expect", str(expect)])
    table = capsys.readouterr().out
    assert code in (0, 1) and "a free rider earns little" in table and "a two-round free rider is measured" in table
