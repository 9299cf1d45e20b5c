"""Reading clients' adapter files: safetensors only, headers validated before any tensor is read.

Adapter files come from clients and are untrusted: pickled formats (``adapter_model.bin``,
``.pt``) are refused, never unpickled. The safetensors header (8-byte little-endian length, a JSON
object of name -> dtype, shape, data_offsets) is parsed and checked here: every byte range must lie
inside the file, match its dtype and shape, and not overlap another. Tensors are then read one at a
time with ``readinto`` rather than through a memory map, so a scoring pass over many large files
holds only the tensor at hand in memory (a mapped file's touched pages stay resident).
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .errors import InputError

ADAPTER_FILE = "adapter_model.safetensors"
MAX_HEADER_BYTES = 100 << 20
# A rank-64 LoRA + DoRA on every linear of a 70B model declares about 3,000 tensors.
MAX_TENSORS = 100_000
_FLOAT_DTYPES = {"F16": torch.float16, "BF16": torch.bfloat16, "F32": torch.float32, "F64": torch.float64}
_ALL_DTYPE_SIZES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "I16": 2, "U16": 2, "F16": 2,
                    "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8}


@dataclass(frozen=True)
class TensorEntry:
    dtype: torch.dtype
    shape: tuple[int, ...]
    start: int
    """Absolute byte offset in the file."""
    nbytes: int


@dataclass(frozen=True)
class AdapterFile:
    client: str
    path: Path
    entries: dict[str, TensorEntry]
    shapes: dict[str, tuple[int, ...]] = field(init=False, repr=False)

    def __post_init__(self):
        object.__setattr__(self, "shapes", {name: e.shape for name, e in self.entries.items()})

    def read(self, handle, name: str) -> torch.Tensor:
        """Read one tensor from an open binary handle of this file."""
        entry = self.entries[name]
        tensor = torch.empty(entry.shape, dtype=entry.dtype)
        self.read_into(handle, name, memoryview(tensor.view(torch.uint8).numpy().reshape(-1)) if entry.nbytes
                       else memoryview(b""))
        return tensor

    def read_into(self, handle, name: str, target: memoryview) -> None:
        """Read one tensor's bytes into ``target`` (exactly its ``nbytes``), e.g. its place in a flat buffer."""
        entry = self.entries[name]
        handle.seek(entry.start)
        if handle.readinto(target) != entry.nbytes:
            raise InputError("file ended inside the tensor's data", client=self.client, tensor=name)

    @property
    def dtype(self) -> torch.dtype | None:
        """The one dtype of all its tensors, or None when they mix dtypes."""
        dtypes = {e.dtype for e in self.entries.values()}
        return dtypes.pop() if len(dtypes) == 1 else None


def resolve_adapter_path(path: str | os.PathLike, client: str) -> Path:
    """A PEFT adapter directory (its adapter_model.safetensors) or a .safetensors file."""
    p = Path(path)
    if p.is_dir():
        candidate = p / ADAPTER_FILE
        if candidate.exists():
            return _regular_file(candidate, client)
        if (p / "adapter_model.bin").exists():
            raise InputError(f"{p} holds only a pickled adapter_model.bin; pickled files are refused: "
                             "save adapters with safetensors (PEFT's default)", client=client)
        raise InputError(f"no {ADAPTER_FILE} in directory {p}", client=client)
    if not p.exists():
        raise InputError(f"path {p} does not exist", client=client)
    return _regular_file(p, client)


def _regular_file(path: Path, client: str) -> Path:
    """Refuse FIFOs, devices and sockets before opening them (reading a FIFO blocks forever)."""
    if not stat.S_ISREG(path.stat().st_mode):
        raise InputError(f"{path} is not a regular file", client=client)
    return path


