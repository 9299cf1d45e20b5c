"""MNIST as the user has it: IDX files (gzip or not) the test writes, the paper's silo protocol and CNN."""

from __future__ import annotations

import gzip
import json
import struct

import numpy as np
import pytest

from kfca_llm import InputError
from kfca_llm.valuation.cases import PAPER_CLIENT_SIZE, load_images, make_clients, read_idx, silo_split
from kfca_llm.valuation.cnn_federation import StackedMnistCNN


def _idx(array: np.ndarray) -> bytes:
    return bytes([0, 0, 0x08, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape) + array.astype(np.uint8).tobytes()


def _write_mnist(folder, n_train: int, n_test: int, seed: int = 0):
    """Digit-like 28x28 images: class c lights up row band c (so a CNN can learn them), plus noise."""
    rng = np.random.default_rng(seed)
    out = {}
    for stem, n, compress in (("train", n_train, True), ("t10k", n_test, False)):
        y = rng.integers(0, 10, n).astype(np.uint8)
        x = rng.integers(0, 60, (n, 28, 28)).astype(np.uint8)
        for i, c in enumerate(y):
            x[i, 2 + 2 * c: 4 + 2 * c, 4:24] = 255
        for kind, array in (("images-idx3", x), ("labels-idx1", y)):
            name = f"{stem}-{kind}-ubyte"
            data = _idx(array)
            # the training images gzip-compressed, everything else raw: both forms are read
            if compress and kind == "images-idx3":
                (folder / (name + ".gz")).write_bytes(gzip.compress(data))
            else:
                (folder / name).write_bytes(data)
        out[stem] = (x, y)
    return out


def test_idx_files_read_back_exactly(tmp_path):
    written = _write_mnist(tmp_path, 120, 40)
    x, y = written["train"]
    assert np.array_equal(read_idx(tmp_path / "train-images-idx3-ubyte.gz"), x)
    assert np.array_equal(read_idx(tmp_path / "train-labels-idx1-ubyte"), y)
    images = load_images(str(tmp_path))
    assert "t10k as test set" in images.name and images.num_classes == 10
    assert images.train_x.shape == (120, 28, 28) and images.test_x.shape == (40, 28, 28)
    np.testing.assert_array_equal(images.train_y, y)
    np.testing.assert_array_equal(images.test_y, written["t10k"][1])
    mean, std = x.mean(), x.std()  # standardised with the training pool's statistics
    np.testing.assert_allclose(images.train_x, (x - mean) / std, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(images.test_x, (written["t10k"][0] - mean) / std, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("damage, message", [
    (lambda raw: b"\x00\x01" + raw[2:], "not an unsigned-byte IDX"),
    (lambda raw: raw[:-5], "header says"),
    (lambda raw: raw[:6], "truncated IDX header"),
    (lambda raw: gzip.compress(raw)[:-8], "not a readable gzip"),
])
def test_damaged_idx_files_fail_with_one_clear_error(tmp_path, damage, message):
    path = tmp_path / "train-labels-idx1-ubyte"
    path.write_bytes(damage(_idx(np.arange(10, dtype=np.uint8))))
    with pytest.raises(InputError, match=message) as info:
        read_idx(path)
    assert "train-labels-idx1-ubyte" in str(info.value)


def test_silo_protocol_follows_the_paper():
    labels = np.repeat(np.arange(10), 6000)  # MNIST's 60,000 training labels
    rng = np.random.default_rng(0)
    parts = silo_split(labels, 10, "iid", 10, rng)
    silos = [np.union1d(parts[2 * k], parts[2 * k + 1]) for k in range(5)]
    assert all(p.size == PAPER_CLIENT_SIZE == 10_840 and np.unique(p).size == p.size for p in parts)
    for k in range(5):  # the pair's clients come from one silo of 12,000 and overlap (2 x 10,840 > 12,000)
        assert silos[k].size <= 12_000 and np.intersect1d(parts[2 * k], parts[2 * k + 1]).size >= 2 * 10_840 - 12_000
        for other in range(k + 1, 5):
            assert np.intersect1d(silos[k], silos[other]).size == 0
    counts = np.bincount(labels[parts[0]], minlength=10)
    assert 0.9 * 1084 < counts.min() and counts.max() < 1.1 * 1084  # balanced as far as the silo's digits allow
    skew = silo_split(labels, 10, "label_skew", 10, np.random.default_rng(0))
    for c, p in enumerate(skew):  # 80% from the group's two digits, as far as the silo has them (~2,400)
        favourite = np.isin(labels[p], [(2 * (c // 2) + 1) % 10, (2 * (c // 2) + 2) % 10])
        assert 2_000 < favourite.sum() <= 2_600 and p.size == 10_840
    with pytest.raises(InputError, match="even number"):
        silo_split(labels, 5, "iid", 10, rng)


def test_the_papers_cnn_has_21840_parameters_and_computes_each_stacked_model_alone():
    import torch
    import torch.nn.functional as F

    from kfca_llm.valuation.cnn_federation import accuracy, predictions

    model = StackedMnistCNN()
    assert model.num_parameters == 21_840
    flat = torch.stack([model.init(0), model.init(1), model.init(2)])
    x = torch.randn(1_100, 1, 28, 28, generator=torch.Generator().manual_seed(0))  # three eval slices of 500
    y = torch.randint(0, 10, (1_100,), generator=torch.Generator().manual_seed(1))
    p = model.unflatten(flat)
    expected = []
    for k in range(3):  # the PyTorch MNIST CNN (dropout aside), one model at a time
        h = F.relu(F.max_pool2d(F.conv2d(x, p["conv1_weight"][k], p["conv1_bias"][k]), 2))
        h = F.relu(F.max_pool2d(F.conv2d(h, p["conv2_weight"][k], p["conv2_bias"][k]), 2)).reshape(-1, 320)
        h = F.relu(h @ p["fc1_weight"][k] + p["fc1_bias"][k])
        expected.append((h @ p["fc2_weight"][k] + p["fc2_bias"][k]).argmax(-1))
    expected = torch.stack(expected)
    np.testing.assert_array_equal(predictions(model, flat, x), expected.numpy())
    np.testing.assert_allclose(accuracy(model, flat, x, y), (expected == y).double().mean(-1).numpy(), atol=1e-7)


def test_fidelity_on_idx_files_uses_the_papers_protocol_and_cnn(tmp_path, capsys):
    from kfca_llm.cli import main

    (tmp_path / "mnist").mkdir()
    _write_mnist(tmp_path / "mnist", 200, 60)
    out = tmp_path / "out"
    assert main(["fidelity", "--data", str(tmp_path / "mnist"), "--case", "iid,label_skew", "--clients", "4",
                 "--rounds", "1", "--methods", "kfca-qp", "--jobs", "1", "--out", str(out)]) == 0
    result = json.loads((out / "fidelity.json").read_text())
    assert result["protocol"] == "silos"
    for case in result["cases"].values():
        assert case["parameters"] == 21_840 and case["protocol"] == "silos"
        assert case["clients"] == [100] * 4  # min(10,840, silo of 200 / 2)
        assert case["methods"]["exact-sv"]["coalitions"] == 16
    images = load_images(str(tmp_path / "mnist"))
    clients = make_clients(images, "iid", 4, seed=0, protocol="silos")
    assert [c.x.shape for c in clients] == [(100, 1, 28, 28)] * 4
