"""The README's plain-PyTorch example runs and its run reads back (a real PPO loop, reused rollouts)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from sorl_monitor.query import open_runs

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


def test_example_adds_at_most_five_monitor_lines():
    marked = [line for line in EXAMPLE.read_text().splitlines() if line.rstrip().endswith("# sorl")]
    assert 1 <= len(marked) <= 5
