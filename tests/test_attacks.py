import pytest
import torch

from kfca_llm import attack_registry
from kfca_llm.attacks import (PAPER_ATTACKS, register_attack, resolve_attack, resolve_attacks,
                              valid_specs)
from kfca_llm.errors import InputError

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def _update(seed: int, device="cpu", dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return {
        "a.lora_A.weight": (torch.randn(8, 16, generator=g) * 0.3).to(device=device, dtype=dtype),
        "a.lora_B.weight": (torch.randn(16, 8, generator=g) * 2.0).to(device=device, dtype=dtype),
    }


def _gen(seed=7, device="cpu"):
    return torch.Generator(device=device).manual_seed(seed)


def _history(n, device="cpu"):
    return [_update(100 + r, device) for r in range(n)]


def _same(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("spec", PAPER_ATTACKS)
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_attacks_keep_shape_dtype_device_and_do_not_mutate(spec, device, dtype):
    honest = _update(1, device, dtype)
    copy = {k: v.clone() for k, v in honest.items()}
    hist = [{k: v.to(dtype) for k, v in h.items()} for h in _history(3, device)]
    out = resolve_attack(spec)(honest, hist, _gen(device=device))
    assert _same(honest, copy)
    assert out.keys() == honest.keys()
    for k, v in out.items():
        assert v.shape == honest[k].shape and v.dtype == dtype and v.device == honest[k].device
        assert v.data_ptr() != honest[k].data_ptr()


def test_honest_flip_zero():
    honest, hist = _update(1), _history(2)
    assert _same(resolve_attack("honest")(honest, hist, _gen()), honest)
    assert _same(resolve_attack("flip")(honest, hist, _gen()), {k: -v for k, v in honest.items()})
    assert all(torch.count_nonzero(v) == 0 for v in resolve_attack("zero")(honest, hist, _gen()).values())


def test_flip_after_is_honest_for_its_first_k_updates_then_flipped():
    honest, hist = _update(1), _history(3)
    attack = resolve_attack("flip-after:2")
    assert _same(attack(honest, hist[:0], _gen()), honest) and _same(attack(honest, hist[:1], _gen()), honest)
    for before in (2, 3):
        assert _same(attack(honest, hist[:before], _gen()), {k: -v for k, v in honest.items()})
    with pytest.raises(InputError, match="must be >= 1"):
        resolve_attack("flip-after:0")


def test_on_off_flips_every_other_update_from_its_second():
    honest, hist = _update(1), _history(4)
    attack = resolve_attack("on-off")
    for before in range(5):
        expected = {k: -v for k, v in honest.items()} if before % 2 else honest
        assert _same(attack(honest, hist[:before], _gen()), expected)


def test_stale_and_lagged_pick_the_right_round():
    # history[r] is the honest update of round r+1; the current round is len(history)+1.
    hist = _history(6)
    now = _update(1)
    assert _same(resolve_attack("stale")(now, hist, _gen()), hist[0])
    assert _same(resolve_attack("stale")(now, [], _gen()), now)  # round 1: the round-1 update is now
    for k in (1, 2, 5, 6):  # round 7: lag k submits round 7-k = history[6-k]
        assert _same(resolve_attack(f"lagged:{k}")(now, hist, _gen()), hist[6 - k])
    # Before round K+1 the oldest available update (round 1) is used; in round 1 that is the current one.
    assert _same(resolve_attack("lagged:4")(now, hist[:2], _gen()), hist[0])
    assert _same(resolve_attack("lagged:3")(now, [], _gen()), now)


def test_random_matches_variance_per_tensor_and_is_seeded():
    honest = {"small": torch.randn(200, 300, generator=_gen(1)) * 0.01,
              "large": torch.randn(200, 300, generator=_gen(2)) * 5.0}
    out = resolve_attack("random")(honest, [], _gen(3))
    for k in honest:
        ratio = float(out[k].std() / honest[k].std())
        assert 0.97 < ratio < 1.03, (k, ratio)
        assert abs(float(out[k].mean())) < 0.02 * float(honest[k].std())
        # Independent of the honest values: the correlation is near zero.
        corr = torch.corrcoef(torch.stack([out[k].flatten(), honest[k].flatten()]))[0, 1]
        assert abs(float(corr)) < 0.02
    again = resolve_attack("random")(honest, [], _gen(3))
    other = resolve_attack("random")(honest, [], _gen(4))
    assert _same(out, again)
    assert not torch.equal(out["small"], other["small"])


@pytest.mark.parametrize("keep", [0.25, 0.5, 0.75])
def test_sparse_keeps_fraction_and_replaces_the_rest(keep):
    honest = {"w": torch.randn(400, 500, generator=_gen(11)) * 0.2}
    out = resolve_attack(f"sparse:{keep}")(honest, [], _gen(12))["w"]
    same = out == honest["w"]
    assert abs(float(same.float().mean()) - keep) < 0.01
    replaced = out[~same]
    assert abs(float(replaced.std() / honest["w"].std()) - 1.0) < 0.03
    # Replaced signs agree with the honest ones only by chance.
    agree = (torch.sign(replaced) == torch.sign(honest["w"][~same])).float().mean()
    assert abs(float(agree) - 0.5) < 0.01


def test_bf16_noise_uses_float32_std():
    honest = {"w": (torch.randn(64, 64, generator=_gen(5)) * 1e-3).to(torch.bfloat16)}
    out = resolve_attack("random")(honest, [], _gen(6))["w"]
    assert 0.9 < float(out.float().std() / honest["w"].float().std()) < 1.1


@pytest.mark.parametrize("bad", ["lagged:0", "lagged:-1", "lagged:x", "lagged", "lagged:", "sparse:1.5",
                                 "sparse:0", "sparse:1", "sparse", "flip:1", "honest:x", "nope", "nope:1",
                                 ""])
def test_bad_specs_raise_listing_valid_specs(bad):
    with pytest.raises(InputError) as info:
        resolve_attack(bad)
    message = str(info.value)
    assert "valid specs" in message and "lagged:K" in message and "sparse:P" in message


def test_duplicate_specs_raise():
    with pytest.raises(InputError, match="twice"):
        resolve_attacks(["flip", "flip"])


def test_register_user_attack_with_parameter(monkeypatch):
    # A private copy of the registry, so the user attack does not leak into other tests.
    monkeypatch.setattr(attack_registry, "_REGISTRY", dict(attack_registry._REGISTRY))

    @register_attack("scaled", parse=float, usage="scaled:S (any float)")
    def scaled(honest, history, generator, s):
        return {k: v * s for k, v in honest.items()}

    honest = _update(3)
    out = resolve_attack("scaled:-2")(honest, [], _gen())
    assert _same(out, {k: v * -2.0 for k, v in honest.items()})
    assert "scaled:S (any float)" in valid_specs()
    with pytest.raises(InputError, match="scaled:S"):
        resolve_attack("scaled:abc")
    with pytest.raises(InputError, match="needs a parameter"):
        resolve_attack("scaled")


def test_register_rejects_bad_names():
    with pytest.raises(InputError):
        register_attack("a:b")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device to mix generator devices")
def test_cpu_generator_drives_cuda_tensors_deterministically():
    honest = _update(1, "cuda")
    a = resolve_attack("random")(honest, [], _gen(9))
    b = resolve_attack("random")(honest, [], _gen(9))
    assert _same(a, b) and all(v.is_cuda for v in a.values())


@pytest.mark.parametrize("spec", ["random", "sparse:0.5"])
def test_noise_does_not_depend_on_key_order(spec):
    honest = _update(2)
    reordered = dict(reversed(list(honest.items())))
    a = resolve_attack(spec)(honest, [], _gen(4))
    b = resolve_attack(spec)(reordered, [], _gen(4))
    assert list(b) == list(reordered)
    assert all(torch.equal(a[k], b[k]) for k in honest)


# --- attacks that see the round -------------------------------------------------------------------

def _context(client="a", others=("b", "c", "d"), seed=7, round_seed=11):
    from kfca_llm.attacks import AttackContext

    updates = {c: _update(i) for i, c in enumerate((client, *others))}
    return AttackContext(client=client, round=3, honest=updates[client], history=_history(2), generator=_gen(seed),
                         others={c: updates[c] for c in others}, round_seed=round_seed)


def test_copy_without_noise_submits_one_other_clients_update_chosen_by_the_seed():
    picked = set()
    for seed in range(12):
        context = _context(seed=seed)
        out = resolve_attack("copy:0").submit(context)
        source = [c for c, u in context.others.items() if _same(out, u)]
        assert len(source) == 1
        picked.add(source[0])
    assert picked == {"b", "c", "d"}  # the generator, not a fixed rule, picks the copied client


def test_copy_noise_is_scaled_by_the_copied_tensors_std():
    context = _context(others=("b",))
    out = resolve_attack("copy:0.5").submit(context)
    for name, t in context.others["b"].items():
        ratio = float((out[name] - t).std() / t.std())
        assert 0.35 < ratio < 0.65, (name, ratio)
    assert _same(out, resolve_attack("copy:0.5").submit(_context(others=("b",))))  # seeded
    with pytest.raises(InputError, match="another client"):
        resolve_attack("copy:0").submit(_context(others=()))
    with pytest.raises(InputError, match="copy:-1"):
        resolve_attack("copy:-1")


def test_colluders_of_a_group_submit_one_shared_update():
    a = _context(client="a", others=("b", "c"), seed=1)
    b = _context(client="b", others=("a", "c"), seed=2)  # another member: its own generator, same round
    b = type(b)(**{**b.__dict__, "honest": a.others["b"], "others": {"a": a.honest, "c": a.others["c"]}})
    shared = resolve_attack("collude:g1").submit(a)
    assert _same(shared, resolve_attack("collude:g1").submit(b))
    assert not _same(shared, resolve_attack("collude:g2").submit(a))
    assert not _same(shared, resolve_attack("collude:g1").submit(_context(round_seed=12)))
    pooled = torch.stack([u["a.lora_B.weight"] for u in (a.honest, *a.others.values())]).std(correction=0)
    assert 0.8 < float(shared["a.lora_B.weight"].std() / pooled) < 1.2
    assert not any(_same(shared, u) for u in (a.honest, *a.others.values()))


def test_old_style_user_attacks_and_context_attacks_share_the_registry(monkeypatch):
    monkeypatch.setattr(attack_registry, "_REGISTRY", dict(attack_registry._REGISTRY))

    @register_attack("halve_for_context_test")
    def halve(honest, history, generator):
        return {k: v / 2 for k, v in honest.items()}

    @register_attack("first_other_for_test", context=True)
    def first_other(context):
        return dict(context.others[min(context.others)])

    context = _context()
    assert _same(resolve_attack("halve_for_context_test").submit(context),
                 {k: v / 2 for k, v in context.honest.items()})
    assert _same(resolve_attack("halve_for_context_test")(context.honest, [], _gen()),
                 {k: v / 2 for k, v in context.honest.items()})
    assert _same(resolve_attack("first_other_for_test").submit(context), context.others["b"])
