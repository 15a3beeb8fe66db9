"""The package's layering, as docs/architecture.md draws it: one rule per folder, no import cycle, and every module
imports in a fresh interpreter.

A module's *folder* is the sub-package of ``sorl_monitor`` it lives in (``sorl_monitor.read.sql.sandbox`` is in
``read``); a module directly in ``sorl_monitor`` is a *shared leaf* (``schema``, ``settings``, …). A module may
import its own folder, the shared leaves, and the folders its folder's rule names (``MAY_IMPORT``); a shared leaf
imports only shared leaves; the package's ``__init__`` imports nothing when it runs (its exports load lazily).

The graph is read from the source (``ast``), over the packages ``pyproject.toml`` installs: an edge ``a → b`` for
each ``import b`` / ``from b import x`` in ``a`` (at any depth, lazy imports included, imports under ``if
TYPE_CHECKING:`` left out: they never run), where ``from pkg import sub`` points at the submodule ``pkg.sub``, not
at ``pkg``'s ``__init__``.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "sorl_monitor"

MAY_IMPORT: dict[str, set[str]] = {
    "logs": set(),
    "write": set(),
    "read": {"logs"},
    "diagnose": {"read", "logs"},
    "remedy": {"write", "diagnose"},
    "figures": {"read", "diagnose"},
    "integrations": {"write", "logs", "diagnose", "remedy"},
    "trainer": {"write", "diagnose", "remedy"},
    "dashboard": {"read", "diagnose", "figures", "logs"},
    "cli": {"write", "logs", "read", "diagnose", "remedy", "figures", "trainer", "dashboard"},
}
"""Each folder's rule: the other folders its modules may import (besides their own folder and the shared leaves).
The write path never reaches the read path (a trainer pays for neither DuckDB views nor plotly); the read path
never reaches ``write/``, ``integrations/`` or the trainer; nothing but ``cli/`` imports ``dashboard/``, and
nothing imports ``cli/``."""


def package_modules() -> dict[str, Path]:
    """Each module name of the installed packages → its source file (``[tool.setuptools]`` packages, dirs)."""
    setup = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    dirs = setup.get("package-dir", {})
    modules = {}
    for package in setup["packages"]:
        modules[package] = package_folder(package, dirs) / "__init__.py"
        for file in package_folder(package, dirs).glob("*.py"):
            if file.name != "__init__.py":
                modules[f"{package}.{file.stem}"] = file
    return modules


def package_folder(package: str, dirs: dict[str, str]) -> Path:
    """Where ``package``'s files are (``package-dir`` maps ``sorl_monitor.cli`` to ``cli/``)."""
    top = next(
        (p for p in sorted(dirs, key=len, reverse=True) if package == p or package.startswith(p + ".")), None
    )
    if top is None:
        return ROOT / package.replace(".", "/")
    return ROOT / dirs[top] / package[len(top) + 1 :].replace(".", "/")


def runtime_nodes(tree: ast.AST) -> list[ast.AST]:
    """Every node of ``tree`` but those under ``if TYPE_CHECKING:``."""
    found, todo = [], [tree]
    while todo:
        node = todo.pop()
        found.append(node)
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                todo.extend(child.orelse)
            else:
                todo.append(child)
    return found


def imported_modules(name: str, file: Path, known: set[str]) -> set[str]:
    """The package's own modules that ``file`` (module ``name``) imports when it runs."""
    found = set()
    for node in runtime_nodes(ast.parse(file.read_text(), str(file))):
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


def import_graph() -> dict[str, set[str]]:
    modules = package_modules()
    return {name: imported_modules(name, file, set(modules)) for name, file in modules.items()}


def folder_of(module: str, graph: dict[str, set[str]]) -> str | None:
    """The folder of ``module`` (``read`` for ``sorl_monitor.read.sql.sandbox``); ``None`` for a shared leaf or
    the package itself."""
    parts = module.split(".")
    if len(parts) < 2:
        return None
    if len(parts) == 2 and not any(other.startswith(module + ".") for other in graph):
        return None  # a module directly in the package: a shared leaf
    return parts[1]


