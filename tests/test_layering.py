"""Import layering: lower layers never import higher ones, the package has no import cycle, and the
layout holds (every kernel beside its reference, reached by imports from a backend).

Read from the sources (``ast``), so function-level (lazy) imports count too: a lazy import only
hides a cycle until someone calls the function. Importing ``a.b.c`` also runs the ``__init__`` of
``a.b``, so it counts as importing ``a.b`` as well (that is how ``engine/packer.py -> report ->
mechanism -> engine.stats`` was a cycle through ``engine/__init__``).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# pyproject.toml installs the top-level kernels/ folder as kfca_llm.kernels.
PACKAGE_DIRS = {"kfca_llm": ROOT / "kfca_llm", "kfca_llm.kernels": ROOT / "kernels"}

# What each low layer may import from the package (itself included); everything else is higher.
ALLOWED = {
    "kfca_llm.errors": ("kfca_llm.errors",),
    "kfca_llm.tensors": ("kfca_llm.tensors",),
    "kfca_llm.partition": ("kfca_llm.partition", "kfca_llm.errors"),
    # Kernels: raw buffers, integers and keys in, integers out; of the package only the contract.
    "kfca_llm.kernels": ("kfca_llm.kernels", "kfca_llm.partition", "kfca_llm.errors"),
    "kfca_llm.engine": ("kfca_llm.engine", "kfca_llm.kernels", "kfca_llm.partition", "kfca_llm.errors"),
    "kfca_llm.mechanism": ("kfca_llm.mechanism", "kfca_llm.engine", "kfca_llm.kernels", "kfca_llm.partition",
                           "kfca_llm.errors"),
    "kfca_llm.text": ("kfca_llm.text",),
    "kfca_llm.report": ("kfca_llm.report", "kfca_llm.mechanism", "kfca_llm.engine", "kfca_llm.kernels",
                        "kfca_llm.partition", "kfca_llm.errors", "kfca_llm.text"),
}


def package_sources() -> dict[str, tuple[str, bool]]:
    """module name -> (source, is a package __init__) for every module of the installed package."""
    sources = {}
    for package, folder in PACKAGE_DIRS.items():
        for path in sorted(folder.rglob("*.py")):
            parts = list(path.relative_to(folder).with_suffix("").parts)
            is_package = parts[-1] == "__init__"
            if is_package:
                parts.pop()
            name = ".".join([package, *parts])
            if name.startswith("kfca_llm.kernels") and package == "kfca_llm":
                continue  # not a folder of kfca_llm/ (the mapping above wins)
            sources[name] = (path.read_text(), is_package)
    return sources


def _within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def import_graph(sources: dict[str, tuple[str, bool]]) -> dict[str, set[str]]:
    """module -> the package modules its import statements run.

    The parent packages an import runs on the way are left out where they contain the importer
    (Python is already running them); a package the statement names itself always counts.
    """
    graph = {}
    for module, (source, is_package) in sources.items():
        package = module if is_package else module.rpartition(".")[0]
        targets = set()
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Import):
                named = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module
                if node.level:
                    parts = package.split(".")
                    base = ".".join(parts[: len(parts) - node.level + 1] + ([node.module] if node.module else []))
                # `from pkg import sub` imports the submodule pkg.sub; `from pkg import name` imports pkg
                subs = [f"{base}.{alias.name}" for alias in node.names if f"{base}.{alias.name}" in sources]
                named = subs + ([base] if len(subs) < len(node.names) else [])
            else:
                continue
            for name in named:
                parts = name.split(".")
                targets.update(t for t in (".".join(parts[:k]) for k in range(1, len(parts)))
                               if t in sources and not _within(module, t))
                if name in sources:
                    targets.add(name)
        graph[module] = targets
    return graph


def layer_violations(graph: dict[str, set[str]]) -> list[str]:
    out = []
    for module, targets in sorted(graph.items()):
        layer = max((p for p in ALLOWED if _within(module, p)), key=len, default=None)
        if layer is None:
            continue
        for target in sorted(targets):
            if not any(_within(target, allowed) for allowed in ALLOWED[layer]):
                out.append(f"{module} imports {target}")
    return out


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as a path [a, b, ..., a], or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(module: str) -> list[str] | None:
        state[module] = 1
        path.append(module)
        for target in sorted(graph.get(module, ())):
            if state.get(target) == 1:
                return path[path.index(target):] + [target]
            if target not in state and (cycle := visit(target)):
                return cycle
        path.pop()
        state[module] = 2
        return None

    for module in sorted(graph):
        if module not in state and (cycle := visit(module)):
            return cycle
    return None


def test_lower_layers_never_import_higher_ones():
    assert layer_violations(import_graph(package_sources())) == []


def test_the_package_has_no_import_cycle():
    assert find_cycle(import_graph(package_sources())) is None


def test_the_checks_catch_a_reintroduced_cycle():
    """The old cycle put back into a copy of today's sources: both checks must see it."""
    sources = package_sources()
    source, is_package = sources["kfca_llm.engine.backends"]
    sources["kfca_llm.engine.backends"] = (source + "\nfrom ..report import RewardReport\n", is_package)
    graph = import_graph(sources)
    assert "kfca_llm.engine.backends imports kfca_llm.report" in layer_violations(graph)
    cycle = find_cycle(graph)
    assert cycle is not None and "kfca_llm.report" in cycle and "kfca_llm.engine.backends" in cycle
    # A kernel that reaches above the contract (a kernel returns integers; the floats are the engine's).
    source, is_package = sources["kfca_llm.kernels.pair_counts.triton"]
    sources["kfca_llm.kernels.pair_counts.triton"] = (source + "\nfrom kfca_llm.engine.stats import RoundCounts\n",
                                                      is_package)
    assert "kfca_llm.kernels.pair_counts.triton imports kfca_llm.engine.stats" in layer_violations(import_graph(sources))


