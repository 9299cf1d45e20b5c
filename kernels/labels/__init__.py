"""KFCA-D's counts: labels of a shared data set (one task per example), [clients, tasks] small integers.

Joint label tables and bonus agreements per ordered pair, label histograms on M_1 and M_2 (the
expected penalty), matches of the sampled draws, and all-pairs disagreements (copy detection).

``reference.py`` (numpy, the definition), ``cpu.py`` (numba). No GPU implementation: labels are
small next to adapter updates.
"""
