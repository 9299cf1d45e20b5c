"""The fidelity experiment's federation: small image CNNs whose every coalition can be trained at once.

The models (a 3x3 stride-2 CNN for small images, the paper's 21,840-parameter CNN for 28x28 MNIST)
are written on *stacked* parameters:
every tensor has a leading coalition axis K, and the K models share each batch, so one forward and
backward pass trains K models (the loss is the sum of the K models' mean losses, so each model gets
exactly its own gradient). ``train_coalitions`` runs FedAvg for any list of coalitions from the
same initialisation and seeds: in round t, client c trains every coalition containing it on the same
batches, and each coalition averages its members' local models weighted by their examples.
``run_federation`` is the real run (the grand coalition) and records what a server sees.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from ..errors import InputError

PARAM_NAMES = ("conv_weight", "conv_bias", "head_weight", "head_bias")


@dataclass(frozen=True)
class FederationConfig:
    """FedAvg and model settings (the defaults suit 8x8 digits)."""

    rounds: int = 10
    local_epochs: int = 1
    batch_size: int = 32
    learning_rate: float = 0.1
    channels: int = 8
    seed: int = 0


@dataclass(frozen=True)
class ClientData:
    x: torch.Tensor
    """float32 (m, 1, H, W) images."""
    y: torch.Tensor
    """int64 (m,) labels."""


@dataclass(frozen=True)
class FederationRecord:
    """What the server sees in the real run: per round the global model and every client's update."""

    globals: list[torch.Tensor]
    """flat (P,) global parameters before each round."""
    updates: list[torch.Tensor]
    """(n, P) per round: client i's local model minus that round's global model."""
    final: torch.Tensor
    """flat (P,) global parameters after the last round."""
    num_examples: np.ndarray
    """int64 (n,) examples per client (the FedAvg weights)."""

    def public_steps(self, t: int, count: int) -> list[torch.Tensor]:
        """The newest ``count`` (at most) of the global's steps the server had made before round t, oldest first:
        step s = the global sent in round s minus the one sent in round s - 1 (none before round 1)."""
        return [self.globals[s] - self.globals[s - 1] for s in range(max(1, t - count + 1), t + 1)] if count else []