def crossings(graph: dict[str, set[str]], rules: dict[str, set[str]]) -> dict[str, list[str]]:
    """Each module that imports what its folder's rule does not allow → those modules."""
    found = {}
    for module, targets in graph.items():
        folder = folder_of(module, graph)
        if module == PACKAGE:
            wrong = sorted(targets)  # the facade loads its exports lazily: no import at run time
        elif folder is None:
            wrong = sorted(t for t in targets if t != PACKAGE and folder_of(t, graph) is not None)
        else:
            allowed = {folder, *rules.get(folder, ())}
            wrong = sorted(t for t in targets if folder_of(t, graph) not in (None, *allowed))
        if wrong:
            found[module] = wrong
    return found


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan), each sorted."""
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


def test_every_module_imports_only_what_its_folders_rule_allows():
    graph = import_graph()
    assert {folder_of(m, graph) for m in graph} - {None} == set(MAY_IMPORT)
    assert crossings(graph, MAY_IMPORT) == {}


def test_the_folder_rules_are_layers_with_no_cycle():
    assert cycles({folder: set(allowed) for folder, allowed in MAY_IMPORT.items()}) == []
    assert all(allowed <= set(MAY_IMPORT) for allowed in MAY_IMPORT.values())
    assert not any("cli" in allowed for allowed in MAY_IMPORT.values())
    assert not any(write_side in MAY_IMPORT["read"] for write_side in ("write", "integrations", "trainer"))


def test_the_folder_check_finds_a_crossing_and_a_leaf_that_reaches_up():
    graph = {
        "sorl_monitor": set(),
        "sorl_monitor.schema": set(),
        "sorl_monitor.metric_names": {"sorl_monitor.read.query"},  # a leaf importing a folder
        "sorl_monitor.write": set(),
        "sorl_monitor.write.monitor": {
            "sorl_monitor.metric_names",
            "sorl_monitor.read.views",
        },  # write → read
        "sorl_monitor.read": set(),
        "sorl_monitor.read.query": {
            "sorl_monitor.read.views",
            "sorl_monitor.logs.table",
            "sorl_monitor.schema",
        },
        "sorl_monitor.read.views": set(),
        "sorl_monitor.logs": set(),
        "sorl_monitor.logs.table": set(),
    }
    assert folder_of("sorl_monitor.read.query", graph) == "read"
    assert (
        folder_of("sorl_monitor.schema", graph) is None and folder_of("sorl_monitor.write", graph) == "write"
    )
    assert crossings(graph, MAY_IMPORT) == {
        "sorl_monitor.metric_names": ["sorl_monitor.read.query"],
        "sorl_monitor.write.monitor": ["sorl_monitor.read.views"],
    }


def test_type_checking_imports_are_not_edges(tmp_path):
    file = tmp_path / "facade.py"
    file.write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.write import Monitor\n"
        "else:\n    import pkg.read\nimport pkg.schema\n"
    )
    known = {"pkg.write", "pkg.read", "pkg.schema"}
    assert imported_modules("pkg", file, known) == {"pkg.read", "pkg.schema"}


def test_the_package_has_no_import_cycle():
    graph = import_graph()
    assert "sorl_monitor.diagnose.detectors.runner" in graph and "sorl_monitor.cli.main" in graph
    assert cycles(graph) == []


def test_the_cycle_check_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_every_package_folder_is_installed():
    setup = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    installed = {package_folder(p, setup.get("package-dir", {})) for p in setup["packages"]}
    folders = {
        init.parent for top in (PACKAGE, "cli", "dashboard") for init in (ROOT / top).rglob("__init__.py")
    }
    assert folders - installed == set()


def test_every_folder_has_its_role_in_one_line_of_the_architecture_doc():
    """docs/architecture.md's folder table: a row per folder of the package (sub-folders included)."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    rows = set(re.findall(r"^\| `([\w/]+)/` \|", text, re.MULTILINE))
    folders = {
        str(init.parent.relative_to(ROOT / PACKAGE))
        for init in (ROOT / PACKAGE).rglob("__init__.py")
        if init.parent != ROOT / PACKAGE
    }
    assert folders | {"cli", "dashboard"} <= rows


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
