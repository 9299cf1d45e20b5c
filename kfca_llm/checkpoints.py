"""Reading clients' adapter files: safetensors only, headers validated before any tensor is read.

Adapter files come from clients and are untrusted: pickled formats (``adapter_model.bin``,
``.pt``) are refused, never unpickled. Tensors are read lazily, one at a time.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from safetensors import safe_open

from .errors import InputError

ADAPTER_FILE = "adapter_model.safetensors"
_FLOAT_DTYPES = {"F16", "BF16", "F32", "F64"}


@dataclass(frozen=True)
class AdapterFile:
    client: str
    path: Path
    shapes: dict[str, tuple[int, ...]]


def resolve_adapter_path(path: str | os.PathLike, client: str) -> Path:
    """A PEFT adapter directory (its adapter_model.safetensors) or a .safetensors file."""
    p = Path(path)
    if p.is_dir():
        candidate = p / ADAPTER_FILE
        if candidate.is_file():
            return candidate
        if (p / "adapter_model.bin").exists():
            raise InputError(f"{p} holds only a pickled adapter_model.bin; pickled files are refused: "
                             "save adapters with safetensors (PEFT's default)", client=client)
        raise InputError(f"no {ADAPTER_FILE} in directory {p}", client=client)
    if not p.exists():
        raise InputError(f"path {p} does not exist", client=client)
    return p


def open_adapter(path: str | os.PathLike, client: str) -> AdapterFile:
    """Validate the header of one adapter file: safetensors, non-empty, float tensors only."""
    file = resolve_adapter_path(path, client)
    try:
        with safe_open(str(file), framework="pt") as handle:
            shapes = {}
            for name in handle.keys():
                view = handle.get_slice(name)
                dtype = view.get_dtype()
                if dtype not in _FLOAT_DTYPES:
                    raise InputError(f"dtype {dtype} is not a floating-point type", client=client, tensor=name)
                shapes[name] = tuple(view.get_shape())
    except InputError:
        raise
    except Exception as exc:  # safetensors raises several types for a bad header
        raise InputError(f"{file} is not a readable safetensors file ({exc})", client=client) from None
    if not shapes:
        raise InputError(f"{file} holds no tensors (empty update)", client=client)
    return AdapterFile(client, file, shapes)


def client_paths(paths: Sequence[str | os.PathLike] | Mapping[str, str | os.PathLike]) -> dict[str, Path]:
    """Client id -> path; a sequence takes ids from the directory or file names."""
    if isinstance(paths, Mapping):
        return {str(k): Path(v) for k, v in paths.items()}
    out: dict[str, Path] = {}
    for path in paths:
        p = Path(path)
        client = p.name if p.is_dir() or not p.suffix == ".safetensors" else p.stem
        if client in out:
            raise InputError(f"two paths give the same client id {client!r}; pass a mapping id -> path")
        out[client] = p
    return out


def check_same_tensors(files: Sequence[AdapterFile], reference: AdapterFile | None) -> dict[str, tuple[int, ...]]:
    """The shared name -> shape map; any client whose tensors differ is named in the error."""
    base = reference or files[0]
    for f in files:
        if f is base:
            continue
        for name in sorted(set(base.shapes) - set(f.shapes)):
            raise InputError(f"tensor missing (present in {base.client!r})", client=f.client, tensor=name)
        for name in sorted(set(f.shapes) - set(base.shapes)):
            raise InputError(f"unexpected tensor (absent from {base.client!r})", client=f.client, tensor=name)
        for name, shape in f.shapes.items():
            if shape != base.shapes[name]:
                raise InputError(f"shape {shape} differs from {base.shapes[name]} in {base.client!r}",
                                 client=f.client, tensor=name)
    return dict(base.shapes)
