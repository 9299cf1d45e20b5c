"""Scoring conditioned on the public trajectory (``engine.public``): a report the public steps predict earns 0,
honest information is still paid, off is today's rewards bit for bit, and mis-aligned steps pay a free rider."""

import numpy as np
import pytest
import torch

from kfca_llm import score_updates
from kfca_llm.engine.public import PublicConditioning, public_planes, public_spans
from kfca_llm.engine.layout import Layout
from kfca_llm.errors import InputError
from kfca_llm.kernels.sign_pack.reference import pack_words

SHAPES = {"a.lora_A": (37, 29), "b.lora_B": (61,), "c": (5, 7, 3)}  # odd sizes: padded words, several tensors
BIG = {"a.lora_A": (211, 97), "b.lora_B": (20011,)}  # enough coordinates for tasks of both sets in most strata


def _trajectory(rng, n_steps=4):
    """Public steps, oldest first, float64 state dicts."""
    return [{k: torch.from_numpy(rng.normal(size=s)) for k, s in SHAPES.items()} for _ in range(n_steps)]


def _round(rng, steps, n_honest=4, private=1.0, noise=1.5):
    """Honest clients follow the newest step and a private direction the trajectory does not know (shared by
    every honest client: the information KFCA should pay for), each with its own noise; the free riders report
    what the trajectory says."""
    direction = {k: torch.from_numpy(rng.normal(size=s)) for k, s in SHAPES.items()}
    updates = {f"honest{i}": {k: steps[-1][k] + private * direction[k] + noise * torch.from_numpy(rng.normal(size=s))
                              for k, s in SHAPES.items()} for i in range(n_honest)}
    updates["free-ride:1"] = {k: steps[-1][k].clone() for k in SHAPES}
    updates["free-ride:2"] = {k: 3.0 * (steps[-1][k] + steps[-2][k]) for k in SHAPES}
    updates["free-ride-flip:1"] = {k: -steps[-1][k] for k in SHAPES}
    return updates


RIDERS = ("free-ride:1", "free-ride:2", "free-ride-flip:1")


def _honest_pairs(updates):
    """Every rider and honest client against every honest client (riders are nobody's peer)."""
    honest = [c for c in updates if c.startswith("honest")]
    return [(c, p) for c in updates for p in honest if c != p]


def _mean_rewards(rng, public_of, seeds=12, **kwargs):
    """Mean reward per client over rounds (a fresh trajectory and round each) and partition seeds."""
    totals = {}
    for seed in range(seeds):
        steps = _trajectory(rng)
        updates = _round(rng, steps, **kwargs)
        report = score_updates(updates, seed=seed, pairs=_honest_pairs(updates), backend="cpu",
                               duplicates="flag", public=public_of(steps))
        for c, r in report.rewards.items():
            totals[c] = totals.get(c, 0.0) + r / seeds
    return totals


def test_a_report_the_trajectory_predicts_earns_about_zero_and_honest_information_is_still_paid(rng):
    without = _mean_rewards(rng, lambda steps: None)
    with_public = _mean_rewards(np.random.default_rng(1), lambda steps: steps)
    honest = np.mean([r for c, r in with_public.items() if c.startswith("honest")])
    assert honest > 0.05
    for rider in RIDERS:
        assert abs(without[rider]) > 0.05  # today: the trajectory's signs are paid (or charged)
        assert abs(with_public[rider]) < 0.1 * honest, (rider, with_public[rider], honest)


def test_a_peer_constant_within_each_stratum_pays_a_trajectory_reporter_exactly_zero(rng):
    """Both reports are functions of the public strata: every stratum's bonus and penalty agreement are both 0 or
    both 1, so the conditioned payment is 0 whatever the partition (to float rounding: the bonus agreement is one
    division, the penalty a sum over strata); unconditioned it is far from 0."""
    steps = _trajectory(rng)
    updates = {"newest": {k: steps[-1][k].clone() for k in SHAPES},
               "two-steps": {k: steps[-1][k] + steps[-2][k] for k in SHAPES}}
    for seed in range(5):
        report = score_updates(updates, seed=seed, backend="cpu", duplicates="flag", public=steps,
                               conditioning=PublicConditioning(steps=2, magnitude_buckets=1))
        assert report.rewards == pytest.approx({"newest": 0.0, "two-steps": 0.0}, abs=1e-12)
        plain = score_updates(updates, seed=seed, backend="cpu", duplicates="flag")
        assert min(plain.rewards.values()) > 0.2


