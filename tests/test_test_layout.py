"""Test code is layered: test modules import shared code from ``tests/helpers/`` only (never another test
module or a ``conftest``), helpers import only helpers, and ``benchmarks/`` and ``experiments/`` import no
test code. Read from the source (``ast``), lazy imports included."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def imported(file: Path) -> set[str]:
    """Every absolute module name ``file`` imports (``from a import b`` counts as ``a`` and ``a.b``)."""
    names = set()
    for node in ast.walk(ast.parse(file.read_text(), str(file))):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
    return names


def is_test_code(name: str) -> bool:
    return name == "tests" or name.startswith("tests.")


def allowed(name: str) -> bool:
    """``tests.helpers`` and its modules (``from tests.helpers import x`` yields both names)."""
    return name in ("tests.helpers",) or name.startswith("tests.helpers.")


def test_tests_import_shared_code_from_helpers_only():
    wrong = {
        f"{file.relative_to(ROOT)}: {name}"
        for file in sorted((ROOT / "tests").rglob("*.py"))
        for name in imported(file)
        if is_test_code(name) and name != "tests" and not allowed(name)
    }
    assert not wrong, "import shared test code from tests/helpers/:\n" + "\n".join(sorted(wrong))


@pytest.mark.parametrize("folder", ["benchmarks", "experiments"])
def test_benchmarks_and_experiments_import_no_test_code(folder):
    files = sorted((ROOT / folder).rglob("*.py"))
    assert files, f"{folder}/ has no Python files"
    wrong = {
        f"{file.relative_to(ROOT)}: {name}" for file in files for name in imported(file) if is_test_code(name)
    }
    assert not wrong, "move what they need into the library or a module of their own:\n" + "\n".join(
        sorted(wrong)
    )