def open_adapter(path: str | os.PathLike, client: str) -> AdapterFile:
    """Parse and validate one adapter file's header: non-empty, float tensors, sound byte ranges."""
    file = resolve_adapter_path(path, client)

    def bad(message: str, tensor: str | None = None) -> InputError:
        return InputError(f"{file} is not a valid safetensors file: {message}", client=client, tensor=tensor)

    size = file.stat().st_size
    with open(file, "rb") as handle:
        head = handle.read(8)
        if len(head) < 8:
            raise bad("shorter than its 8-byte header length")
        header_len = int.from_bytes(head, "little")
        if header_len > min(MAX_HEADER_BYTES, size - 8):
            raise bad(f"header length {header_len} exceeds the file or {MAX_HEADER_BYTES} bytes")
        try:
            header = json.loads(handle.read(header_len).decode("utf-8"))
        except RecursionError:
            raise bad("header JSON is nested too deeply") from None
        except ValueError as exc:  # also UnicodeDecodeError and integers beyond Python's digit limit
            raise bad(f"header is not JSON ({exc})") from None
    if not isinstance(header, dict):
        raise bad("header is not a JSON object")
    header.pop("__metadata__", None)
    if len(header) > MAX_TENSORS:
        raise bad(f"header declares {len(header)} tensors, more than {MAX_TENSORS}")
    data_start, data_size = 8 + header_len, size - 8 - header_len
    entries, ranges = {}, []
    for name, info in header.items():
        if not (isinstance(info, dict) and isinstance(info.get("dtype"), str)
                and isinstance(info.get("shape"), list) and isinstance(info.get("data_offsets"), list)):
            raise bad("entry lacks dtype, shape or data_offsets", name)
        dtype, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
        if dtype not in _ALL_DTYPE_SIZES:
            raise bad(f"unknown dtype {dtype!r}", name)
        if dtype not in _FLOAT_DTYPES:
            raise InputError(f"dtype {dtype} is not a floating-point type", client=client, tensor=name)
        if not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
            raise bad(f"shape {shape} is not a list of non-negative integers", name)
        if not (len(offsets) == 2 and all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)
                and 0 <= offsets[0] <= offsets[1] <= data_size):
            raise bad(f"data_offsets {offsets} fall outside the {data_size} data bytes", name)
        numel = 1
        for d in shape:
            numel *= d
        if offsets[1] - offsets[0] != numel * _ALL_DTYPE_SIZES[dtype]:
            raise bad(f"data_offsets {offsets} do not hold a {dtype} tensor of shape {shape}", name)
        entries[name] = TensorEntry(_FLOAT_DTYPES[dtype], tuple(shape), data_start + offsets[0], offsets[1] - offsets[0])
        ranges.append((offsets[0], offsets[1], name))
    ranges.sort()
    for (_, end, first), (start, _, second) in zip(ranges, ranges[1:]):
        if start < end:
            raise bad(f"data of {first!r} and {second!r} overlap", second)
    if not entries:
        raise InputError(f"{file} holds no tensors (empty update)", client=client)
    return AdapterFile(client, file, entries)


def client_paths(paths: Sequence[str | os.PathLike] | Mapping[str, str | os.PathLike]) -> dict[str, Path]:
    """Client id -> path; a sequence takes ids from the directory or file names."""
    if isinstance(paths, Mapping):
        out = {str(k): _as_path(v, str(k)) for k, v in paths.items()}
        if len(out) != len(paths):
            raise InputError(f"client ids collide once converted to strings: {list(paths)}")
        return out
    if isinstance(paths, (str, bytes, os.PathLike)) or not isinstance(paths, Sequence):
        raise InputError(f"paths must be a list of adapter paths or a mapping client id -> path, got {paths!r}")
    out = {}
    for path in paths:
        p = _as_path(path, None)
        client = p.name if p.is_dir() or not p.suffix == ".safetensors" else p.stem
        if client in out:
            raise InputError(f"two paths give the same client id {client!r}; pass a mapping id -> path")
        out[client] = p
    return out


def _as_path(path, client: str | None) -> Path:
    if not isinstance(path, (str, os.PathLike)):
        raise InputError(f"an adapter path must be a string or path, got {type(path).__name__}", client=client)
    return Path(path)


def check_same_tensors(files: Sequence[AdapterFile], reference: AdapterFile | None) -> dict[str, tuple[int, ...]]:
    """The shared name -> shape map; any client whose tensors differ is named in the error."""
    base = reference or files[0]
    expected = base.shapes  # built once per file: linear in the number of tensors
    for f in files:
        if f is base or f.shapes == expected:
            continue
        for name in sorted(expected.keys() - f.shapes.keys()):
            raise InputError(f"tensor missing (present in {base.client!r})", client=f.client, tensor=name)
        for name in sorted(f.shapes.keys() - expected.keys()):
            raise InputError(f"unexpected tensor (absent from {base.client!r})", client=f.client, tensor=name)
        for name, shape in f.shapes.items():
            if shape != expected[name]:
                raise InputError(f"shape {shape} differs from {expected[name]} in {base.client!r}",
                                 client=f.client, tensor=name)
    return dict(expected)
