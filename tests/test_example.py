"""The README's plain-PyTorch example runs and its run reads back (a real PPO loop, reused rollouts)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from sorl_monitor.read.query import open_runs

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "plain_pytorch.py"


def test_plain_pytorch_example_logs_a_readable_run(tmp_path):
    subprocess.run(
        [sys.executable, str(EXAMPLE), "--updates", "4", "--log-dir", str(tmp_path), "--run-name", "ex"],
        check=True,
        capture_output=True,
        timeout=120,
    )
    with open_runs(tmp_path / "ex") as runs:
        stats = runs.sql(
            "SELECT count(*) n, max(ppo_epoch) e, max(clip_frac) c, min(ratio_min) lo FROM steps"
        ).to_pylist()[0]
        n_turns = runs.sql("SELECT count(DISTINCT turn_idx) FROM turns").column(0)[0].as_py()
    assert stats["n"] == 4 * 4 and stats["e"] == 3
    assert stats["lo"] < 1.0  # reused rollouts moved the ratios off 1
    assert n_turns == 3


def test_example_attaches_the_monitor_in_at_most_five_statements_all_marked():
    """Count the statements that touch sorl-monitor (its import, ``Monitor``, the ``mon`` object), not the
    marks: the README promises a few lines, and the ``# sorl`` marks must point at exactly those."""
    source = EXAMPLE.read_text()
    touching = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.stmt) and not isinstance(node, ast.FunctionDef | ast.For | ast.With | ast.If):
            names = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
            module = getattr(node, "module", None) or ""
            if names & {"mon", "Monitor"} or module.startswith("sorl_monitor"):
                touching.add((node.lineno, node.end_lineno))
    marked = {n for n, line in enumerate(source.splitlines(), 1) if line.rstrip().endswith("# sorl")}
    assert 3 <= len(touching) <= 5, sorted(touching)
    assert marked and all(any(start <= mark <= end for start, end in touching) for mark in marked)
