"""SIGKILL of a training process mid-write: earlier parts intact, at most about one flush interval lost."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import warnings

import pytest

from sorl_monitor.read.query import CorruptPartWarning, open_runs
from tests.helpers.crash_child import PROGRESS
from tests.helpers.paths import ROOT

FLUSH_INTERVAL_S = 0.5
SLACK_S = 2.0
"""A part write and the scheduling of a busy machine on top of the interval: ~0.4 s lost in all here idle,
1.1 s seen at a load of 16 on 2 cores; 2 s holds 3× slower and loaded."""
KILL_AFTER_S = (0.9, 1.35, 3.15)
"""Seconds after the first part: anywhere in a flush cycle, and once past ``FLUSH_INTERVAL_S + SLACK_S``, so a
writer that stops after its first part (everything since lost) fails the bound, however fast the machine."""


def kill_mid_run(tmp_path, run_name: str, kill_after_s: float) -> dict:
    progress = tmp_path / f"{run_name}.progress"
    progress.write_bytes(bytes(PROGRESS.size))
    command = [sys.executable, "-m", "tests.helpers.crash_child", str(tmp_path), run_name,
               str(FLUSH_INTERVAL_S), str(progress)]  # fmt: skip
    proc = subprocess.Popen(command, env={**os.environ, "PYTHONPATH": str(ROOT)})
    steps_dir = tmp_path / run_name / "steps" / "rank=0"
    deadline = time.monotonic() + 120
    while not any(steps_dir.glob("part-*.parquet")):
        assert proc.poll() is None and time.monotonic() < deadline, "the child never wrote a part"
        time.sleep(0.01)
    time.sleep(kill_after_s)
    killed_at = time.time()
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    last_logged, _ = PROGRESS.unpack(progress.read_bytes())
    return {"killed_at": killed_at, "last_logged": last_logged}


@pytest.mark.slow
def test_sigkill_loses_only_the_last_flush_interval_and_every_part_reads(tmp_path, record_measurement):
    results = []
    for index, kill_after in enumerate(KILL_AFTER_S):
        name = f"crash{index}"
        killed = kill_mid_run(tmp_path, name, kill_after)
        run = tmp_path / name
        leftovers = sorted(p.name for p in run.glob("*/rank=0/*.tmp"))
        with warnings.catch_warnings():
            warnings.simplefilter("error", CorruptPartWarning)
            with open_runs(run) as runs:
                steps = runs.sql("SELECT step, wall_time FROM steps ORDER BY step").to_pylist()
                turn_steps = runs.sql("SELECT DISTINCT step FROM turns ORDER BY step").column(0).to_pylist()
                module_steps = (
                    runs.sql("SELECT DISTINCT step FROM modules ORDER BY step").column(0).to_pylist()
                )
        persisted = [row["step"] for row in steps]
        assert persisted == list(range(len(persisted)))  # no gap, no duplicate
        rate = len(persisted) / max(steps[-1]["wall_time"] - steps[0]["wall_time"], 1e-9)
        # Tables flush on their own clocks, so they may end up to about one flush interval apart.
        table_skew = 1 + rate * (2 * FLUSH_INTERVAL_S + 0.5)
        for other in (turn_steps, module_steps):
            assert other == list(range(len(other)))
            assert abs(len(other) - len(persisted)) <= table_skew, (len(other), len(persisted), rate)
        lost_rows = killed["last_logged"] - persisted[-1]
        lost_s = killed["killed_at"] - steps[-1]["wall_time"]
        results.append({"kill_after_first_part_s": kill_after, "updates_persisted": len(persisted),
                        "updates_lost": lost_rows, "seconds_lost": round(lost_s, 3),
                        "updates_per_s": round(rate, 1), "tmp_files_left": leftovers,
                        "turn_updates_persisted": len(turn_steps), "module_updates_persisted": len(module_steps)})  # fmt: skip
        assert lost_s <= FLUSH_INTERVAL_S + SLACK_S, results[-1]  # one interval, plus a write and scheduling
    record_measurement(flush_interval_s=FLUSH_INTERVAL_S, kills=results)