class StackedCNN:
    """Shapes of the CNN for ``image_shape`` (H, W) and ``num_classes``; forward on stacked parameters."""

    def __init__(self, image_shape: tuple[int, int], num_classes: int, channels: int):
        h, w = image_shape
        if h % 2 or w % 2:
            raise InputError(f"images must have even height and width, got {image_shape}")
        self.image_shape, self.num_classes, self.channels = (h, w), num_classes, channels
        features = channels * (h // 2) * (w // 2)
        self.shapes = {"conv_weight": (9, channels), "conv_bias": (channels,),
                       "head_weight": (features, num_classes), "head_bias": (num_classes,)}
        self.sizes = {k: int(np.prod(s)) for k, s in self.shapes.items()}
        self.num_parameters = sum(self.sizes.values())

    def init(self, seed: int) -> torch.Tensor:
        """Flat (P,) initial parameters (uniform fan-in init, as torch's Conv2d / Linear)."""
        g = torch.Generator().manual_seed(seed)
        parts = []
        for name in PARAM_NAMES:
            fan_in = 9 if name.startswith("conv") else self.shapes["head_weight"][0]
            bound = 1.0 / np.sqrt(fan_in)
            parts.append((torch.rand(self.sizes[name], generator=g) * 2 - 1) * bound)
        return torch.cat(parts)

    def unflatten(self, flat: torch.Tensor) -> dict[str, torch.Tensor]:
        """(K, P) -> stacked parameter views with a leading K axis."""
        out, start = {}, 0
        for name in PARAM_NAMES:
            out[name] = flat[:, start:start + self.sizes[name]].reshape(flat.shape[0], *self.shapes[name])
            start += self.sizes[name]
        return out

    def patches(self, x: torch.Tensor) -> torch.Tensor:
        """(B, 1, H, W) images -> their (B * H/2 * W/2, 9) convolution patches (reusable across calls)."""
        return F.unfold(x, 3, padding=1, stride=2).transpose(1, 2).reshape(-1, 9)

    def logits(self, flat: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """(K, P) parameters, (B, 1, H, W) images or their ``patches`` -> (K, B, num_classes) logits."""
        p = self.unflatten(flat)
        patches = self.patches(x) if x.ndim == 4 else x
        positions = (self.image_shape[0] // 2) * (self.image_shape[1] // 2)
        k, b = flat.shape[0], patches.shape[0] // positions
        # the patches are shared by the K models; one matmul convolves all of them and leaves the
        # output as (K, B, positions * channels), ready for the head without a copy
        conv = torch.relu(torch.matmul(patches, p["conv_weight"]) + p["conv_bias"][:, None, :])
        return torch.baddbmm(p["head_bias"][:, None, :], conv.reshape(k, b, -1), p["head_weight"])


class StackedMnistCNN:
    """The paper's CNN for 28x28 MNIST (21,840 parameters) on stacked parameters.

    conv 5x5 1->10, max-pool 2, ReLU, conv 5x5 10->20, max-pool 2, ReLU, linear 320->50, ReLU, linear
    50->10: the common PyTorch MNIST CNN. Its two dropout layers are left out, so that every coalition's
    training stays deterministic and equal to a separate run. The second convolution runs as one
    grouped convolution over the K models.
    """

    eval_batch = 500  # test images per forward pass in ``accuracy`` (the activations of 16 models fit)

    def __init__(self, image_shape: tuple[int, int] = (28, 28), num_classes: int = 10):
        if tuple(image_shape) != (28, 28):
            raise InputError(f"the paper's CNN takes 28x28 images, got {image_shape}")
        self.image_shape, self.num_classes = (28, 28), num_classes
        self.shapes = {"conv1_weight": (10, 1, 5, 5), "conv1_bias": (10,), "conv2_weight": (20, 10, 5, 5),
                       "conv2_bias": (20,), "fc1_weight": (320, 50), "fc1_bias": (50,),
                       "fc2_weight": (50, num_classes), "fc2_bias": (num_classes,)}
        self.sizes = {k: int(np.prod(v)) for k, v in self.shapes.items()}
        self.num_parameters = sum(self.sizes.values())

    def init(self, seed: int) -> torch.Tensor:
        """Flat (P,) initial parameters (uniform fan-in init, as torch's Conv2d / Linear)."""
        g = torch.Generator().manual_seed(seed)
        fan_in = {"conv1": 25, "conv2": 250, "fc1": 320, "fc2": 50}
        return torch.cat([(torch.rand(self.sizes[k], generator=g) * 2 - 1) / np.sqrt(fan_in[k.split("_")[0]])
                          for k in self.shapes])

    def unflatten(self, flat: torch.Tensor) -> dict[str, torch.Tensor]:
        out, start = {}, 0
        for name, shape in self.shapes.items():
            out[name] = flat[:, start:start + self.sizes[name]].reshape(flat.shape[0], *shape)
            start += self.sizes[name]
        return out

    def patches(self, x: torch.Tensor) -> torch.Tensor:
        return x  # the convolutions read the images themselves

    def logits(self, flat: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """(K, P) parameters, (B, 1, 28, 28) images -> (K, B, num_classes) logits."""
        p = self.unflatten(flat)
        k, b = flat.shape[0], x.shape[0]
        h = F.conv2d(x, p["conv1_weight"].reshape(k * 10, 1, 5, 5), p["conv1_bias"].reshape(-1))  # (B, K*10, 24, 24)
        h = torch.relu(F.max_pool2d(h, 2))
        h = F.conv2d(h, p["conv2_weight"].reshape(k * 20, 10, 5, 5), p["conv2_bias"].reshape(-1), groups=k)
        h = torch.relu(F.max_pool2d(h, 2)).reshape(b, k, 320).transpose(0, 1)  # (K, B, 320)
        h = torch.relu(torch.baddbmm(p["fc1_bias"][:, None, :], h, p["fc1_weight"]))
        return torch.baddbmm(p["fc2_bias"][:, None, :], h, p["fc2_weight"])


StackedModel = StackedCNN | StackedMnistCNN


def model_for(image_shape: tuple[int, int], num_classes: int, channels: int) -> StackedModel:
    """The paper's MNIST CNN for 28x28 images, the small stacked CNN otherwise."""
    if tuple(image_shape) == (28, 28):
        return StackedMnistCNN(image_shape, num_classes)
    return StackedCNN(image_shape, num_classes, channels)


def client_batches(num_examples: int, cfg: FederationConfig, round_index: int, client: int) -> list[torch.Tensor]:
    """The client's mini-batches in a round: the same for every coalition (seeded by seed, round, client)."""
    g = torch.Generator().manual_seed(cfg.seed * 1_000_003 + round_index * 1009 + client)
    batches = []
    for _ in range(cfg.local_epochs):
        order = torch.randperm(num_examples, generator=g)
        batches += list(order.split(cfg.batch_size))
    return batches


def local_training(model: StackedModel, flat: torch.Tensor, data: ClientData, batches, lr: float) -> torch.Tensor:
    """Plain SGD of K stacked models on one client's batches; returns the (K, P) local models."""
    params = flat.clone().requires_grad_(True)
    k = flat.shape[0]
    for idx in batches:
        logits = model.logits(params, data.x[idx])
        loss = F.cross_entropy(logits.reshape(-1, model.num_classes), data.y[idx].repeat(k), reduction="sum")
        (grad,) = torch.autograd.grad(loss / idx.numel(), params)
        with torch.no_grad():
            params -= lr * grad
    return params.detach()


def coalition_matrix(masks: np.ndarray, n: int) -> np.ndarray:
    """bool (K, n): member[k, i] = client i is in coalition ``masks[k]`` (bit i)."""
    masks = np.asarray(masks, dtype=np.int64)
    if masks.ndim != 1 or np.any(masks <= 0) or np.any(masks >= 1 << n):
        raise InputError(f"coalition masks must be non-empty subsets of {n} clients")
    return (masks[:, None] >> np.arange(n)[None, :] & 1).astype(bool)


def fedavg_weights(member: np.ndarray, num_examples: np.ndarray) -> torch.Tensor:
    """float32 (K, n): |D_i| / |D_S| for the members of each coalition, 0 elsewhere."""
    sizes = member * num_examples[None, :].astype(np.float64)
    return torch.from_numpy(sizes / sizes.sum(axis=1, keepdims=True)).float()


def train_coalitions(model: StackedModel, clients: list[ClientData], init: torch.Tensor, masks,
                     cfg: FederationConfig) -> torch.Tensor:
    """FedAvg run on each coalition alone (same init and batches); returns the final (K, P) models."""
    n = len(clients)
    member = coalition_matrix(masks, n)
    weights = fedavg_weights(member, np.array([c.y.numel() for c in clients]))
    flat = init[None, :].repeat(member.shape[0], 1)
    for t in range(cfg.rounds):
        new = torch.zeros_like(flat)
        for c, data in enumerate(clients):
            rows = torch.from_numpy(np.flatnonzero(member[:, c]))
            if rows.numel() == 0:
                continue
            # round 0: every coalition starts from init, so the client's local model is the same for all
            start = flat[rows[:1]] if t == 0 else flat[rows]
            local = local_training(model, start, data, client_batches(data.y.numel(), cfg, t, c),
                                   cfg.learning_rate)
            new.index_add_(0, rows, local * weights[rows, c, None])
        flat = new
    return flat


def run_federation(model: StackedModel, clients: list[ClientData], init: torch.Tensor,
                   cfg: FederationConfig) -> FederationRecord:
    """The real FedAvg run of all clients, recording the global model and the updates of every round."""
    sizes = np.array([c.y.numel() for c in clients], dtype=np.int64)
    weights = torch.from_numpy(sizes / sizes.sum()).float()
    flat, globals_, updates = init.clone(), [], []
    for t in range(cfg.rounds):
        local = torch.cat([local_training(model, flat[None], data, client_batches(data.y.numel(), cfg, t, c),
                                          cfg.learning_rate) for c, data in enumerate(clients)])
        globals_.append(flat)
        updates.append(local - flat[None])
        flat = flat + weights @ updates[-1]
    return FederationRecord(globals_, updates, flat, sizes)


def _eval_batches(model, x: torch.Tensor) -> list[torch.Tensor]:
    """The test inputs in slices of ``model.eval_batch`` images (all at once when the model has none)."""
    size = getattr(model, "eval_batch", None)
    return list(x.split(size)) if size else [x]


@torch.no_grad()
def accuracy(model: StackedModel, flat: torch.Tensor, x: torch.Tensor, y: torch.Tensor, chunk: int = 16) -> np.ndarray:
    """float64 (K,) test accuracy of each of the K stacked models on images or patches ``x``.

    ``chunk`` models at a time: 16 was ~3x faster than 64 or 256 here (the activations stay in cache).
    """
    if x.ndim == 4:
        x = model.patches(x)
    out = []
    for part in flat.split(chunk):
        correct = sum((model.logits(part, xs).argmax(-1) == ys[None]).sum(-1)
                      for xs, ys in zip(_eval_batches(model, x), _eval_batches(model, y)))
        out.append(correct.float() / y.numel())  # float32, as the mean of 0/1 it replaces
    return torch.cat(out).double().numpy()


@torch.no_grad()
def predictions(model: StackedModel, flat: torch.Tensor, x: torch.Tensor) -> np.ndarray:
    """int64 (K, B) predicted labels of each stacked model."""
    return torch.cat([model.logits(flat, xs).argmax(-1) for xs in _eval_batches(model, x)], dim=1).numpy()
