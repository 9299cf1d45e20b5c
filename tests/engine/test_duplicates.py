"""Copy detection: identical and near-identical reports, payment policies, reports, CLI."""

import json
import os

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

import kfca_llm
from kfca_llm import InputError
from kfca_llm.cli import main
from kfca_llm import SignPacker
from kfca_llm.engine import DuplicateRule, disagreement_counts, find_duplicates
from kfca_llm.engine.duplicates import _REFINE_LOADINGS
from kfca_llm.engine.stats import RoundCounts
from kfca_llm.kernels.pair_counts.reference import binary_gram
from kfca_llm.kernels.sign_pack.reference import pack_signs

COORDS = 20_000


def honest_round(n: int, seed: int, coords: int = COORDS) -> np.ndarray:
    """Shared signal plus private noise, each client with its own signal weight in [0.2, 0.95]."""
    rng = np.random.default_rng(seed)
    signal = rng.standard_normal(coords)
    weight = rng.uniform(0.2, 0.95, size=(n, 1))
    return weight * signal + np.sqrt(1 - weight ** 2) * rng.standard_normal((n, coords))


def noisy_copy(update: np.ndarray, noise: float, seed: int) -> np.ndarray:
    return update + noise * update.std() * np.random.default_rng(seed).standard_normal(update.shape)


def groups_of(updates: np.ndarray, rule: DuplicateRule = DuplicateRule()) -> list[tuple[str, ...]]:
    negative = updates < 0
    disagreements = (negative[:, None, :] != negative[None, :, :]).sum(axis=2)
    names = [f"c{i:02d}" for i in range(len(updates))]
    return [g.clients for g in find_duplicates(names, disagreements, updates.shape[1], rule)]


@pytest.mark.parametrize("n", [2, 3, 4, 6, 10])
def test_no_false_positives_on_honest_rounds(n):
    for seed in range(8):
        assert groups_of(honest_round(n, seed)) == [], seed


def test_no_false_positives_on_few_coordinates():
    """Where sampling noise is large, the standard-error margin keeps honest pairs out."""
    for coords in (300, 1000):
        for n in (4, 6, 10):
            for seed in range(20):
                assert groups_of(honest_round(n, seed, coords)) == [], (coords, n, seed)


# Disagreement counts of round 3 of an honest tiny federation (recipes/tiny.toml, 6 clients all training, 4 local
# steps, kfca.seed=0; captured from SignPacker.find_duplicates): client-002 and client-005 share data (excess
# correlation 0.60) and third parties see them somewhat like copy and source (fit 0.61 +- 0.01).
TINY_ROUND_TASKS = 32768
TINY_ROUND_DISAGREEMENTS = [[0, 5685, 6031, 6985, 6352, 8458], [5685, 0, 5514, 5078, 5863, 8417],
                            [6031, 5514, 0, 5686, 6589, 5755], [6985, 5078, 5686, 0, 7017, 6855],
                            [6352, 5863, 6589, 7017, 0, 9090], [8458, 8417, 5755, 6855, 9090, 0]]


def test_honest_pair_of_a_tiny_federation_with_a_precise_middling_copy_fit_is_not_a_copy():
    from kfca_llm.engine.duplicates import copy_fit

    clients = [f"client-{i:03d}" for i in range(6)]
    d = np.array(TINY_ROUND_DISAGREEMENTS)
    fit, stderr = copy_fit(d / TINY_ROUND_TASKS, TINY_ROUND_TASKS)
    assert 0.55 < fit[2, 5] < 0.7 and stderr[2, 5] < 0.02
    assert find_duplicates(clients, d, TINY_ROUND_TASKS) == ()
    # a lower bar, even two standard errors down, pays this honest pair 0
    lower = DuplicateRule(min_copy_fit=0.5, copy_fit_sigma=2.0)
    assert [g.clients for g in find_duplicates(clients, d, TINY_ROUND_TASKS, lower)] == [("client-002", "client-005")]


def test_honest_pair_sharing_a_second_signal_is_not_a_copy():
    """Two honest clients with similar data share more than the round's signal: the one-factor model
    reads that as a large excess correlation (the tiny federation showed such pairs at 82-90.5% agreement),
    but the round's other clients see them as equals, not as a copy and its source."""
    rng = np.random.default_rng(0)
    signal, cluster = rng.standard_normal(COORDS), rng.standard_normal(COORDS)
    updates = 0.5 * signal + np.sqrt(0.75) * rng.standard_normal((6, COORDS))
    updates[:2] = 0.5 * signal + 0.8 * cluster + 0.19 * rng.standard_normal((2, COORDS))
    negative = updates[:2] < 0
    assert 0.89 < (negative[0] == negative[1]).mean() < 0.93  # as close as the honest pairs seen
    assert groups_of(updates) == []
    # the third-party test, not the excess-correlation fit, is what keeps this pair out
    assert groups_of(updates, DuplicateRule(min_copy_fit=0.0, copy_fit_sigma=0.0)) == [("c00", "c01")]


