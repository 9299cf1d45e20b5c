"""What the project passes around as tensors: the state dict of an adapter or an update, and the float check.

Light on purpose: torch is not imported here, so ``attacks`` (which a recipe imports to validate its
attack specs) stays light.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import torch

StateDict = dict[str, "torch.Tensor"]
"""Tensors by name: an adapter's weights, or a client's update of them."""


def is_float(values) -> bool:
    """Whether ``values`` is a torch tensor or a numpy array of floating-point numbers."""
    if isinstance(values, np.ndarray):
        return np.issubdtype(values.dtype, np.floating)
    torch = sys.modules.get("torch")  # a tensor exists only once torch is imported
    return torch is not None and isinstance(values, torch.Tensor) and values.is_floating_point()
