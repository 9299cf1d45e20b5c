"""What the GPU would run: every Triton kernel of kernels/ compiled for sm_90 by Triton's own compiler (no GPU needed).

    python benchmarks/inspect_kernels.py           # a table
    python benchmarks/inspect_kernels.py --json    # one JSON list: kernel, vector_loads, scalar_loads, popc,
                                                   # bar_sync, sass_per_element, spills

Each kernel is compiled as its launcher calls it (the constexpr values below), with every pointer argument
marked 16-byte divisible, as the JIT does for aligned tensors (``tt.divisibility``: without it every load
looks unaligned). Figures per compiled variant:

* ``vector_loads`` / ``scalar_loads``: ``ld.global`` instructions in the PTX moving 16 bytes (``.v4`` of 32-bit,
  ``.v2`` of 64-bit lanes) / fewer bytes. Element loads of the pack kernels carry ``evict_first`` (data read
  once), which is how ``element_loads`` tells them from the loads of plans, tables and task words;
* ``popc``: ``popc`` instructions in the PTX; ``bar_sync``: ``bar.sync``/``barrier.sync`` in the PTX;
* ``sass_per_element``: static SASS instructions of the cubin (``cuobjdump -sass``, NOPs left out) times the
  threads of a program, over the input elements one program reads per pass of its main loop (pack: the
  floats of one client's block; counting: the sign and task bits of the words of one chunk). It is the
  instruction budget per element as if every instruction ran once per pass: an upper bound for the loop;
* ``spills``: bytes of spill stores + spill loads that ``ptxas -v`` reports for the PTX, run with the ptxas
  and the options Triton itself uses for sm_90 (``ptxas-blackwell`` in the wheel: the older ``ptxas`` there
  rejects the PTX version); checked against the SASS of Triton's cubin, where a spill is a local-memory
  ``STL``/``LDL``.

Run without ``TRITON_INTERPRET`` (the interpreter replaces the compiler); the script removes it and re-runs
itself if it is set.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
    if __name__ != "__main__":
        raise ImportError("inspect_kernels compiles kernels: import it without TRITON_INTERPRET set")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    sys.exit(subprocess.run([sys.executable, *sys.argv], env=env).returncode)

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.backends.nvidia.compiler import get_ptxas, sm_arch_from_capability  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402
from triton.runtime.jit import JITFunction  # noqa: E402

from kfca_llm.kernels.sign_pack import triton as sign_pack  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TARGET = GPUTarget("cuda", 90, 32)
KEYS = ("kernel", "vector_loads", "scalar_loads", "popc", "bar_sync", "sass_per_element", "spills")


@dataclass(frozen=True)
class Variant:
    """One way a launcher compiles a kernel."""

    label: str
    constexprs: dict
    elements: int
    """input elements one program reads per pass of its main loop (see the module docstring)."""
    types: dict = field(default_factory=dict)
    """argument -> Triton type where the default (``*i32`` for ``*_ptr``, ``i32`` otherwise) is not it."""
    num_warps: int = 4


def _pack_words(dtype) -> Variant:
    fmt = sign_pack.RAW_FORMATS[dtype]
    name = str(dtype).removeprefix("torch.")
    return Variant(name, dict(FLAT=True, SUBSET=False, RAW=fmt.words_as, LANES=fmt.lanes, EXP_MASK=fmt.exp_mask,
                              BLOCK_WORDS=sign_pack.GPU_BLOCK_WORDS),
                   sign_pack.GPU_BLOCK_WORDS * 32, _PACK_TYPES, sign_pack.NUM_WARPS)


_PACK_TYPES = {"table_ptr": "*i64", "subset_ptr": "*i64", "block_word_ptr": "*i64", "full_words_ptr": "*i64",
               "word_offsets_ptr": "*i64", "numels_ptr": "*i64", "n_sources": "i64", "n_columns": "i64",
               "n_subset": "i64", "row_words": "i64", "n_tensors": "i64", "subset_start": "i64", "n_tails": "i64"}


def _tails(dtype) -> Variant:
    fmt = sign_pack.RAW_FORMATS[dtype]
    return Variant(str(dtype).removeprefix("torch."),
                   dict(FLAT=True, SUBSET=False, RAW=fmt.tail_as, EXP_MASK=fmt.exp_mask, TAIL_BLOCK=sign_pack.TAIL_BLOCK),
                   sign_pack.TAIL_BLOCK * 32, _PACK_TYPES, sign_pack.NUM_WARPS)


def _variants() -> dict[str, list[Variant]]:
    import torch

    # counting: per pass, one word per thread of each of the 2 x TILE clients and of the 3 set planes
    gram = [Variant(f"tile {tile}", dict(TILE=tile, BLOCK=128), (2 * tile + 3) * 128 * 32)
            for tile in (2, 4)]
    floats = (torch.bfloat16, torch.float16, torch.float32, torch.float64)
    return {
        "sign_pack._pack_words_kernel": [_pack_words(d) for d in floats]
        + [Variant("bfloat16 table", {**_pack_words(torch.bfloat16).constexprs, "FLAT": False, "SUBSET": True},
                   sign_pack.GPU_BLOCK_WORDS * 32, _PACK_TYPES)],
        "sign_pack._pack_tails_kernel": [_tails(d) for d in floats],
        "pair_counts._gram_tiles_kernel": gram,
        "pair_counts._set_planes_kernel": [Variant("", dict(BLOCK_WORDS=256), 256 * 32, _PENALTY_TYPES)],
        # stratum counts (issue 43): per pass, one word per thread of each of the TILE clients, the 3 set planes and
        # the 4 public planes of the default 3 steps x 2 buckets
        "stratum_counts._strata_kernel": [Variant("4 planes, tile 8", dict(N_PLANES=4, TILE=8, BLOCK=128),
                                                  (8 + 3 + 4) * 128 * 32, {"partial_ptr": "*i64", "sizes_ptr": "*i64"})],
        # sampled penalty (tile sizes of its launchers on a GPU): per pass, the task bits of a block; one
        # client's sign bits of a block; the draws of a [pairs x block] tile; the values of a tile.
        "sampled_penalty._set_sizes_kernel": [Variant("", dict(BLOCK_WORDS=32), 32 * 32, _PENALTY_TYPES)],
        "sampled_penalty._planes_kernel": [Variant("", dict(BLOCK_WORDS=32, CLIENTS=1), 32 * 32, _PENALTY_TYPES)],
        "sampled_penalty._draws_kernel": [Variant("", dict(BLOCK=256, PAIRS=4), 4 * 256, _PENALTY_TYPES)],
        "sampled_penalty._columns_kernel": [Variant(f"{w} column words", dict(BLOCK_WORDS=32, COLUMN_WORDS=w), 32 * 32,
                                                    _PENALTY_TYPES) for w in (1, 4)],
        "sampled_penalty._shared_draws_kernel": [Variant(f"{w} column words", dict(TILE_WORDS=128 // w, COLUMN_WORDS=w),
                                                         128 // w * 32, _PENALTY_TYPES) for w in (1, 4)],
    }


_PENALTY_TYPES = {"params_ptr": "*i64", "sizes_ptr": "*i64", "offsets_ptr": "*i64", "matches_ptr": "*i64",
                  "groups_ptr": "*i64", "table_ptr": "*i64"}


def discover() -> dict[str, JITFunction]:
    """Every ``*_kernel`` JIT function of ``kernels/<operation>/triton*.py``, as ``<operation>.<name>`` (an
    operation may split its kernels over several modules: ``sampled_penalty``'s one per draw way)."""
    import importlib

    found = {}
    for path in sorted((ROOT / "kernels").glob("*/triton*.py")):
        module = importlib.import_module(f"kfca_llm.kernels.{path.parent.name}.{path.stem}")
        for name, value in vars(module).items():
            if isinstance(value, JITFunction) and name.endswith("_kernel"):
                found[f"{path.parent.name}.{name}"] = value
    return found


def compile_variant(fn: JITFunction, variant: Variant):
    signature, attrs = {}, {}
    for index, (name, param) in enumerate(zip(fn.arg_names, fn.params)):
        if param.is_constexpr:
            signature[name] = "constexpr"
            continue
        kind = variant.types.get(name, "*i32" if name.endswith("_ptr") else "i32")
        signature[name] = kind
        if kind.startswith("*"):
            attrs[(index,)] = [["tt.divisibility", 16]]
    source = ASTSource(fn=fn, signature=signature, constexprs=variant.constexprs, attrs=attrs)
    return triton.compile(source, target=TARGET, options={"num_warps": variant.num_warps})


_LOAD = re.compile(r"^\s*(?:@!?%p\d+\s+)?ld\.global\S*", re.M)


def _load_bytes(instruction: str) -> int:
    lanes = 4 if ".v4." in instruction else 2 if ".v2." in instruction else 1
    width = int(re.search(r"\.[bsuf](8|16|32|64)\b", instruction).group(1))
    return lanes * width // 8


def loads(ptx: str, streaming_only: bool = False) -> tuple[int, int]:
    """(16-byte vector loads, narrower loads) in the PTX; ``streaming_only``: element loads (``evict_first``)."""
    found = [m.group(0) for m in _LOAD.finditer(ptx)]
    if streaming_only:
        found = [i for i in found if "evict_first" in i]
    vector = sum(_load_bytes(i) == 16 for i in found)
    return vector, len(found) - vector


def element_loads(fn: JITFunction, variant: Variant) -> tuple[int, int]:
    """(16-byte vector, narrower) element loads of one compiled variant (loads marked ``evict_first``)."""
    return loads(compile_variant(fn, variant).asm["ptx"], streaming_only=True)


def _sass(cubin: bytes) -> list[str]:
    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "kernel.cubin"
        path.write_bytes(cubin)
        text = subprocess.run([str(tool), "-sass", str(path)], check=True, capture_output=True, text=True).stdout
    return [line for line in text.splitlines() if re.match(r"\s+/\*[0-9a-f]{4}\*/", line) and " NOP" not in line]


def _ptxas_spills(ptx: str) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "kernel.ptx"
        source.write_text(ptx)
        # The options Triton's own make_cubin passes (its log is not kept once the kernel is cached).
        command = [get_ptxas(TARGET.arch).path, "-lineinfo", "-v", "--regAllocOptLevel=2",
                   f"--gpu-name={sm_arch_from_capability(TARGET.arch)}", str(source), "-o", str(Path(tmp) / "k.cubin")]
        result = subprocess.run(command, check=True, capture_output=True, text=True)
    log = result.stdout + result.stderr
    stores = sum(int(v) for v in re.findall(r"(\d+) bytes spill stores", log))
    spill_loads = sum(int(v) for v in re.findall(r"(\d+) bytes spill loads", log))
    if "spill" not in log:
        raise RuntimeError(f"ptxas -v printed no spill figures:\n{log}")
    return stores + spill_loads


def inspect(name: str, fn: JITFunction, variant: Variant) -> dict:
    compiled = compile_variant(fn, variant)
    ptx = compiled.asm["ptx"]
    sass = _sass(compiled.asm["cubin"])
    spills = _ptxas_spills(ptx)
    local = sum(bool(re.search(r"\b(STL|LDL)\b", line)) for line in sass)
    if (spills == 0) != (local == 0):
        raise RuntimeError(f"{name}: ptxas reports {spills} spill bytes but the SASS has {local} local-memory accesses")
    vector, scalar = loads(ptx)
    threads = 32 * variant.num_warps
    return {"kernel": f"{name}[{variant.label}]" if variant.label else name, "vector_loads": vector,
            "scalar_loads": scalar, "popc": len(re.findall(r"\bpopc\.", ptx)),
            "bar_sync": len(re.findall(r"\b(?:bar|barrier)\.sync\b", ptx)),
            "sass_per_element": round(len(sass) * threads / variant.elements, 2), "spills": spills}


def inspect_all() -> list[dict]:
    variants = _variants()
    kernels = discover()
    missing = sorted(set(kernels) - set(variants))
    if missing:
        raise RuntimeError(f"no compile variants for {missing}: add them to benchmarks/inspect_kernels.py")
    return [inspect(name, kernels[name], v) for name in sorted(kernels) for v in variants[name]]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true", help="one JSON list of objects instead of a table")
    parser.add_argument("--element-loads", action="store_true",
                        help="JSON: (16-byte vector, narrower) element loads of each sign_pack variant (for the CI test)")
    args = parser.parse_args(argv)
    if args.element_loads:
        kernels, variants = discover(), _variants()
        print(json.dumps({f"{name}[{v.label}]": element_loads(kernels[name], v) for name in sorted(variants)
                          if name.startswith("sign_pack.") for v in variants[name]}))
        return
    rows = inspect_all()
    if args.json:
        print(json.dumps(rows))
        return
    print(f"triton {triton.__version__}, target sm_90, ptxas {get_ptxas(TARGET.arch).path}")
    print("| " + " | ".join(KEYS) + " |")
    print("|" + "---|" * len(KEYS))
    for row in rows:
        print("| " + " | ".join(str(row[k]) for k in KEYS) + " |")


if __name__ == "__main__":
    main()
