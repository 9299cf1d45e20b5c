"""Triton kernels, installed as ``kfca_llm.kernels``: sign packing and popcount agreement.

This folder is never a top-level ``kernels`` package: that name belongs to Hugging Face's
``kernels``, which transformers and bitsandbytes import. When Python runs from the repository root
(``python -m ...`` puts it on ``sys.path``), ``import kernels`` would land here: hand it on to the
real package when one is installed. Without one, this stays an empty module with no version, which
transformers' probe reads as "not available" and from which bitsandbytes' ``get_kernel`` import
fails as it would without the package.
"""

if __name__ == "kernels":
    import importlib.machinery
    import importlib.util
    import os
    import sys

    _root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    _path = [p for p in sys.path if os.path.abspath(p or os.curdir) != _root]
    _spec = importlib.machinery.PathFinder.find_spec("kernels", _path)
    if _spec is not None:
        _module = importlib.util.module_from_spec(_spec)
        sys.modules["kernels"] = _module
        _spec.loader.exec_module(_module)
