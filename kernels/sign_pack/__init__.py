"""Sign packing: float updates -> sign words, task (non-zero) words and non-finite flags.

Element ``e`` of a tensor is bit ``e % 32`` of word ``word_offset + e // 32``: the sign plane (the
client's row) has it set where the value is ``< 0`` (-0.0 and NaN are not negative); the task plane,
shared by all clients, is OR-ed with the non-zero bits; a tensor holding NaN or Inf is flagged.

``reference.py`` (numpy, the definition), ``cpu.py`` (numba: a whole round in one pass),
``triton.py`` (GPU, or CPU tensors under ``TRITON_INTERPRET=1``).
"""
