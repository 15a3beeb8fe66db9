"""A reader (dashboard, ``sorl watch``) querying a run while another process trains into it, for seconds."""

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

READ_FOR_S = 4.0
DUPLICATES_SQL = """
SELECT (SELECT count(*) - count(DISTINCT step) FROM steps) AS steps,
       (SELECT count(*) - count(DISTINCT (step, sample_id, turn_idx)) FROM turns) AS turns,
       (SELECT count(*) - count(DISTINCT (step, module)) FROM modules) AS modules,
       (SELECT count(*) FROM steps) AS step_rows,
       (SELECT count(*) FROM turns) AS turn_rows
"""


@pytest.mark.slow
def test_reading_while_a_trainer_writes_sees_no_errors_no_duplicates_and_only_growth(
    tmp_path, record_measurement
):
    progress = tmp_path / "progress"
    progress.write_bytes(bytes(PROGRESS.size))
    command = [
        sys.executable,
        "-m",
        "tests.helpers.crash_child",
        str(tmp_path),
        "live",
        "0.05",
        str(progress),
    ]
    writer = subprocess.Popen(command, env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        steps_dir = tmp_path / "live" / "steps" / "rank=0"
        deadline = time.monotonic() + 120
        while len(list(steps_dir.glob("part-*.parquet"))) < 2:
            assert writer.poll() is None and time.monotonic() < deadline
            time.sleep(0.02)
        seen, latencies = [], []
        with warnings.catch_warnings():
            warnings.simplefilter("error", CorruptPartWarning)
            with open_runs(tmp_path) as runs:
                stop_at = time.monotonic() + READ_FOR_S
                while time.monotonic() < stop_at:
                    started = time.perf_counter()
                    runs.refresh()
                    seen.append(runs.sql(DUPLICATES_SQL).to_pylist()[0])
                    latencies.append(time.perf_counter() - started)
        assert writer.poll() is None  # the writer ran all along
    finally:
        writer.send_signal(signal.SIGKILL)
        writer.wait()
    assert all(s["steps"] == 0 and s["turns"] == 0 and s["modules"] == 0 for s in seen)
    rows = [s["step_rows"] for s in seen]
    assert rows == sorted(rows) and rows[-1] > rows[0]
    record_measurement(
        read_for_s=READ_FOR_S, queries=len(seen), step_rows_first=rows[0], step_rows_last=rows[-1],
        turn_rows_last=seen[-1]["turn_rows"], slowest_refresh_and_query_s=round(max(latencies), 3),
        median_refresh_and_query_s=round(sorted(latencies)[len(latencies) // 2], 4),
    )  # fmt: skip
