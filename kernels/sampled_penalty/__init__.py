"""The sampled penalty (the paper's Algorithm 1): per ordered pair, matches of one (p1, p2) draw per bonus task.

The draws are regenerated from counters (``kfca_llm.partition``: ranks into M_1 and M_2 hashed from
the bonus task and the pair's key), so every implementation counts the same draws.

``reference.py`` (numpy, the definition), ``cpu.py`` (numba), ``triton.py`` (GPU). Both compiled
implementations can compact each client's signs on M_1 and M_2 into bitstreams ("planes") and draw per
pair; the GPU one also draws once for all pairs whose keys agree above the coordinates' span
(``triton_per_pair.py``, ``triton_shared.py``, both from the sets of ``triton_sets.py``).
"""