# --- one home per operation ---------------------------------------------------------------------

def operation_folders() -> list[Path]:
    """kernels/<operation>/: every package of kernels/ but the shared intrinsics."""
    return sorted(p.parent for p in (ROOT / "kernels").glob("*/__init__.py") if p.parent.name != "intrinsics")


def test_every_operation_has_its_reference_and_cpu_kernel_side_by_side_and_its_tests():
    folders = operation_folders()
    assert {f.name for f in folders} >= {"sign_pack", "pair_counts", "sampled_penalty", "labels"}
    for folder in folders:
        assert (folder / "reference.py").is_file() and (folder / "cpu.py").is_file(), folder.name
        assert (ROOT / "tests" / "kernels" / f"test_{folder.name}.py").is_file(), folder.name


def test_every_compiled_kernel_is_reached_by_imports_from_a_backend():
    """A reader follows the imports of kfca_llm/engine/ to every CPU and Triton kernel (no module kept in an attribute):
    a backend imports each operation's ``cpu`` and ``triton`` module, and ``triton`` its other ``triton_*`` modules."""
    graph = import_graph(package_sources())
    from_engine = set().union(*(targets for module, targets in graph.items() if _within(module, "kfca_llm.engine")))
    kernels = {f"kfca_llm.kernels.{folder.name}.{path.stem}" for folder in operation_folders()
               for path in folder.glob("*.py") if path.stem in ("cpu", "triton")}
    assert len(kernels) >= 7 and kernels <= from_engine
    split = {f"kfca_llm.kernels.{path.parent.name}.{path.stem}" for folder in operation_folders()
             for path in folder.glob("triton_*.py")}
    assert split and split <= set().union(*(graph[module] for module in kernels))
    assert {"kfca_llm.engine.cpu", "kfca_llm.engine.triton_backend"} <= graph["kfca_llm.engine"]


def private_imports(sources: dict[str, tuple[str, bool]]) -> list[str]:
    """``from module import _name`` where the module is another one of the package."""
    out = []
    graph_sources = set(sources)
    for module, (source, is_package) in sources.items():
        package = module if is_package else module.rpartition(".")[0]
        for node in ast.walk(ast.parse(source)):
            if not isinstance(node, ast.ImportFrom):
                continue
            base = node.module
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([node.module] if node.module else []))
            if base not in graph_sources or base == module:
                continue
            out += [f"{module} imports {base}.{alias.name}" for alias in node.names
                    if alias.name.startswith("_") and not alias.name.startswith("__")]
    return out


def test_no_module_imports_another_modules_private_names():
    sources = package_sources()
    assert private_imports(sources) == []
    # The check sees one put back (engine/labels.py once took cpu._mix32).
    source, is_package = sources["kfca_llm.engine.labels"]
    sources["kfca_llm.engine.labels"] = (source + "\nfrom .cpu import _unique_pairs\n", is_package)
    assert "kfca_llm.engine.labels imports kfca_llm.engine.cpu._unique_pairs" in private_imports(sources)


def test_the_experiment_module_is_imported_only_by_its_command():
    """valuation/fidelity.py is the comparison experiment; shared pieces (metrics) live below it."""
    graph = import_graph(package_sources())
    importers = sorted(m for m, targets in graph.items() if "kfca_llm.valuation.fidelity" in targets)
    assert importers == ["kfca_llm.cli.fidelity"]


def imports_of_a_tests_package(source: str) -> list[str]:
    """``import tests...`` / ``from tests... import``: resolved against whatever top-level ``tests`` package is
    installed (trl 0.8.1 ships one), not this folder."""
    found = []
    for node in ast.walk(ast.parse(source)):
        names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else \
            [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
        found += [name for name in names if name == "tests" or name.startswith("tests.")]
    return found


def test_no_test_imports_the_tests_folder_as_a_package():
    offenders = {path.relative_to(ROOT).as_posix(): names for path in sorted((ROOT / "tests").rglob("*.py"))
                 if (names := imports_of_a_tests_package(path.read_text(encoding="utf-8")))}
    assert offenders == {}
    assert imports_of_a_tests_package("from tests.test_peer_pool import SCHEDULE\nimport tests.helpers\n") == [
        "tests.test_peer_pool", "tests.helpers"]
