"""The public API: every name of ``sorl_monitor.__all__`` loads on first use, each lazy export is also imported
under ``TYPE_CHECKING`` from the module it loads from (so editors and type checkers see its real type), and the
read side's names load without torch."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import sorl_monitor

INIT = Path(sorl_monitor.__file__)


def test_every_public_name_loads():
    for name in sorl_monitor.__all__:
        assert getattr(sorl_monitor, name) is not None, name
    assert set(sorl_monitor.__all__) == {*sorl_monitor._EXPORTS, "__version__"}
    assert sorl_monitor.open_runs.__annotations__["return"] in ("RunSet", sorl_monitor.RunSet)


def test_each_lazy_export_is_typed_from_the_module_it_loads_from():
    tree = ast.parse(INIT.read_text())
    typed = {}
    for node in tree.body:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for statement in node.body:
                assert isinstance(statement, ast.ImportFrom)
                typed.update({alias.name: statement.module for alias in statement.names})
    assert typed == sorl_monitor._EXPORTS


def test_the_read_side_of_the_api_loads_without_torch():
    script = (
        "import sys, sorl_monitor as s\n"
        "s.open_runs, s.RunSet, s.detect, s.DetectorConfig, s.postmortem, s.PostmortemConfig, s.Verdict, s.CtnGuard\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
