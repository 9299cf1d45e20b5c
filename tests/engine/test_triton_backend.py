"""The Triton backend: words, counts and draws bit-identical to the numpy references and the CPU backend."""

import numpy as np
import pytest
import torch
from conftest import random_updates

from kfca_llm.engine import Layout, get_backend
from kfca_llm.errors import InputError
from kfca_llm.kernels.pair_counts.reference import binary_gram
from kfca_llm.kernels.sampled_penalty.reference import sampled_matches
from kfca_llm.kernels.sign_pack.reference import pack_signs

# Odd lengths on purpose: padding bits, tensors that start mid-way through nothing, one-element tensors.
SHAPES = {"a.lora_A": (3, 11), "b.lora_B": (33,), "c.bias": (1,), "d.lora_A": (31,), "e.lora_B": (32, 40),
          "f.zero": (7, 9), "g.lora_A": (129, 17)}


def _pack(backend_name: str, updates, layout: Layout):
    backend = get_backend(backend_name)
    buffers = backend.allocate(len(updates), layout)
    for client, update in enumerate(updates):
        for tensor, slot in enumerate(layout.slots):
            backend.pack(buffers, client, tensor, update[slot.name])
    return backend, buffers


def _all_pairs(n):
    return np.array([(i, j) for i in range(n) for j in range(n) if i != j], dtype=np.int64)


@pytest.mark.parametrize("n_clients", [2, 5, 17])
def test_backend_words_counts_and_draws_match_reference_and_cpu(n_clients, rng):
    layout = Layout.from_shapes(SHAPES)
    updates = random_updates(rng, n_clients, SHAPES, zero_tensor="f.zero")
    triton_backend, triton_buffers = _pack("triton", updates, layout)
    cpu_backend, cpu_buffers = _pack("cpu", updates, layout)
    signs, task = triton_backend.host_words(triton_buffers)
    cpu_signs, cpu_task = cpu_backend.host_words(cpu_buffers)
    np.testing.assert_array_equal(signs, cpu_signs)
    np.testing.assert_array_equal(task, cpu_task)
    for client, update in enumerate(updates):
        for slot in layout.slots:
            ref_signs, _ = pack_signs(update[slot.name].double().numpy())
            np.testing.assert_array_equal(signs[client, slot.word_offset:slot.word_offset + slot.n_words], ref_signs)
    zero = layout.slot("f.zero")
    assert not task[zero.word_offset:zero.word_offset + zero.n_words].any()
    assert not triton_backend.nonfinite(triton_buffers).any()
    pairs = _all_pairs(n_clients)
    for seed, fraction in [(0, 0.5), (int(rng.integers(2**32)), 0.3), (2**32 - 1, 0.8)]:
        counts = triton_backend.round_counts(triton_buffers, seed, fraction)
        ref_gram, ref_sizes = binary_gram(signs, task, seed, fraction)
        np.testing.assert_array_equal(counts.gram, ref_gram)
        np.testing.assert_array_equal(counts.sizes, ref_sizes)
        np.testing.assert_array_equal(counts.gram, cpu_backend.round_counts(cpu_buffers, seed, fraction).gram)
        matches = triton_backend.sampled_matches(triton_buffers, seed, fraction, pairs)
        np.testing.assert_array_equal(matches, sampled_matches(signs, task, seed, fraction, pairs))
        np.testing.assert_array_equal(matches, cpu_backend.sampled_matches(cpu_buffers, seed, fraction, pairs))


def test_nonfinite_is_reported_per_client_and_tensor(rng):
    layout = Layout.from_shapes(SHAPES)
    updates = random_updates(rng, 4, SHAPES)
    updates[2]["e.lora_B"][5, 7] = float("inf")
    updates[3]["c.bias"][0] = float("nan")
    backend, buffers = _pack("triton", updates, layout)
    expected = np.zeros((4, len(layout.slots)), dtype=bool)
    expected[2, layout.names.index("e.lora_B")] = True
    expected[3, layout.names.index("c.bias")] = True
    np.testing.assert_array_equal(backend.nonfinite(buffers), expected)


def test_too_few_tasks_raise_input_error(rng):
    layout = Layout.from_shapes({"w": (40,)})
    updates = [{"w": torch.zeros(40)} for _ in range(3)]
    updates[0]["w"][17] = -0.5  # one task: some set must be empty
    backend, buffers = _pack("triton", updates, layout)
    with pytest.raises(InputError):
        backend.round_counts(buffers, 0, 0.5)
    with pytest.raises(InputError):
        backend.sampled_matches(buffers, 0, 0.5, _all_pairs(3))


def test_pack_accepts_numpy_and_rejects_bad_input(rng):
    layout = Layout.from_shapes({"w": (5, 7)})
    backend = get_backend("triton")
    buffers = backend.allocate(2, layout)
    values = rng.standard_normal((5, 7)).astype(np.float32)
    backend.pack(buffers, 0, 0, values)
    backend.pack(buffers, 1, 0, values.astype(np.float16).T)
    signs, task = backend.host_words(buffers)
    np.testing.assert_array_equal(signs[0], pack_signs(values)[0])
    np.testing.assert_array_equal(signs[1], pack_signs(values.astype(np.float16).T)[0])
    with pytest.raises(InputError, match="35 values"):
        backend.pack(buffers, 0, 0, np.ones(34, dtype=np.float32))
    with pytest.raises(InputError, match="dtype"):
        backend.pack(buffers, 0, 0, np.ones(35, dtype=np.int32))