@pytest.mark.parametrize("n", [6, 10])
@pytest.mark.parametrize("noise", [0.01, 0.05, 0.1])
def test_noisy_copy_is_caught(noise, n):
    for seed in range(6):
        updates = honest_round(n, seed)
        copied = np.vstack([updates, noisy_copy(updates[seed % n], noise, seed)])
        assert groups_of(copied) == [(f"c{seed % n:02d}", f"c{n:02d}")], seed


def flipped_copy(update: np.ndarray, fraction: float, seed: int) -> np.ndarray:
    """The update with the signs of a random ``fraction`` of its coordinates flipped."""
    flips = np.random.default_rng(seed).random(update.shape) < fraction
    return np.where(flips, -update, update)


@pytest.mark.parametrize("n", [4, 5, 10])
@pytest.mark.parametrize("fraction", [0.01, 0.05, 0.1, 0.2])
def test_copies_with_up_to_20_percent_of_signs_flipped_are_caught(fraction, n):
    """Past the fixed 5% agreement floor the detector used to have: 10% and 20% flipped passed it.

    A copy is missed only where the third-party fit is too uncertain to tell it from clients sharing data (its
    fit one standard error down below 0.75): a copy of a weak client, with few witnesses or many flips."""
    from kfca_llm.engine.duplicates import copy_fit

    rule = DuplicateRule()
    missed = 0
    for seed in range(6):
        updates = honest_round(n, seed)
        victim = seed % n
        copied = np.vstack([updates, flipped_copy(updates[victim], fraction, seed)])
        found = groups_of(copied)
        if found != [(f"c{victim:02d}", f"c{n:02d}")]:
            negative = copied < 0
            fit, stderr = copy_fit((negative[:, None, :] != negative[None, :, :]).mean(axis=2), COORDS)
            assert found == [] and fit[victim, n] - rule.copy_fit_sigma * stderr[victim, n] < rule.min_copy_fit, seed
            missed += 1
    assert missed <= (2 if fraction >= 0.1 else 0)


def test_with_two_witnesses_only_close_copies_are_caught():
    """Three honest clients and a copy: the pair has two third parties, too few to tell a copy from an honest pair
    that shares data (an honest pair of a tiny federation fitted the copy model on two), so only the absolute
    rule applies."""
    updates = honest_round(3, 0)
    assert groups_of(np.vstack([updates, flipped_copy(updates[1], 0.01, 0)])) == [("c01", "c03")]
    assert groups_of(np.vstack([updates, flipped_copy(updates[1], 0.1, 0)])) == []
    assert groups_of(np.vstack([updates, flipped_copy(updates[1], 0.1, 0)]), DuplicateRule(min_witnesses=2)) == [
        ("c01", "c03")]


def test_copy_fit_is_one_for_a_flipped_copy_and_near_zero_for_clients_sharing_data():
    from kfca_llm.engine.duplicates import copy_fit

    rng = np.random.default_rng(0)
    signal, cluster = rng.standard_normal(COORDS), rng.standard_normal(COORDS)
    updates = 0.5 * signal + np.sqrt(0.75) * rng.standard_normal((6, COORDS))
    updates[:2] = 0.5 * signal + 0.8 * cluster + 0.19 * rng.standard_normal((2, COORDS))  # a data cluster
    rounds = np.vstack([updates, flipped_copy(updates[3], 0.2, 1)])
    negative = rounds < 0
    rate = (negative[:, None, :] != negative[None, :, :]).mean(axis=2)
    fit, stderr = copy_fit(rate, COORDS)
    assert fit[3, 6] == pytest.approx(1.0, abs=4 * stderr[3, 6]) and stderr[3, 6] < 0.1
    assert abs(fit[0, 1]) < 0.2 and abs(fit[1, 0]) < 0.2  # others see the two cluster members alike
    # by hand for one ordered pair: sum over third clients k of (d_ck - d_sk) / (d_sc sum_k (1 - 2 d_sk))
    ks = [k for k in range(7) if k not in (3, 6)]
    by_hand = sum(rate[6, k] - rate[3, k] for k in ks) / (rate[3, 6] * sum(1 - 2 * rate[3, k] for k in ks))
    assert fit[3, 6] == pytest.approx(by_hand, rel=1e-12)


