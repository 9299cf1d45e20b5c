"""GPU check of the stratum counts (issue 43): the compiled Triton kernel against the numpy reference, bit for bit,
and its time against the Gram counts' kernel on the same words (CUDA events, best of 20). Imports only the kernels
(a bare ``kfca_llm`` package: the device image has torch, triton and numba but not the project's other needs)."""

import os
import sys
import time
import types

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pkg = types.ModuleType("kfca_llm")
pkg.__path__ = [os.path.join(root, "kfca_llm")]
sys.modules["kfca_llm"] = pkg
kernels = types.ModuleType("kfca_llm.kernels")
kernels.__path__ = [os.path.join(root, "kernels")]
sys.modules["kfca_llm.kernels"] = kernels

import numpy as np  # noqa: E402
import torch  # noqa: E402

from kfca_llm.kernels.pair_counts.triton import binary_gram  # noqa: E402
from kfca_llm.kernels.stratum_counts import reference  # noqa: E402
from kfca_llm.kernels.stratum_counts.triton import stratum_counts  # noqa: E402
from kfca_llm.partition import partition_params  # noqa: E402

rng = np.random.default_rng(0)


def words(n, w, p):
    task = rng.integers(-2**31, 2**31, size=w, dtype=np.int64).astype(np.int32)
    signs = rng.integers(-2**31, 2**31, size=(n, w), dtype=np.int64).astype(np.int32) & task
    planes = rng.integers(-2**31, 2**31, size=(p, w), dtype=np.int64).astype(np.int32)
    return signs, task, planes


for n, w, p in ((3, 1001, 2), (9, 4097, 4), (20, 20001, 3)):
    s, t, pl = words(n, w, p)
    ref = reference.stratum_counts(s, t, pl, 7, 0.5)
    got = stratum_counts(*(torch.from_numpy(a).cuda() for a in (s, t, pl)), *partition_params(7, 0.5))
    same = all(np.array_equal(g.cpu().numpy(), r) for g, r in zip(got, ref))
    print(f"bit-identical n={n} words={w} planes={p}: {same}", flush=True)
    assert same

for n in (12, 100):
    w = 40_000_000 // 32  # a 40M-coordinate adapter
    s, t, pl = (torch.from_numpy(a).cuda() for a in words(n, w, 4))
    params = partition_params(3, 0.5)

    def best(fn):
        fn()
        torch.cuda.synchronize()
        times = []
        for _ in range(20):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            torch.cuda.synchronize()
            times.append(a.elapsed_time(b))
        return min(times)

    gram = best(lambda: binary_gram(s, t, *params))
    strata = best(lambda: stratum_counts(s, t, pl, *params))
    print(f"{n} clients, 40M coordinates, 16 strata: gram {gram:.3f} ms, strata {strata:.3f} ms, "
          f"ratio {strata / gram:.2f}", flush=True)
