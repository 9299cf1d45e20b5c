"""Triton kernels (installed as kfca_llm.kernels): sign packing and popcount agreement."""