def test_copy_of_the_strongest_client_is_caught():
    """The hardest copy: its victim agrees most with everyone, so the pair looks like two strong clients."""
    for n in (6, 10):
        for seed in range(30):
            updates = honest_round(n, seed)
            strongest = int(np.argmax(np.abs(updates @ updates.sum(axis=0))))
            copied = np.vstack([updates, noisy_copy(updates[strongest], 0.1, seed)])
            assert groups_of(copied) == [(f"c{strongest:02d}", f"c{n:02d}")], (n, seed)


@pytest.mark.parametrize("noise", [0.01, 0.05])
def test_small_rounds_catch_close_copies_by_the_absolute_rule(noise):
    updates = honest_round(2, 0)
    copied = np.vstack([updates, noisy_copy(updates[1], noise, 1)])
    assert groups_of(copied) == [("c01", "c02")]


def test_colluding_pair_with_one_shared_random_update_is_caught():
    for seed in range(4):
        updates = honest_round(5, seed)
        shared = np.random.default_rng(100 + seed).standard_normal(COORDS)
        assert groups_of(np.vstack([updates, shared, shared])) == [("c05", "c06")]
        # each colluder adds its own 5% noise (3% of the signs differ): no other client agrees with them beyond
        # chance, so no third party can be asked; their private parts alone make them one group
        noisy = shared + 0.05 * np.random.default_rng(200 + seed).standard_normal((2, COORDS))
        assert groups_of(np.vstack([updates, noisy])) == [("c05", "c06")]
        pair = np.vstack([noisy_copy(shared, 0.05, 1), noisy_copy(shared, 0.05, 2)])
        assert groups_of(np.vstack([updates, pair])) == [("c05", "c06")]


def test_disagreements_come_from_the_gram_counts():
    updates = honest_round(4, 3, coords=999)
    signs, tasks = zip(*(pack_signs(u) for u in updates))
    counts = RoundCounts(*binary_gram(np.stack(signs), np.bitwise_or.reduce(np.stack(tasks)), seed=5, bonus_fraction=0.3))
    negative = updates < 0
    expected = (negative[:, None, :] != negative[None, :, :]).sum(axis=2)
    np.testing.assert_array_equal(disagreement_counts(counts), expected)


@pytest.fixture(scope="module")
def clones():
    honest = honest_round(4, 11)
    updates = {f"h{i}": torch.from_numpy(u.astype(np.float32)) for i, u in enumerate(honest)}
    updates |= {"copy1": updates["h0"].clone(), "copy2": updates["h0"].clone()}
    return updates


def test_identical_updates_form_one_group_under_every_policy(clones):
    reports = {policy: kfca_llm.score_updates(clones, duplicates=policy) for policy in ("flag", "split", "zero")}
    flag = reports["flag"]
    assert [g.clients for g in flag.duplicates] == [("copy1", "copy2", "h0")]
    assert {p.reason for p in flag.duplicates[0].pairs} == {"identical"}
    assert flag.rewards == flag.unadjusted_rewards
    group = ("copy1", "copy2", "h0")
    share = np.mean([flag.rewards[c] for c in group]) / 3
    for c in group:
        assert reports["split"].rewards[c] == pytest.approx(share)
        assert reports["zero"].rewards[c] == 0.0
    for c in ("h1", "h2", "h3"):
        assert reports["split"].rewards[c] == reports["zero"].rewards[c] == flag.rewards[c]
    assert flag.rewards["copy1"] > flag.rewards["h1"]  # why detection is needed: copies are paid most


def test_policies_never_raise_a_negative_reward(clones):
    flipped = dict(clones)
    flipped["copy1"] = -clones["h1"]
    flipped["copy2"] = -clones["h1"]
    flag = kfca_llm.score_updates(flipped, duplicates="flag")
    assert ("copy1", "copy2") in [g.clients for g in flag.duplicates]
    for policy in ("split", "zero"):
        report = kfca_llm.score_updates(flipped, duplicates=policy)
        for c in ("copy1", "copy2"):
            assert flag.rewards[c] < 0
            assert report.rewards[c] == flag.rewards[c]


