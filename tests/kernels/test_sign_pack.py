"""Sign packing: the CPU and Triton kernels write the reference's words, and only their own words."""

import numpy as np
import pytest
import torch
from conftest import FLOAT_DTYPES, random_values

from kfca_llm.kernels.sign_pack import cpu, reference
from kfca_llm.kernels.sign_pack import triton as triton_pack
from kfca_llm.kernels.sign_pack.plan import PackPlan

SENTINEL = 0x5A5A5A5A
ALL_DTYPES = FLOAT_DTYPES + (torch.float64,)


def _cpu_sign_pack(values, signs, task, flags, *, client, tensor, word_offset):
    """The CPU kernel behind the Triton launcher's signature: one tensor of one client."""
    raw, exp_mask = cpu.raw_view(values)
    bad = cpu.sign_pack([(word_offset, [(client * signs.shape[1] + word_offset, raw)])],
                        signs.numpy().view(np.uint32).reshape(-1), task.numpy().view(np.uint32), exp_mask)
    if bad[0]:
        flags[client, tensor] = 1


PACKERS = {"cpu": _cpu_sign_pack, "triton": triton_pack.sign_pack}


def _pack_into_poisoned(values, rng, device, *, word_offset=5, n_clients=3, client=1, n_tensors=4, tensor=2,
                        pack="triton"):
    """Pack into buffers poisoned with SENTINEL (signs) and random bits (task); return all of them on the CPU."""
    device = device if pack == "triton" else torch.device("cpu")
    n_words = word_offset + -(-values.numel() // 32) + 7
    signs = torch.full((n_clients, n_words), SENTINEL, dtype=torch.int32)
    task_before = torch.from_numpy(rng.integers(-2**31, 2**31, size=n_words, dtype=np.int64).astype(np.int32))
    task = task_before.clone().to(device)
    signs, flags = signs.to(device), torch.zeros((n_clients, n_tensors), dtype=torch.int32, device=device)
    PACKERS[pack](values.to(device), signs, task, flags, client=client, tensor=tensor, word_offset=word_offset)
    return signs.cpu(), task_before, task.cpu(), flags.cpu()


@pytest.mark.parametrize("kernel", PACKERS)
@pytest.mark.parametrize("dtype", ALL_DTYPES)
@pytest.mark.parametrize("numel", [1, 31, 32, 33, 1000])
def test_packed_words_match_reference(kernel, dtype, numel, rng, device):
    values = random_values(rng, numel, dtype)
    values[0] = -0.0 if numel % 2 else 0.0
    signs, task_before, task, flags = _pack_into_poisoned(values, rng, device, pack=kernel)
    ref_signs, ref_nonzero = reference.pack_signs(values.double().numpy())
    span = slice(5, 5 + ref_signs.size)
    np.testing.assert_array_equal(signs[1, span].numpy(), ref_signs)
    np.testing.assert_array_equal(task[span].numpy(), task_before[span].numpy() | ref_nonzero)
    # Words outside the tensor's range and other clients' rows are untouched.
    outside = torch.ones(signs.shape[1], dtype=torch.bool)
    outside[span] = False
    assert (signs[1, outside] == SENTINEL).all() and (signs[[0, 2]] == SENTINEL).all()
    assert torch.equal(task[outside], task_before[outside])
    assert not flags.any()


@pytest.mark.parametrize("kernel", PACKERS)
def test_large_odd_tensor_matches_reference(kernel, rng, device):
    values = random_values(rng, 1_000_003, torch.bfloat16)
    signs, task_before, task, flags = _pack_into_poisoned(values, rng, device, word_offset=1, pack=kernel)
    ref_signs, ref_nonzero = reference.pack_signs(values.double().numpy())
    np.testing.assert_array_equal(signs[1, 1:1 + ref_signs.size].numpy(), ref_signs)
    np.testing.assert_array_equal(task[1:1 + ref_signs.size].numpy(), task_before[1:1 + ref_signs.size].numpy() | ref_nonzero)
    assert (signs[1, 1 + ref_signs.size:] == SENTINEL).all() and signs[1, 0] == SENTINEL


@pytest.mark.parametrize("kernel", PACKERS)
@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_signed_zeros_are_not_negative_and_not_tasks(kernel, dtype, device):
    device = device if kernel == "triton" else torch.device("cpu")
    values = torch.tensor([0.0, -0.0] * 20 + [-1.5, 2.0, -0.0], dtype=dtype, device=device)
    signs = torch.zeros((1, 2), dtype=torch.int32, device=device)
    task = torch.zeros(2, dtype=torch.int32, device=device)
    flags = torch.zeros((1, 1), dtype=torch.int32, device=device)
    PACKERS[kernel](values, signs, task, flags, client=0, tensor=0, word_offset=0)
    # Element 40 (-1.5) is bit 8 of word 1, element 41 (2.0) bit 9.
    assert signs.tolist() == [[0, 1 << 8]]
    assert task.tolist() == [0, (1 << 8) | (1 << 9)]


def test_non_contiguous_input_packs_like_its_contiguous_copy(rng, device):
    base = random_values(rng, 37 * 45, torch.float32).reshape(37, 45)
    view = base.t()[3:, ::2]
    signs_a, _, task_a, _ = _pack_into_poisoned(view, np.random.default_rng(1), device)
    signs_b, _, task_b, _ = _pack_into_poisoned(view.contiguous(), np.random.default_rng(1), device)
    assert torch.equal(signs_a, signs_b) and torch.equal(task_a, task_b)


@pytest.mark.parametrize("kernel", PACKERS)
@pytest.mark.parametrize("dtype", ALL_DTYPES)
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf"), -float("nan")])
def test_nonfinite_flags_only_that_client_and_tensor(kernel, dtype, bad, rng, device):
    values = random_values(rng, 70, dtype)
    position = int(rng.integers(70))
    values[position] = bad
    signs, task_before, task, flags = _pack_into_poisoned(values, rng, device, client=2, tensor=1, pack=kernel)
    expected = torch.zeros_like(flags)
    expected[2, 1] = 1
    assert torch.equal(flags, expected)
    # The words are still fully written, as x < 0 and x != 0 define them (NaN: non-negative, non-zero).
    ref_signs, ref_nonzero = reference.pack_signs(values.double().numpy())
    np.testing.assert_array_equal(signs[2, 5:8].numpy(), ref_signs)
    np.testing.assert_array_equal(task[5:8].numpy(), task_before[5:8].numpy() | ref_nonzero)


# ---- the round launcher: many clients' tensors, from flat buffers or from an address table -------------------

# 40,000 elements span several interpreter blocks (512 words) and GPU blocks (128 words); the others are tails.
NUMELS = [33, 1, 40_000, 32, 31, 4096 + 7, 64]


def _round_values(rng, dtype, n_sources):
    """Per source, per tensor: random values with +-0; source 1 holds a NaN in tensor 2's last (partial) word
    and source 2 an Inf in a whole word of tensor 5."""
    values = [[random_values(rng, n, dtype) for n in NUMELS] for _ in range(n_sources)]
    values[1][2][-1] = float("nan")
    values[2][5][100] = float("-inf")
    return values, {(1, 2), (2, 5)}


def _plan(device):
    offsets = np.cumsum([0] + [-(-n // 32) + 1 for n in NUMELS[:-1]]) + 2  # a gap word after each tensor
    return PackPlan.build(NUMELS, offsets, triton_pack.block_words_for(device)), int(offsets[-1] - (-NUMELS[-1] // 32))


@pytest.mark.parametrize("dtype", ALL_DTYPES)
@pytest.mark.parametrize("source", ["flat", "table"])
def test_round_pack_matches_reference_for_every_client_and_tensor(dtype, source, rng, device):
    plan, n_words = _plan(device)
    rows = np.array([3, 0, 2])  # the sources' clients, in no particular order; client 1 sends nothing
    values, bad = _round_values(rng, dtype, rows.size)
    kept = []
    if source == "flat":
        for per_tensor in values:
            flat = torch.full((32 * n_words,), float("nan"), dtype=dtype)  # padding holds NaN: never read
            flat[32 * n_words - 5:] = -1.0
            for k, v in enumerate(per_tensor):
                flat[32 * plan.word_offsets[k]:32 * plan.word_offsets[k] + v.numel()] = v
            kept.append(flat.to(device))
        addresses = [[f.data_ptr()] for f in kept]
    else:
        kept = [[v.to(device) for v in per_tensor] for per_tensor in values]
        addresses = [[v.data_ptr() for v in per_tensor] for per_tensor in kept]
    signs = torch.full((4, n_words), SENTINEL, dtype=torch.int32, device=device)
    task_before = rng.integers(-2**31, 2**31, size=n_words, dtype=np.int64).astype(np.int32)
    task = torch.from_numpy(task_before).to(device)
    flags = torch.zeros((4, len(NUMELS)), dtype=torch.int32, device=device)
    table = torch.from_numpy(np.concatenate([rows, np.ravel(addresses)]).astype(np.int64)).to(device)
    triton_pack.pack(dtype, triton_pack.DevicePlan.upload(plan, device), table, rows.size, signs, task, flags,
                     flat=source == "flat")
    signs, task, flags = signs.cpu().numpy(), task.cpu().numpy(), flags.cpu().numpy()
    expected_task = task_before.copy()
    expected_flags = np.zeros_like(flags)
    for s, row in enumerate(rows):
        for k, v in enumerate(values[s]):
            ref_signs, ref_nonzero = reference.pack_signs(v.double().numpy())
            words = slice(plan.word_offsets[k], plan.word_offsets[k] + ref_signs.size)
            np.testing.assert_array_equal(signs[row, words], ref_signs)
            expected_task[words] |= ref_nonzero
            expected_flags[row, k] = (s, k) in bad
            signs[row, words] = SENTINEL
    np.testing.assert_array_equal(task, expected_task)
    np.testing.assert_array_equal(flags, expected_flags)
    assert (signs == SENTINEL).all()  # gap words and client 1's row: untouched


def test_round_pack_of_some_tensors_leaves_the_others_and_missing_ones_alone(rng, device):
    """A launch over columns [tensor 5, tensor 0, tensor 2] where the second source lacks tensor 0 (address 0)."""
    plan, n_words = _plan(device)
    values, _ = _round_values(rng, torch.float32, 3)
    columns = np.array([5, 0, 2])
    rows = np.array([1, 2])
    kept = [[values[s][k].to(device) for k in columns] for s in (0, 1)]
    addresses = np.array([[v.data_ptr() for v in per_source] for per_source in kept], dtype=np.int64)
    addresses[1, 1] = 0
    signs = torch.full((3, n_words), SENTINEL, dtype=torch.int32, device=device)
    task = torch.zeros(n_words, dtype=torch.int32, device=device)
    flags = torch.zeros((3, len(NUMELS)), dtype=torch.int32, device=device)
    tables, n_blocks, n_tails = triton_pack.subset_tables(plan, columns)
    subset = triton_pack.Subset(torch.from_numpy(tables).to(device), n_blocks, n_tails)
    table = torch.from_numpy(np.concatenate([rows, addresses.ravel()])).to(device)
    triton_pack.pack(torch.float32, triton_pack.DevicePlan.upload(plan, device), table, 2, signs, task, flags,
                     flat=False, subset=subset)
    signs, task, flags = signs.cpu().numpy(), task.cpu().numpy(), flags.cpu().numpy()
    expected_task = np.zeros_like(task)
    for s, row in enumerate(rows):
        for c, k in enumerate(columns):
            ref_signs, ref_nonzero = reference.pack_signs(values[s][k].double().numpy())
            words = slice(plan.word_offsets[k], plan.word_offsets[k] + ref_signs.size)
            if addresses[s, c] == 0:
                assert (signs[row, words] == SENTINEL).all()
                continue
            np.testing.assert_array_equal(signs[row, words], ref_signs)
            expected_task[words] |= ref_nonzero
            signs[row, words] = SENTINEL
    np.testing.assert_array_equal(task, expected_task)
    assert (signs == SENTINEL).all() and flags.tolist() == [[0] * 7, [0] * 7, [0, 0, 1, 0, 0, 0, 0]]


def test_plan_tables_cover_every_whole_word_once_and_name_the_tails():
    plan = PackPlan.build(NUMELS, np.arange(len(NUMELS)) * 2000, 64)
    covered = [set() for _ in NUMELS]
    for tensor, first in zip(plan.block_tensor, plan.block_word):
        covered[tensor] |= set(range(first, min(first + 64, plan.full_words[tensor])))
    assert [len(c) for c in covered] == [n // 32 for n in NUMELS]
    assert plan.tail_tensors.tolist() == [k for k, n in enumerate(NUMELS) if n % 32]
    blocks, positions = plan.blocks_of(np.array([5, 2]))
    assert set(plan.block_tensor[blocks]) == {5, 2} and (np.array([5, 2])[positions] == plan.block_tensor[blocks]).all()
    assert blocks.size == plan.block_start[6] - plan.block_start[5] + plan.block_start[3] - plan.block_start[2]
