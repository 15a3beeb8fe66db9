"""Test code is layered: test modules import shared code from ``tests/helpers/`` only (never another test
module or a ``conftest``), helpers import only helpers, ``benchmarks/`` and ``experiments/`` import no test
code, and the tests of ``experiments/``'s research scripts are in ``tests/experiments/``. Read from the source
(``ast``), lazy imports included."""

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


def test_tests_of_the_research_scripts_live_in_tests_experiments():
    """A test that loads a script of ``experiments/`` (by its file name) is in ``tests/experiments/``; tests
    elsewhere may read the corpus and results, not run the scripts."""
    scripts = {file.name for file in (ROOT / "experiments").glob("*.py")}
    outside = {
        str(file.relative_to(ROOT))
        for file in sorted((ROOT / "tests").rglob("*.py"))
        if ROOT / "tests" / "experiments" not in file.parents
        for node in ast.walk(ast.parse(file.read_text(), str(file)))
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and Path(node.value).name in scripts
    }
    assert not outside, "move them to tests/experiments/:\n" + "\n".join(sorted(outside))
    assert (ROOT / "tests" / "experiments" / "__init__.py").exists()
