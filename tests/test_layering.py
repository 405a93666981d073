"""The layering of the packages, checked on the real import graph of the source tree.

Every ``import`` and ``from ... import`` statement of every module is read with :mod:`ast`
(module level, inside functions and under ``TYPE_CHECKING`` alike, so a function-local import
cannot hide a dependency) and resolved to the module it names. Then:

- every module belongs to exactly one layer of :data:`LAYERS`;
- a module imports only from its own layer or lower ones, and never from an independent
  sibling in its layer (the edge and central tiers never import each other);
- the module graph has no cycle at all, so no function-local import dodges one.

The last tests plant a bad import in a copy of the tree and show the check catches it.
"""

from __future__ import annotations

import ast
import shutil
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

#: Bottom first. A layer is a tuple of groups; groups of one layer are independent siblings (no
#: group imports another). A group is a tuple of module names or package prefixes.
LAYERS: tuple[tuple[tuple[str, ...], ...], ...] = (
    # the pure model and scheduling core; the version string
    (("edgesched.core", "edgesched.version"),),
    # documents, wire, sessions and the SQLite store; ONNX policies (each on the core only)
    (("edgesched.sync",), ("edgesched.policies",)),
    # HTTP plumbing both tiers share (problem details, bodies, tokens, OpenAPI, REST client)
    (("edgesched.rest",),),
    # the TOML configuration every process reads
    (("edgesched.config", "edgesched.tomlwrite"),),
    # the two tiers: never one importing the other
    (("edgesched.edge",), ("edgesched.central",)),
    # wiring (engine + API + signals + systemd notification), the partition-injection harness
    (
        (
            "edgesched.serve",
            "edgesched.sdnotify",
            "edgesched.fieldtest",
            "edgesched.localbroker",
            "edgesched.ports",
        ),
    ),
    # the commands people run and what they drive
    (("edgesched",),),
)


@dataclass(frozen=True)
class Import:
    importer: str
    imported: str
    where: str  # file:line


def package_dirs(root: Path) -> dict[str, Path]:
    """Import package -> source folder, as pyproject.toml maps them."""
    meta = tomllib.loads((root / "pyproject.toml").read_text())
    mapping: dict[str, str] = meta["tool"]["setuptools"]["package-dir"]
    return {pkg: root / folder for pkg, folder in mapping.items()}


def modules(root: Path) -> dict[str, Path]:
    """Every module of the project: dotted name -> file."""
    out: dict[str, Path] = {}
    for pkg, folder in package_dirs(root).items():
        for path in sorted(folder.glob("*.py")):
            name = pkg if path.stem == "__init__" else f"{pkg}.{path.stem}"
            out[name] = path
    return out


def _resolve(name: str, known: set[str]) -> str | None:
    """The project module ``name`` refers to (a module, or the package holding it)."""
    while name:
        if name in known:
            return name
        name = name.rpartition(".")[0]
    return None


def imports(root: Path) -> list[Import]:
    """Every import between project modules, wherever in a module it is written."""
    mods = modules(root)
    known = set(mods)
    found: list[Import] = []
    for importer, path in mods.items():
        package = importer if path.stem == "__init__" else importer.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")
                    anchor = ".".join(parts[: len(parts) - node.level + 1])
                    base = f"{anchor}.{base}" if base else anchor
                # ``from pkg import mod`` imports the module pkg.mod; ``from mod import name``
                # imports mod
                targets = [f"{base}.{a.name}" for a in node.names]
            line = getattr(node, "lineno", 0)
            for target in targets:
                resolved = _resolve(target, known)
                if resolved is not None and resolved != importer:
                    found.append(Import(importer, resolved, f"{path}:{line}"))
    return found


def _group_of(module: str) -> tuple[int, int] | None:
    """(layer, group) of ``module``: the longest matching prefix wins."""
    best: tuple[int, int, int] | None = None
    for li, layer in enumerate(LAYERS):
        for gi, group in enumerate(layer):
            for prefix in group:
                matches = module == prefix or module.startswith(prefix + ".")
                if matches and (best is None or len(prefix) > best[2]):
                    best = (li, gi, len(prefix))
    return None if best is None else (best[0], best[1])


