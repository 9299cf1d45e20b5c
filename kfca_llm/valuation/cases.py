"""Image data sets and the paper's five client cases (appendix "Experiments: Additional Details").

Clients come in pairs ("silos"): clients 2k and 2k+1 form group k, and the case's level rises with k
(the paper: 10 clients, 5 groups). ``load_images`` gives scikit-learn's bundled 8x8 digits (no
download) or a local copy of MNIST / any image classification set.
"""

from __future__ import annotations

import gzip
import io
import math
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..errors import InputError
from .cnn_federation import ClientData

CASES = ("iid", "label_skew", "size_skew", "label_noise", "feature_noise")
SKEW_SHARE = 0.8  # label skew: share of a client's examples from its group's two digits
LEVEL_STEP = 0.05  # label / feature noise: group k gets rate 5k%
SIZE_BASE, SIZE_STEP = 10.0, 5.0  # size skew: group k holds (10 + 5k)% of the examples (for 5 groups)
FEATURE_NOISE_STD = 1.0  # Gaussian noise added to a noisy image, in units of the pixel standard deviation
PROTOCOLS = ("split", "silos")
PAPER_CLIENT_SIZE = 10_840  # the paper's images per client (MNIST, silo protocol)


@dataclass(frozen=True)
class ImageSet:
    """Standardised images and labels, split into a training pool and a held-out test set."""

    train_x: np.ndarray
    train_y: np.ndarray
    test_x: np.ndarray
    test_y: np.ndarray
    num_classes: int
    name: str