def test_duplicates_in_table_and_json(clones):
    report = kfca_llm.score_updates(clones, duplicates="split")
    table = report.table()
    assert "copies #1 (each group paid as one client): copy1, copy2, h0" in table
    assert "copy1 ~ copy2: identical, agreement 1.0000" in table
    payload = json.loads(json.dumps(report.to_dict()))
    assert payload["duplicate_policy"] == "split"
    assert payload["duplicates"][0]["clients"] == ["copy1", "copy2", "h0"]
    assert payload["duplicates"][0]["pairs"][0]["reason"] == "identical"


def test_copies_are_paid_nothing_by_default_and_the_unadjusted_rewards_are_kept(clones):
    flag = kfca_llm.score_updates(clones, duplicates="flag")
    packer = SignPacker({"update": (COORDS,)}, list(clones))
    for client, update in clones.items():
        packer.add(client, "update", update)
    for report in (kfca_llm.score_updates(clones), packer.score()):
        assert report.duplicate_policy == "zero"
        assert all(report.rewards[c] == 0.0 for c in ("copy1", "copy2", "h0"))
        assert report.unadjusted_rewards == flag.rewards and flag.rewards["h0"] > 0
        assert all(report.rewards[c] == flag.rewards[c] > 0 for c in ("h1", "h2", "h3"))
    assert "unadjusted rewards: copy1 " in report.table()


def test_copy_candidates_restrict_detection_to_those_clients(clones):
    flag = kfca_llm.score_updates(clones, duplicates="flag")
    report = kfca_llm.score_updates(clones, copy_candidates=["h0", "h1", "h2", "h3", "copy1"])
    assert [g.clients for g in report.duplicates] == [("copy1", "h0")]
    assert report.rewards["copy1"] == report.rewards["h0"] == 0.0
    assert report.rewards["copy2"] == flag.rewards["copy2"] > 0  # not a candidate: never grouped, paid as is
    assert kfca_llm.score_updates(clones, copy_candidates=["h0", "h1", "h2"]).duplicates == ()
    with pytest.raises(InputError, match="unknown client in copy_candidates"):
        kfca_llm.score_updates(clones, copy_candidates=["h0", "nobody"])
    with pytest.raises(InputError, match="copy_candidates must be a list"):
        kfca_llm.score_updates(clones, copy_candidates="h0")


def test_packer_find_duplicates_matches_score(clones):
    packer = SignPacker({"update": (COORDS,)}, list(clones))
    for client, update in clones.items():
        packer.add(client, "update", update)
    assert packer.find_duplicates() == packer.score(seed=3, peers=2).duplicates


def test_bad_policy_and_rule_are_input_errors(clones):
    with pytest.raises(InputError, match="duplicates must be one of"):
        kfca_llm.score_updates(clones, duplicates="ban")
    with pytest.raises(InputError, match="max_disagreement"):
        DuplicateRule(max_disagreement=1.5)


def test_labels_duplicates():
    rng = np.random.default_rng(0)
    truth = rng.integers(0, 4, 500)
    labels = {c: np.where(rng.random(500) < 0.7, truth, rng.integers(0, 4, 500)) for c in "abc"}
    labels["d"] = labels["a"].copy()
    report = kfca_llm.score_labels(labels, num_labels=4)
    assert [g.clients for g in report.duplicates] == [("a", "d")]
    assert report.rewards["a"] == report.rewards["d"] == 0.0
    assert report.rewards["b"] > 0


def _write(path, tensors):
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path))
    return path


def test_symlink_to_another_clients_file_is_an_identical_copy(tmp_path, capsys):
    honest = honest_round(3, 4, coords=4096)
    paths = [_write(tmp_path / f"c{i}.safetensors", {"w": torch.from_numpy(u.astype(np.float32))})
             for i, u in enumerate(honest)]
    os.symlink(paths[0], tmp_path / "thief.safetensors")
    report = kfca_llm.score_checkpoints(paths + [tmp_path / "thief.safetensors"])
    assert [g.clients for g in report.duplicates] == [("c0", "thief")]
    assert report.rewards["thief"] == report.rewards["c0"] == 0.0 < report.unadjusted_rewards["thief"]
    out = tmp_path / "r.json"
    assert main(["score", *map(str, paths), str(tmp_path / "thief.safetensors"), "--json", str(out)]) == 0
    payload = json.loads(out.read_text())
    assert payload["rewards"]["thief"] == payload["rewards"]["c0"] == 0.0
    assert payload["unadjusted_rewards"]["thief"] > 0 and payload["duplicate_policy"] == "zero"
    assert "copies #1 (groups paid nothing): c0, thief" in capsys.readouterr().out


