"""Triton kernels, installed as ``kfca_llm.kernels``: sign packing and popcount agreement.

This folder is never a top-level ``kernels`` package: that name belongs to Hugging Face's
``kernels``, which transformers and bitsandbytes import. When Python runs from the repository root
(``python -m ...`` puts it on ``sys.path``), ``import kernels`` would land here; hand it on to the
real package instead, or fail exactly as if this folder did not exist.
"""

if __name__ == "kernels":
    import importlib.machinery
    import importlib.util
    import os
    import sys

    _root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    _path = [p for p in sys.path if os.path.abspath(p or os.curdir) != _root]
    _spec = importlib.machinery.PathFinder.find_spec("kernels", _path)
    if _spec is None:
        del sys.modules["kernels"]
        raise ModuleNotFoundError("No module named 'kernels'", name="kernels")
    _module = importlib.util.module_from_spec(_spec)
    sys.modules["kernels"] = _module
    _spec.loader.exec_module(_module)
