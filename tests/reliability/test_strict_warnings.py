"""Under ``python -W error`` the monitor's own warnings never raise into the training loop."""

from __future__ import annotations

import os
import subprocess
import sys

from sorl_monitor.read.query import open_runs
from tests.helpers.paths import ROOT

TRAINING = """
import sys, torch
from sorl_monitor import Monitor, WriterConfig
with Monitor(sys.argv[1], "strict", writer=WriterConfig(flush_interval_s=60)) as mon:
    mon.log_scalars(2**70, {"loss": 1.0})  # a step the schema cannot hold: refused with a warning
    mon.log_update(logp=torch.zeros(2, 3), old_logp=torch.zeros(2, 3), mask=torch.ones(3, 2))  # shapes
    mon.log_scalars(None, {"loss": 2.0})
print("training went on")
"""


def test_monitor_warnings_under_w_error_reach_stderr_not_the_training_loop(tmp_path):
    result = subprocess.run(
        [sys.executable, "-W", "error", "-c", TRAINING, str(tmp_path)],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "training went on" in result.stdout
    assert "MonitorWarning: sorl-monitor log_scalars failed" in result.stderr
    assert "Traceback" not in result.stderr
    with open_runs(tmp_path / "strict") as runs:
        rows = runs.sql("SELECT loss, monitor_errors, status FROM steps, runs").to_pylist()
    assert rows == [{"loss": 2.0, "monitor_errors": 2.0, "status": "finished"}]
