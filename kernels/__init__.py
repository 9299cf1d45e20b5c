"""Every compute kernel of the project, installed as ``kfca_llm.kernels``: one folder per operation.

``sign_pack/``, ``pair_counts/``, ``stratum_counts/``, ``sampled_penalty/`` and ``labels/`` each hold the numpy reference
(``reference.py``), the numba CPU kernel (``cpu.py``) and, where there is one, the Triton kernel
(``triton.py``) side by side; they agree bit for bit (``tests/kernels/``). ``intrinsics/`` holds what
the kernels of one family share (the partition hash, popcount), ``numba_setup.py`` the numba settings.
Kernels take raw buffers, integers and keys and return integers; they import nothing of ``kfca_llm``
but its contract (``partition``, ``errors``). The backends of ``kfca_llm.engine`` launch them.

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