@pytest.mark.parametrize("misaligned", ["reversed", "a round late"])
def test_mis_aligned_public_steps_pay_the_free_rider(misaligned, rng):
    """The newest step must be the last: reversed, or missing the newest (a round late), the free rider that
    replays the newest step is paid again."""
    def wrong(steps):
        return steps[::-1] if misaligned == "reversed" else steps[:-1]

    right = _mean_rewards(np.random.default_rng(2), lambda steps: steps)
    bad = _mean_rewards(np.random.default_rng(2), wrong)
    honest = np.mean([r for c, r in right.items() if c.startswith("honest")])
    assert bad["free-ride:1"] > right["free-ride:1"] + 0.1 * honest


def test_off_is_todays_rewards_bit_for_bit(rng):
    steps = _trajectory(rng)
    updates = _round(rng, steps)
    plain = score_updates(updates, seed=3, backend="cpu")
    for kwargs in ({"public": []}, {"public": steps, "conditioning": PublicConditioning(steps=0, magnitude_buckets=1)},
                   {"public": None}):
        report = score_updates(updates, seed=3, backend="cpu", **kwargs)
        assert report.rewards == plain.rewards and report.pairwise == plain.pairwise and report.tasks == plain.tasks
    conditioned = score_updates(updates, seed=3, backend="cpu", public=steps)
    assert conditioned.rewards != plain.rewards and conditioned.tasks["public_strata"] == 16


def test_cpu_and_triton_backends_pay_the_same_conditioned_rewards(rng, device):
    steps = _trajectory(rng, 3)
    updates = _round(rng, steps, n_honest=3)
    cpu = score_updates(updates, seed=11, backend="cpu", public=steps)
    on_device = {c: {k: v.to(device) for k, v in u.items()} for c, u in updates.items()}
    gpu = score_updates(on_device, seed=11, backend="triton", public=[{k: v.to(device) for k, v in s.items()}
                                                                       for s in steps])
    assert gpu.rewards == cpu.rewards and gpu.pairwise == cpu.pairwise