def test_reference_difference_in_the_wider_dtype(tmp_path):
    """1 + 1e-12 in float64 minus a float64 (or float32) 1 is positive, not 0 as in float32."""
    n = 64
    up = torch.ones(n, dtype=torch.float64) + 1e-12 * torch.from_numpy(honest_round(3, 0, coords=n)[0])
    paths = [_write(tmp_path / f"c{i}.safetensors", {"w": up if i else -up + 2}) for i in range(3)]
    for ref_dtype in (torch.float64, torch.float32):
        ref = _write(tmp_path / "ref.safetensors", {"w": torch.ones(n, dtype=ref_dtype)})
        report = kfca_llm.score_checkpoints(paths, reference=ref, seed=1)
        direct = kfca_llm.score_updates({f"c{i}": (-up + 2 if i == 0 else up) - 1 for i in range(3)}, seed=1)
        assert report.rewards == direct.rewards
        assert report.tasks["tasks"] == n


def test_a_gaussian_noise_copy_of_a_strong_client_is_caught_by_its_closeness():
    """Noise changes the signs where the source is small, where it agrees with others least: third parties see
    the copy as partly independent (copy fit below 0.75), but it differs from its source on far less than the
    round's median pair does."""
    fit_alone = 0
    for seed in range(4):
        rng = np.random.default_rng(seed)
        weight = rng.uniform(0.2, 0.95, size=(10, 1))
        updates = weight * rng.standard_normal(COORDS) + np.sqrt(1 - weight ** 2) * rng.standard_normal((10, COORDS))
        top = int(np.argmax(weight))
        copied = np.vstack([updates, updates[top] + 0.1 * rng.standard_normal(COORDS)])
        assert groups_of(copied) == [(f"c{top:02d}", "c10")], seed
        fit_alone += groups_of(copied, DuplicateRule(max_relative_disagreement=0.0)) != []
    assert fit_alone <= 2  # the third-party test alone misses most of them


def test_colluders_that_agree_with_nobody_else_need_no_witness():
    """Two colluders on one random update, each with noise half its size (they differ on about 20% of the
    tasks): no third client agrees with them beyond chance, so their private parts alone decide."""
    for seed in range(4):
        updates = honest_round(5, seed)
        shared = np.random.default_rng(100 + seed).standard_normal(COORDS)
        noisy = shared + 0.5 * np.random.default_rng(200 + seed).standard_normal((2, COORDS))
        assert groups_of(np.vstack([updates, noisy]), DuplicateRule(max_relative_disagreement=0.0)) == [
            ("c05", "c06")], seed


def _refine_loadings_numpy(rho, lam):
    """The fixed point as numpy calls (how it was first written): the compiled loop must equal it bit for bit."""
    n = lam.size
    off = ~np.eye(n, dtype=bool)
    for _ in range(50):
        informative = np.abs(lam) >= 0.1
        peers = off & informative[None, :]
        enough = peers.sum(axis=1) >= 2
        fit = np.zeros(n)
        if enough.any():
            ratios = np.where(peers, rho / np.where(informative, lam, 1.0)[None, :], np.nan)
            fit[enough] = np.nanmedian(ratios[enough], axis=1)
        new = np.clip(np.sign(fit) * np.sqrt(np.abs(fit * lam)), -0.999, 0.999)
        if np.allclose(new, lam, atol=1e-6):
            break
        lam = new
    return lam


@pytest.mark.parametrize("parallel", [False, True])
@pytest.mark.parametrize("n", [4, 5, 12, 31])
def test_compiled_loading_fit_equals_the_numpy_loop(n, parallel):
    rng = np.random.default_rng(n)
    for trial in range(20):
        rate = np.abs(rng.normal(0.35, 0.1, (n, n))).clip(0, 0.5)
        rate = (rate + rate.T) / 2
        np.fill_diagonal(rate, 0)
        rate[0, 1] = rate[1, 0] = 0.01  # a copy pair
        if trial % 4 == 0:
            rate[-1, :] = rate[:, -1] = 0.5  # a free rider (|lambda| near 0, left out as a peer)
            rate[-1, -1] = 0
        rho = np.cos(np.pi * rate)
        lam0 = rng.uniform(-1, 1, n)
        fitted = _REFINE_LOADINGS[parallel](rho, lam0.copy())
        assert np.array_equal(fitted, _refine_loadings_numpy(rho, lam0.copy()))
