"""No import cycle among ``sorl_monitor``'s own modules, every module imports in a fresh interpreter, and the
layering of docs/architecture.md holds: the write path never imports the read path, the read path never
imports ``integrations``.

The graph is read from the source (``ast``), over the packages ``pyproject.toml`` installs: an edge
``a → b`` for each ``import b`` / ``from b import x`` in ``a`` (at any depth, lazy imports included), where
``from pkg import sub`` points at the submodule ``pkg.sub``, not at ``pkg``'s ``__init__``.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def package_modules() -> dict[str, Path]:
    """Each module name of the installed packages → its source file (``[tool.setuptools]`` packages, dirs)."""
    setup = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    dirs = setup.get("package-dir", {})
    modules = {}
    for package in setup["packages"]:
        top = next(
            (p for p in sorted(dirs, key=len, reverse=True) if package == p or package.startswith(p + ".")),
            None,
        )
        folder = (
            ROOT / dirs[top] / package[len(top) + 1 :].replace(".", "/")
            if top
            else ROOT / package.replace(".", "/")
        )
        modules[package] = folder / "__init__.py"
        for file in folder.glob("*.py"):
            if file.name != "__init__.py":
                modules[f"{package}.{file.stem}"] = file
    return modules


def imported_modules(name: str, file: Path, known: set[str]) -> set[str]:
    """The package's own modules that ``file`` (module ``name``) imports."""
    found = set()
    for node in ast.walk(ast.parse(file.read_text(), str(file))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:
                parts = name.split(".")[: len(name.split(".")) - node.level + (file.name == "__init__.py")]
                module = ".".join([*parts, module] if module else parts)
            submodules = {f"{module}.{alias.name}" for alias in node.names}
            found |= submodules & known
            if not submodules <= known:
                found.add(module)
    return (found & known) - {name}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while not component or component[-1] != node:
                component.append(stack.pop())
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def import_graph() -> dict[str, set[str]]:
    modules = package_modules()
    return {name: imported_modules(name, file, set(modules)) for name, file in modules.items()}


WRITE_PATH = ("write",)
"""The write path's modules (docs/architecture.md): what a trainer imports to log."""
READ_PATH = ("read", "logs", "diagnose", "figures", "dashboard.report")
"""The read path's modules and packages (each package with its submodules)."""


def on_path(module: str, path: tuple[str, ...]) -> bool:
    """Whether ``module`` (a full name) is one of ``path``'s modules or inside one of its packages."""
    name = module.removeprefix("sorl_monitor.")
    return any(name == part or name.startswith(part + ".") for part in path)


def reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    """Every module ``start`` imports, directly or through others."""
    seen: set[str] = set()
    todo = [start]
    while todo:
        for target in graph[todo.pop()] - seen:
            seen.add(target)
            todo.append(target)
    return seen


def test_the_write_path_never_imports_the_read_path():
    graph = import_graph()
    crossings = {
        name: sorted(m for m in reachable(graph, name) if on_path(m, READ_PATH))
        for name in graph
        if on_path(name, WRITE_PATH)
    }
    assert {name: found for name, found in crossings.items() if found} == {}


def test_the_read_path_never_imports_integrations():
    graph = import_graph()
    read_modules = [name for name in graph if on_path(name, READ_PATH)]
    assert "sorl_monitor.logs.ingest" in read_modules and "sorl_monitor.figures.overview" in read_modules
    crossings = {
        name: sorted(m for m in reachable(graph, name) if on_path(m, ("integrations",)))
        for name in read_modules
    }
    assert {name: found for name, found in crossings.items() if found} == {}


def test_the_layering_check_finds_a_crossing():
    graph = {
        "sorl_monitor.write.monitor": {"sorl_monitor.metric_names"},
        "sorl_monitor.metric_names": {"sorl_monitor.read.query"},
    }
    graph["sorl_monitor.read.query"] = set()
    found = [m for m in reachable(graph, "sorl_monitor.write.monitor") if on_path(m, READ_PATH)]
    assert found == ["sorl_monitor.read.query"]
    assert not on_path("sorl_monitor.query_plan", READ_PATH) and on_path("sorl_monitor.logs.hf", READ_PATH)


def test_the_package_has_no_import_cycle():
    graph = import_graph()
    assert "sorl_monitor.diagnose.detectors" in graph and "sorl_monitor.cli.main" in graph
    assert cycles(graph) == []


def test_the_cycle_check_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


@pytest.mark.slow
def test_every_module_imports_in_a_fresh_interpreter():
    """Leaves first (each module after what it imports); a module whose optional third-party package is
    absent (e.g. verl) is skipped, any other ``ImportError`` fails."""
    graph, order = import_graph(), []

    def place(name: str) -> None:
        if name not in order:
            for target in sorted(graph[name]):
                place(target)
            order.append(name)

    for name in sorted(graph):
        place(name)
    script = (
        "import importlib, sys\n"
        "for name in sys.argv[1:]:\n"
        "    try:\n"
        "        importlib.import_module(name)\n"
        "    except ModuleNotFoundError as error:\n"
        "        if (error.name or '').split('.')[0] == 'sorl_monitor':\n"
        "            raise\n"
        "        print('skipped', name, error.name)\n"
    )
    done = subprocess.run([sys.executable, "-c", script, *order], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]


QUERY_LAYER_MAY_IMPORT = {
    "sorl_monitor.read.errors": set(),
    "sorl_monitor.read.catalog": {"sorl_monitor.read.errors"},
    "sorl_monitor.read.views": {"sorl_monitor.read.errors"},
    "sorl_monitor.read.sql.statements": {"sorl_monitor.read.errors", "sorl_monitor.read.views"},
}
"""The query layer's modules below ``query`` and which of the layer's modules each may import (its map in
docs/architecture.md): the catalog never builds views, the views never list folders."""


def test_the_query_layer_imports_only_downward():
    graph = import_graph()
    layer = {*QUERY_LAYER_MAY_IMPORT, "sorl_monitor.read.query"}
    for module, allowed in QUERY_LAYER_MAY_IMPORT.items():
        assert graph[module] & layer <= allowed, module
    outside = {
        name for name, targets in graph.items() if name not in layer and targets & set(QUERY_LAYER_MAY_IMPORT)
    }
    assert outside == set(), "outside the query layer, import sorl_monitor.read.query (the facade)"