def _standardise(train: np.ndarray, test: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    mean, std = train.mean(), train.std() or 1.0
    return ((train - mean) / std).astype(np.float32), ((test - mean) / std).astype(np.float32)


def _split(x: np.ndarray, y: np.ndarray, test_fraction: float, seed: int, name: str) -> ImageSet:
    order = np.random.default_rng(seed).permutation(len(y))
    n_test = int(round(test_fraction * len(y)))
    test, train = order[:n_test], order[n_test:]
    tx, ex = _standardise(x[train].astype(np.float64), x[test].astype(np.float64))
    return ImageSet(tx, y[train].astype(np.int64), ex, y[test].astype(np.int64), int(y.max()) + 1, name)


MAX_IDX_BYTES = 1 << 31  # a decompressed IDX file larger than this is refused (MNIST's largest: 47 MB)


def read_idx(path: Path) -> np.ndarray:
    """An unsigned-byte IDX array (the MNIST format), gzip-compressed or not (recognised by its magic bytes)."""
    if path.stat().st_size > MAX_IDX_BYTES:
        raise InputError(f"{path}: larger than {MAX_IDX_BYTES} bytes")
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        try:
            with gzip.GzipFile(fileobj=io.BytesIO(raw)) as fh:
                raw = fh.read(MAX_IDX_BYTES + 1)
        except (OSError, EOFError) as exc:
            raise InputError(f"{path}: not a readable gzip file ({exc})") from None
        if len(raw) > MAX_IDX_BYTES:
            raise InputError(f"{path}: decompresses to more than {MAX_IDX_BYTES} bytes")
    if len(raw) < 4 or raw[:2] != b"\0\0" or raw[2] != 0x08 or not 1 <= raw[3] <= 4:
        raise InputError(f"{path} is not an unsigned-byte IDX file of 1-4 dimensions")
    header = 4 + 4 * raw[3]
    if len(raw) < header:
        raise InputError(f"{path}: truncated IDX header")
    dims = struct.unpack(f">{raw[3]}I", raw[4:header])
    if 0 in dims:
        raise InputError(f"{path}: header says {dims}, an empty array")
    data = np.frombuffer(raw, dtype=np.uint8, offset=header)
    if data.size != math.prod(dims):  # Python integers: numpy's product of four 32-bit sizes wraps around
        raise InputError(f"{path}: header says {dims}, file holds {data.size} values")
    return data.reshape(dims)
def _idx_pair(images: Path, labels: Path) -> tuple[np.ndarray, np.ndarray]:
    x, y = read_idx(images), read_idx(labels)
    if x.ndim != 3 or y.ndim != 1 or x.shape[0] != y.shape[0]:
        raise InputError(f"{images.name} / {labels.name}: expected (N, H, W) images and N labels, "
                         f"got {x.shape} and {y.shape}")
    return x.astype(np.float64), y.astype(np.int64)


def _find(folder: Path, stem: str) -> Path | None:
    for name in (stem, stem + ".gz"):
        if (folder / name).is_file():
            return folder / name
    return None


def _load_folder(folder: Path, max_examples: int | None) -> tuple[np.ndarray, np.ndarray, str]:
    images, labels = _find(folder, "train-images-idx3-ubyte"), _find(folder, "train-labels-idx1-ubyte")
    if images and labels:
        x, y = _idx_pair(images, labels)
        name = f"MNIST files in {folder}"
    else:
        try:
            from datasets import load_from_disk
        except ImportError as exc:  # pragma: no cover - datasets is a dependency
            raise InputError("reading a saved data set needs the `datasets` package") from exc
        try:
            ds = load_from_disk(str(folder))
        except Exception as exc:
            raise InputError(f"{folder}: neither raw MNIST files (train-images-idx3-ubyte, "
                             f"train-labels-idx1-ubyte) nor a datasets.save_to_disk folder ({exc})") from exc
        if hasattr(ds, "keys"):
            ds = ds["train"] if "train" in ds else ds[next(iter(ds.keys()))]
        image_col = next((c for c in ("image", "img", "pixels") if c in ds.column_names), None)
        label_col = next((c for c in ("label", "labels") if c in ds.column_names), None)
        if image_col is None or label_col is None:
            raise InputError(f"{folder}: needs an image column (image/img/pixels) and a label column, "
                             f"has {ds.column_names}")
        if max_examples:
            ds = ds.select(range(min(max_examples, len(ds))))
        x = np.stack([np.asarray(im, dtype=np.float64) for im in ds[image_col]])
        y = np.asarray(ds[label_col], dtype=np.int64)
        name = f"saved data set {folder}"
    if x.ndim == 4 and x.shape[-1] in (1, 3):
        x = x.mean(-1)  # colour -> grey
    if x.ndim != 3 or x.shape[0] != y.shape[0] or y.min() < 0:
        raise InputError(f"{folder}: expected (N, H, W) images and N non-negative labels, got {x.shape}, {y.shape}")
    if max_examples:
        x, y = x[:max_examples], y[:max_examples]
    if x.shape[1] % 2 or x.shape[2] % 2:
        x = x[:, : x.shape[1] // 2 * 2, : x.shape[2] // 2 * 2]
    return x, y, name


def load_images(data: str | None = None, *, seed: int = 0, test_fraction: float = 0.3,
                max_examples: int | None = None) -> ImageSet:
    """Bundled 8x8 digits (``data=None``) or a local folder: raw MNIST IDX files (train-*, and t10k-* as the
    test set when present, gzip or not) or a ``save_to_disk`` set; without a test set, ``test_fraction`` is held out."""
    if data is None:
        try:
            from sklearn.datasets import load_digits
        except ImportError as exc:
            raise InputError("the default data set needs scikit-learn: pip install scikit-learn (the fidelity "
                             "extra of kfca-llm)") from exc
        digits = load_digits()
        x, y, name = digits.images, digits.target, "scikit-learn digits (8x8)"
        if max_examples:
            x, y = x[:max_examples], y[:max_examples]
    else:
        folder = Path(data)
        if not folder.is_dir():
            raise InputError(f"--data {data}: not a folder")
        x, y, name = _load_folder(folder, max_examples)
        test = _find(folder, "t10k-images-idx3-ubyte"), _find(folder, "t10k-labels-idx1-ubyte")
        if all(test) and name.startswith("MNIST"):
            # MNIST's own test set: the training files are the pool the clients are drawn from
            tx, ty = _idx_pair(*test)
            tx, ty = tx[:max_examples or None], ty[:max_examples or None]
            if tx.shape[1:] != x.shape[1:]:
                raise InputError(f"{folder}: test images {tx.shape[1:]} differ from training images {x.shape[1:]}")
            train_x, test_x = _standardise(x, tx)
            return ImageSet(train_x, y, test_x, ty, int(max(y.max(), ty.max())) + 1, name + " (t10k as test set)")
    return _split(x, y, test_fraction, seed, name)


def _group(client: int) -> int:
    return client // 2


def _balanced_split(y: np.ndarray, sizes: list[int], rng: np.random.Generator) -> list[np.ndarray]:
    """Index sets of the given sizes, each balanced across labels (stratified dealing)."""
    order = rng.permutation(len(y))
    order = order[np.argsort(y[order], kind="stable")]
    interleaved = np.empty(len(y), dtype=np.int64)
    counts = np.bincount(y)
    # position of each example within its label, spread so that consecutive picks cycle over labels
    rank = np.concatenate([np.arange(c) for c in counts if c]) / np.repeat(counts[counts > 0], counts[counts > 0])
    interleaved[:] = order[np.argsort(rank, kind="stable")]
    out, start = [], 0
    for s in sizes:
        out.append(interleaved[start:start + s])
        start += s
    return out


def _skewed_split(y: np.ndarray, clients, size: int, num_classes: int, rng) -> list[np.ndarray]:
    """Per client in ``clients`` (indices: they pick the favourite digits), ``size`` examples drawn without
    replacement from shared pools, ``SKEW_SHARE`` of them from the client's group's two digits."""
    pools = [list(rng.permutation(np.flatnonzero(y == c))) for c in range(num_classes)]
    out = []
    for client in clients:
        k = _group(client)
        favourite = [(2 * k + 1) % num_classes, (2 * k + 2) % num_classes]
        others = [c for c in range(num_classes) if c not in favourite]
        n_fav = int(round(SKEW_SHARE * size))
        wanted = [favourite[j % 2] for j in range(n_fav)] + [others[j % len(others)] for j in range(size - n_fav)]
        picked = []
        for label in wanted:
            # a pool that runs dry is replaced by the fullest one (only with few examples per label)
            pool = pools[label] if pools[label] else max(pools, key=len)
            picked.append(pool.pop())
        out.append(np.array(picked, dtype=np.int64))
    return out


def silo_split(y: np.ndarray, n: int, case: str, num_classes: int, rng: np.random.Generator,
               client_size: int = PAPER_CLIENT_SIZE) -> list[np.ndarray]:
    """The paper's protocol: the pool in n/2 equal silos, clients 2k and 2k+1 drawn from silo k.

    Each client draws ``min(client_size, silo size)`` examples of its silo on its own (the two clients of
    a silo overlap where they need more than half of it), balanced across labels, or 80% from its
    group's two digits in the label-skew case (as far as the silo has them).
    """
    if n % 2:
        raise InputError(f"the silo protocol pairs clients: need an even number of clients, got {n}")
    silos = np.array_split(rng.permutation(len(y)), n // 2)
    parts = []
    for client in range(n):
        silo = silos[_group(client)]
        size = min(client_size, silo.size)
        if case == "label_skew":
            pick = _skewed_split(y[silo], [client], size, num_classes, rng)[0]
        else:
            pick = _balanced_split(y[silo], [size], rng)[0]
        parts.append(silo[pick])
    return parts


def make_clients(images: ImageSet, case: str, n: int, seed: int, protocol: str = "split") -> list[ClientData]:
    """The ``n`` clients' training data for ``case`` (one of ``CASES``).

    ``protocol="split"``: the pool is dealt to the clients (disjoint, equal shares, 90% of a share in the
    label-skew case); ``"silos"``: the paper's MNIST protocol (``silo_split``). Size skew deals 10-30% of
    the pool per pair under both (the paper's size ratios cannot come from equal silos).
    """
    if protocol not in PROTOCOLS:
        raise InputError(f"unknown protocol {protocol!r}; choose from {', '.join(PROTOCOLS)}")
    if case not in CASES:
        raise InputError(f"unknown case {case!r}; choose from {', '.join(CASES)}")
    if n < 2:
        raise InputError(f"need at least two clients, got {n}")
    # the split depends on the seed only, so the noise cases are the iid split plus their noise
    rng = np.random.default_rng(seed)
    y = images.train_y
    equal = len(y) // n
    if equal < 8:
        raise InputError(f"{len(y)} training examples are too few for {n} clients")
    if protocol == "silos" and case != "size_skew":
        parts = silo_split(y, n, case, images.num_classes, rng)
    elif case == "label_skew":
        parts = _skewed_split(y, range(n), int(equal * 0.9), images.num_classes, rng)
    elif case == "size_skew":
        share = np.array([SIZE_BASE + SIZE_STEP * _group(c) for c in range(n)])
        sizes = np.maximum(np.floor(share / share.sum() * len(y)).astype(int), 8)
        parts = _balanced_split(y, sizes.tolist(), rng)
    else:
        parts = _balanced_split(y, [equal] * n, rng)
    rng = np.random.default_rng([seed, CASES.index(case)])
    clients = []
    for c, idx in enumerate(parts):
        x = images.train_x[idx].copy()
        labels = y[idx].copy()
        chosen = np.zeros(len(idx), dtype=bool)
        chosen[rng.permutation(len(idx))[:int(round(LEVEL_STEP * _group(c) * len(idx)))]] = True
        if case == "label_noise":
            labels[chosen] = (labels[chosen] + rng.integers(1, images.num_classes, chosen.sum())) % images.num_classes
        elif case == "feature_noise":
            x[chosen] += rng.normal(0.0, FEATURE_NOISE_STD, x[chosen].shape).astype(np.float32)
        clients.append(ClientData(torch.from_numpy(x[:, None]), torch.from_numpy(labels)))
    return clients
