"""Pair counts: the binary Gram matrices ``popcount(s_i & s_j & set)`` per task set (bonus, M_1, M_2).

Every reward of the "expected" penalty, and the bonus agreements of the "sampled" one, are built from
these integers (``kfca_llm.engine.stats``). The task set of a coordinate is hashed on the fly from
the partition key and thresholds (``kfca_llm.partition``).

``reference.py`` (numpy, the definition), ``cpu.py`` (numba: the diagonal and the listed pairs),
``triton.py`` (GPU: every pair, tiled).
"""