def violations(root: Path) -> list[str]:
    """Every layering problem of the tree at ``root``, one line each."""
    problems: list[str] = []
    for module in sorted(modules(root)):
        if _group_of(module) is None:
            problems.append(f"{module}: in no layer of LAYERS")
    for imp in imports(root):
        a, b = _group_of(imp.importer), _group_of(imp.imported)
        if a is None or b is None:
            continue
        if b[0] > a[0]:
            problems.append(f"{imp.where}: {imp.importer} imports the higher {imp.imported}")
        elif b[0] == a[0] and b[1] != a[1]:
            problems.append(f"{imp.where}: {imp.importer} imports its sibling {imp.imported}")
    return problems


def cycles(root: Path) -> list[list[str]]:
    """The import cycles (strongly connected components of more than one module), Tarjan."""
    graph: dict[str, set[str]] = {m: set() for m in modules(root)}
    for imp in imports(root):
        graph[imp.importer].add(imp.imported)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> Iterator[None]:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                yield from visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))
        yield None

    for v in sorted(graph):
        if v not in index:
            for _ in visit(v):
                pass
    return found


# --- the real tree ----------------------------------------------------------------------------


def test_the_graph_is_read() -> None:
    """The reader sees the imports it must (a check on the checker)."""
    edges = {(i.importer, i.imported) for i in imports(ROOT)}
    assert ("edgesched.edge.engine", "edgesched.core.scheduler") in edges
    assert ("edgesched.edge.api", "edgesched.edge.engine") in edges
    assert len(modules(ROOT)) > 80


def test_every_module_respects_the_layers() -> None:
    assert violations(ROOT) == []


def test_no_import_cycle() -> None:
    assert cycles(ROOT) == []


# --- a planted bad import is caught -----------------------------------------------------------


@pytest.fixture
def tree_copy(tmp_path: Path) -> Path:
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    for folder in {p.relative_to(ROOT) for p in package_dirs(ROOT).values()}:
        shutil.copytree(ROOT / folder, tmp_path / folder, ignore=shutil.ignore_patterns("*.pyc"))
    return tmp_path


def _plant(tree: Path, relpath: str, line: str, *, in_function: bool = False) -> None:
    path = tree / relpath
    if in_function:
        line = "def _planted() -> None:\n    " + line
    path.write_text(path.read_text() + "\n" + line + "\n")


def test_a_planted_upward_import_is_caught(tree_copy: Path) -> None:
    assert violations(tree_copy) == []
    _plant(tree_copy, "core/model.py", "from edgesched.central.engine import CentralEngine")
    found = violations(tree_copy)
    assert len(found) == 1
    assert "edgesched.core.model imports the higher edgesched.central.engine" in found[0]


def test_a_planted_sibling_import_inside_a_function_is_caught(tree_copy: Path) -> None:
    _plant(tree_copy, "edge/agent.py", "from edgesched.central import api", in_function=True)
    found = violations(tree_copy)
    assert len(found) == 1
    assert "edgesched.edge.agent imports its sibling edgesched.central.api" in found[0]


def test_a_planted_cycle_is_caught(tree_copy: Path) -> None:
    assert cycles(tree_copy) == []
    # the engine imports its API inside a function: a cycle, even though no layer is crossed
    _plant(tree_copy, "edge/engine.py", "from edgesched.edge import api", in_function=True)
    assert ["edgesched.edge.api", "edgesched.edge.engine"] in cycles(tree_copy)


def test_a_module_in_no_layer_is_caught(tree_copy: Path) -> None:
    (tree_copy / "rest" / "stray.py").write_text("")
    (tree_copy / "pyproject.toml").write_text(
        (tree_copy / "pyproject.toml")
        .read_text()
        .replace('"edgesched.rest" = "rest"', '"edgesched.rest" = "rest", "stray" = "rest"')
    )
    assert any(p.startswith("stray") and "in no layer" in p for p in violations(tree_copy))