def test_the_planes_are_the_cumulative_signs_and_magnitude_buckets_of_the_newest_steps(rng):
    layout = Layout.from_shapes(SHAPES)
    steps = _trajectory(rng, 3)
    steps[-1]["c"][0, 0, 0] = -0.0  # -0.0 is not negative, as for the reports
    planes = public_planes(layout, steps, PublicConditioning(steps=2, magnitude_buckets=4)).host_words()
    assert planes.shape == (4, layout.n_words)
    for slot in layout.slots:
        newest, older = steps[-1][slot.name].numpy().ravel(), steps[-2][slot.name].numpy().ravel()
        expected = [newest < 0, newest + older < 0]
        rank = np.argsort(np.argsort(np.abs(newest), kind="stable"), kind="stable")  # distinct values: ranks
        bucket = sum(rank >= q * newest.size // 4 for q in (1, 2, 3))  # threshold q: the (q n // 4)-th smallest
        expected += [(bucket & 1).astype(bool), (bucket >> 1 & 1).astype(bool)]
        words = slice(slot.word_offset, slot.word_offset + slot.n_words)
        for p, bits in enumerate(expected):
            np.testing.assert_array_equal(planes[p, words], pack_words(bits), err_msg=f"{slot.name} plane {p}")


def test_bad_public_steps_are_refused_naming_the_step_and_tensor(rng):
    steps = _trajectory(rng, 2)
    updates = _round(rng, _trajectory(rng, 2))
    bad_shape = [steps[0], {**steps[1], "b.lora_B": torch.zeros(60)}]
    with pytest.raises(InputError, match=r"public\[1\].*b\.lora_B.*shape"):
        score_updates(updates, public=bad_shape, backend="cpu")
    nan = [{**steps[0], "c": torch.full(SHAPES["c"], float("nan"))}]
    with pytest.raises(InputError, match=r"public\[0\].*'c'.*NaN"):
        score_updates(updates, public=nan, backend="cpu")
    missing = [{k: v for k, v in steps[0].items() if k != "c"}]
    with pytest.raises(InputError, match=r"public\[0\].*'c'.*missing"):
        score_updates(updates, public=missing, backend="cpu")
    with pytest.raises(InputError, match="list of steps"):
        score_updates(updates, public=steps[0], backend="cpu")
    with pytest.raises(InputError, match="sampled"):
        score_updates(updates, public=steps, penalty="sampled", backend="cpu")


@pytest.mark.parametrize("n_steps, spans", [(1, [1]), (3, [1, 2, 3]), (4, [1, 2, 4]), (6, [1, 2, 4]), (9, [1, 2, 4])])
def test_the_sign_planes_are_the_changes_over_doubling_spans(rng, n_steps, spans):
    """Plane k is the sign of the global's change over the last 2**k rounds (every step known, early in a run): a
    client that replays the change since it was last sampled, rounds ago, reports what some plane nearly says."""
    layout = Layout.from_shapes(SHAPES)
    steps = _trajectory(rng, n_steps)
    planes = public_planes(layout, steps, PublicConditioning(steps=3, magnitude_buckets=1))
    assert planes.steps == len(spans) and planes.host_words().shape == (len(spans), layout.n_words)
    for slot in layout.slots:
        words = slice(slot.word_offset, slot.word_offset + slot.n_words)
        for p, span in enumerate(spans):
            change = sum(step[slot.name].numpy().ravel() for step in steps[-span:])
            np.testing.assert_array_equal(planes.host_words()[p, words], pack_words(change < 0),
                                          err_msg=f"{slot.name} span {span}")


@pytest.mark.parametrize("steps, buckets", [(-1, 1), (6, 1), (1, 3), (5, 4), (True, 1), (2, 0)])
def test_conditioning_settings_are_validated(steps, buckets):
    with pytest.raises(InputError):
        PublicConditioning(steps=steps, magnitude_buckets=buckets)


def test_saved_globals_give_the_steps_score_updates_takes(rng, tmp_path, capsys):
    """``kfca-llm score ... --reference GLOBAL --public EARLIER ...`` (and ``score_checkpoints``) pay what
    ``score_updates`` pays with the differences of consecutive globals ending at the reference, oldest first."""
    import json

    from safetensors.torch import load_file, save_file

    from kfca_llm.api import score_checkpoints, update_from_reference
    from kfca_llm.cli import main

    globals_ = [{k: torch.from_numpy(rng.normal(size=s).astype(np.float32)) for k, s in SHAPES.items()}]
    for _ in range(4):
        globals_.append({k: v + torch.from_numpy(rng.normal(size=v.shape).astype(np.float32))
                         for k, v in globals_[-1].items()})
    paths = []
    for i, g in enumerate(globals_):
        paths.append(tmp_path / f"global{i}.safetensors")
        save_file(g, str(paths[-1]))
    steps = [{k: new[k] - old[k] for k in SHAPES} for old, new in zip(globals_, globals_[1:])]
    updates = _round(rng, steps)
    clients = []
    for name, update in updates.items():
        clients.append(tmp_path / f"{name.replace(':', '_')}.safetensors")
        save_file({k: (globals_[-1][k] + v.float()).contiguous() for k, v in update.items()}, str(clients[-1]))
    report = score_checkpoints(clients, reference=paths[-1], public=paths[:-1], seed=4)
    as_read = {p.stem: {k: update_from_reference(v, globals_[-1][k]) for k, v in load_file(str(p)).items()}
               for p in clients}
    expected = score_updates(as_read, seed=4, backend="cpu", public=steps)  # spans 1, 2, 4 of the 4 steps
    assert report.rewards == expected.rewards and report.tasks["public_strata"] == 16
    assert main(["score", *map(str, clients), "--reference", str(paths[-1]), "--public", *map(str, paths[:-1]),
                 "--seed", "4", "--json", str(tmp_path / "r.json")]) == 0
    assert json.loads((tmp_path / "r.json").read_text())["rewards"] == pytest.approx(report.rewards, abs=0)
    with pytest.raises(InputError, match="needs the reference"):
        score_checkpoints(clients, public=paths[:-1])


@pytest.mark.parametrize("n_steps, gaps, spans, longer", [
    (16, [], [1, 2, 4, 8, 16], ()),  # no reception known: the doubling spans
    (16, [7, 12], [1, 2, 4, 7, 12], ()),  # each gap takes the place of the doubling span nearest it
    (16, [1, 10], [1, 2, 4, 10, 16], ()),  # a gap that is a doubling span takes no plane of its own
    (16, [3, 3], [1, 2, 3, 8, 16], ()),
    (16, [25, 30], [1, 2, 4, 8, 16], ()),  # clipped to the steps kept
    (16, [25, 30, 30], [1, 2, 4, 25, 30], {25, 30}),  # longer gaps whose change is known: spans of their own
    (16, [25, 40], [1, 2, 4, 16, 40], {40}),  # only the one whose change is known; the other clipped
    (3, [5], [1, 2, 3], ()),  # early in a run: every step known
    (16, [3, 5, 6, 7, 9, 9, 11], [3, 5, 6, 7, 9], ()),  # more gaps than planes: the most frequent, ties the shorter
])
def test_the_spans_are_the_participants_reception_gaps_and_the_doubling_spans_that_fit(n_steps, gaps, spans, longer):
    assert public_spans(PublicConditioning(steps=5, magnitude_buckets=2), n_steps, gaps, longer) == spans


def test_a_gap_longer_than_the_steps_is_the_plane_of_its_change(rng):
    """``changes``: the global's change over a gap longer than the steps given (the global now less the one the
    participant received before, which the sum of the steps given cannot hold) is a sign plane of its own, exactly
    its signs (-0.0 not negative); the steps' planes and magnitude buckets are those without it."""
    layout = Layout.from_shapes(SHAPES)
    steps = _trajectory(rng, 4)
    change = {k: torch.from_numpy(rng.normal(size=s)) for k, s in SHAPES.items()}
    change["c"][0, 0, 0] = -0.0
    conditioning = PublicConditioning(steps=3, magnitude_buckets=2)
    planes = public_planes(layout, steps, conditioning, gaps=[9, 2], changes={9: change})
    assert planes.spans == (1, 2, 9) and planes.steps == 3
    alone = public_planes(layout, steps, conditioning, gaps=[2]).host_words()
    words = planes.host_words()
    assert alone.shape == words.shape and public_planes(layout, steps, conditioning, gaps=[2]).spans == (1, 2, 4)
    np.testing.assert_array_equal(words[[0, 1, 3]], alone[[0, 1, 3]])  # spans 1 and 2, the magnitude bucket
    for slot in layout.slots:
        np.testing.assert_array_equal(words[2, slot.word_offset:slot.word_offset + slot.n_words],
                                      pack_words(change[slot.name].numpy().ravel() < 0), err_msg=slot.name)
    # Five longer gaps take every sign plane: the magnitude bucket still reads the newest step.
    many = {g: {k: -v for k, v in change.items()} for g in (5, 6, 7)}
    planes = public_planes(layout, steps, conditioning, gaps=[5, 6, 7], changes=many)
    assert planes.spans == (5, 6, 7) and (planes.host_words()[3] == alone[3]).all()


def test_bad_long_changes_are_refused_naming_the_change_and_tensor(rng):
    layout = Layout.from_shapes(SHAPES)
    steps, conditioning = _trajectory(rng, 4), PublicConditioning(steps=3, magnitude_buckets=1)
    change = {k: torch.from_numpy(rng.normal(size=s)) for k, s in SHAPES.items()}
    with pytest.raises(InputError, match="above the 4 steps"):
        public_planes(layout, steps, conditioning, gaps=[4], changes={4: change})
    with pytest.raises(InputError, match=r"changes\[9\].*'c'.*NaN"):
        public_planes(layout, steps, conditioning, gaps=[9], changes={9: {**change, "c": change["c"] * np.nan}})
    with pytest.raises(InputError, match="map spans"):
        public_planes(layout, steps, conditioning, gaps=[9], changes=[change])


def test_two_free_riders_with_the_same_reception_gap_earn_zero_against_each_other():
    """Two nodes last sampled in the same round, 6 rounds ago (no doubling span), replay the same change with
    magnitudes of their own: the same signs, which the doubling spans' strata do not hold, so they agree far beyond
    them and are paid for it (about 0.2 each). With the gap's plane each report is constant within the strata and
    both earn 0 (to float rounding) whatever the partition; a gap off by one round (5 or 7) pays them again."""
    conditioning = PublicConditioning(steps=5, magnitude_buckets=2)
    layout = Layout.from_shapes(BIG)
    paid = {(6,): [], (): [], (5,): [], (7,): []}
    for seed in range(3):
        rng = np.random.default_rng(seed)
        steps = [{k: torch.from_numpy(rng.normal(size=s)) for k, s in BIG.items()} for _ in range(16)]
        change = {k: sum(step[k] for step in steps[-6:]) for k in BIG}
        updates = {"free-ride:1": change, "free-ride-signs:1": {
            k: torch.sign(c) * torch.from_numpy(np.abs(rng.normal(size=BIG[k]))) for k, c in change.items()}}
        for gaps, out in paid.items():
            planes = public_planes(layout, steps, conditioning, gaps=gaps + gaps)  # both last received 6 rounds ago
            report = score_updates(updates, seed=seed, backend="cpu", duplicates="flag", public=planes)
            out.extend(report.rewards.values())
            assert set(gaps) <= set(planes.spans) and len(planes.spans) == 5
    assert max(map(abs, paid[(6,)])) < 1e-12, paid[(6,)]
    for gaps in ((), (5,), (7,)):
        assert min(paid[gaps]) > 0.1, (gaps, paid[gaps])
