"""Sign packing: the CPU and Triton kernels write the reference's words, and only their own words."""

import numpy as np
import pytest
import torch
from conftest import FLOAT_DTYPES, random_values

from kfca_llm.kernels.sign_pack import cpu, reference
from kfca_llm.kernels.sign_pack.triton import sign_pack

SENTINEL = 0x5A5A5A5A


def _cpu_sign_pack(values, signs, task, flags, *, client, tensor, word_offset):
    """The CPU kernel behind the Triton launcher's signature: one tensor of one client."""
    raw, exp_mask = cpu.raw_view(values)
    bad = cpu.sign_pack([(word_offset, [(client * signs.shape[1] + word_offset, raw)])],
                        signs.numpy().view(np.uint32).reshape(-1), task.numpy().view(np.uint32), exp_mask)
    if bad[0]:
        flags[client, tensor] = 1


PACKERS = {"cpu": _cpu_sign_pack, "triton": sign_pack}


def _pack_into_poisoned(values, rng, *, word_offset=5, n_clients=3, client=1, n_tensors=4, tensor=2, pack=sign_pack):
    """Pack into buffers poisoned with SENTINEL (signs) and random bits (task); return all of them."""
    n_words = word_offset + -(-values.numel() // 32) + 7
    signs = torch.full((n_clients, n_words), SENTINEL, dtype=torch.int32)
    task_before = torch.from_numpy(rng.integers(-2**31, 2**31, size=n_words, dtype=np.int64).astype(np.int32))
    task = task_before.clone()
    flags = torch.zeros((n_clients, n_tensors), dtype=torch.int32)
    pack(values, signs, task, flags, client=client, tensor=tensor, word_offset=word_offset)
    return signs, task_before, task, flags


@pytest.mark.parametrize("kernel", PACKERS)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES + (torch.float64,))
@pytest.mark.parametrize("numel", [1, 31, 32, 33, 1000])
def test_packed_words_match_reference(kernel, dtype, numel, rng):
    values = random_values(rng, numel, dtype)
    values[0] = -0.0 if numel % 2 else 0.0
    signs, task_before, task, flags = _pack_into_poisoned(values, rng, pack=PACKERS[kernel])
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
def test_large_odd_tensor_matches_reference(kernel, rng):
    values = random_values(rng, 1_000_003, torch.bfloat16)
    signs, task_before, task, flags = _pack_into_poisoned(values, rng, word_offset=1, pack=PACKERS[kernel])
    ref_signs, ref_nonzero = reference.pack_signs(values.double().numpy())
    np.testing.assert_array_equal(signs[1, 1:1 + ref_signs.size].numpy(), ref_signs)
    np.testing.assert_array_equal(task[1:1 + ref_signs.size].numpy(), task_before[1:1 + ref_signs.size].numpy() | ref_nonzero)
    assert (signs[1, 1 + ref_signs.size:] == SENTINEL).all() and signs[1, 0] == SENTINEL


@pytest.mark.parametrize("kernel", PACKERS)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_signed_zeros_are_not_negative_and_not_tasks(kernel, dtype):
    values = torch.tensor([0.0, -0.0] * 20 + [-1.5, 2.0, -0.0], dtype=dtype)
    signs = torch.zeros((1, 2), dtype=torch.int32)
    task = torch.zeros(2, dtype=torch.int32)
    flags = torch.zeros((1, 1), dtype=torch.int32)
    PACKERS[kernel](values, signs, task, flags, client=0, tensor=0, word_offset=0)
    # Element 40 (-1.5) is bit 8 of word 1, element 41 (2.0) bit 9.
    assert signs.tolist() == [[0, 1 << 8]]
    assert task.tolist() == [0, (1 << 8) | (1 << 9)]


def test_non_contiguous_input_packs_like_its_contiguous_copy(rng):
    base = random_values(rng, 37 * 45, torch.float32).reshape(37, 45)
    view = base.t()[3:, ::2]
    signs_a, _, task_a, _ = _pack_into_poisoned(view, np.random.default_rng(1))
    signs_b, _, task_b, _ = _pack_into_poisoned(view.contiguous(), np.random.default_rng(1))
    assert torch.equal(signs_a, signs_b) and torch.equal(task_a, task_b)


@pytest.mark.parametrize("kernel", PACKERS)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES + (torch.float64,))
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf"), -float("nan")])
def test_nonfinite_flags_only_that_client_and_tensor(kernel, dtype, bad, rng):
    values = random_values(rng, 70, dtype)
    position = int(rng.integers(70))
    values[position] = bad
    signs, task_before, task, flags = _pack_into_poisoned(values, rng, client=2, tensor=1, pack=PACKERS[kernel])
    expected = torch.zeros_like(flags)
    expected[2, 1] = 1
    assert torch.equal(flags, expected)
    # The words are still fully written, as x < 0 and x != 0 define them (NaN: non-negative, non-zero).
    ref_signs, ref_nonzero = reference.pack_signs(values.double().numpy())
    np.testing.assert_array_equal(signs[2, 5:8].numpy(), ref_signs)
    np.testing.assert_array_equal(task[5:8].numpy(), task_before[5:8].numpy() | ref_nonzero)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES + (torch.float64,))
def test_grouped_launch_equals_one_launch_per_tensor(dtype, rng):
    """sign_pack_many (one launch for many tensors) writes exactly what per-tensor launches write."""
    from kfca_llm.kernels.sign_pack.triton import sign_pack_many

    numels = [1, 31, 33, 32 * 1024 + 7, 1000]  # one tensor spans several blocks of the grouped grid
    values = [random_values(rng, n, dtype) for n in numels]
    values[3][-1] = float("nan")  # flagged in the partial last word of a multi-block member
    offsets, total = [], 2
    for n in numels:
        offsets.append(total)
        total += -(-n // 32) + 1  # a gap word between members must stay untouched
    tensors = [4, 0, 3, 1, 2]
    grouped = torch.full((3, total + 3), SENTINEL, dtype=torch.int32)
    single = grouped.clone()
    task_before = torch.from_numpy(rng.integers(-2**31, 2**31, size=total + 3, dtype=np.int64).astype(np.int32))
    task_grouped, task_single = task_before.clone(), task_before.clone()
    flags_grouped = torch.zeros((3, 5), dtype=torch.int32)
    flags_single = flags_grouped.clone()
    sign_pack_many(values, grouped, task_grouped, flags_grouped, client=2, tensors=tensors, word_offsets=offsets)
    for v, t, o in zip(values, tensors, offsets):
        sign_pack(v, single, task_single, flags_single, client=2, tensor=t, word_offset=o)
    assert torch.equal(grouped, single) and torch.equal(task_grouped, task_single)
    assert torch.equal(flags_grouped, flags_single) and flags_grouped[2].tolist() == [0, 1, 0, 0, 0]
    for v, o in zip(values, offsets):
        ref_signs, _ = reference.pack_signs(v.double().numpy())
        np.testing.assert_array_equal(grouped[2, o:o + ref_signs.size].numpy(), ref_signs)
    assert (grouped[[0, 1]] == SENTINEL).all() and (grouped[2, :2] == SENTINEL).all()
