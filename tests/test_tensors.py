"""kfca_llm.tensors: the one float check of the packer and the Flower strategy."""

from __future__ import annotations

import numpy as np
import torch

from kfca_llm.tensors import is_float


def test_is_float_accepts_float_tensors_and_arrays_only():
    for values in (torch.zeros(2), torch.zeros(2, dtype=torch.bfloat16), np.zeros(2, dtype=np.float16)):
        assert is_float(values)
    for values in (torch.zeros(2, dtype=torch.int32), torch.zeros(2, dtype=torch.bool), np.zeros(2, dtype=np.int64),
                   np.zeros(2, dtype=np.complex64), [0.5, 1.5], 0.5):
        assert not is_float(values)
