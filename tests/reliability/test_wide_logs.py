"""``sorl summary`` takes time linear in the number of metric columns (issue 27, item 7): 1,000 columns
took 74 s before (2,000: over 2 minutes), each column a statement of one ``UNION ALL`` over the ``steps``
view. Synthetic values: column ``m{i}`` holds ``i + step``.

Each test times the summary of a log and of one 8× narrower, on this thread's CPU clock (DuckDB binds and
plans a statement on the calling thread; other processes on a busy machine do not inflate it as they do the
wall clock), and bounds their ratio: ~8 or less when linear, far more when quadratic, on any machine."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from sorl_monitor import Monitor, WriterConfig
from sorl_monitor.read.query import open_runs
from sorl_monitor.read.summary import metric_summary

COLUMNS = 1000
NARROW = 8
"""The narrower log has ``1 / NARROW`` of the columns."""
GROWTH_BOUND = 16
"""Summary CPU time of the wide log over the narrow one's: 8 at most when linear (4.3 to 5 measured for
1,000 columns, 7.8 to 8.8 for 5,000 keys), up to 64 when quadratic: 36 with the ``UNION ALL`` over the view
restored (0.65 s for 125 columns, 23 s for 1,000), 25 with each statement over all the keys' table restored
(0.45 s for 625 keys, 11 s for 5,000). 16 is 2× above linear and 1.5× to 2× below either bug."""


def summary_cpu_s(path: Path, run_id: str, repeats: int = 1):
    """``metric_summary`` of ``run_id`` in the run set at ``path``: the summary and its lowest thread CPU
    time over ``repeats`` runs (a one-off stall never makes a narrow log look slow)."""
    with open_runs(path) as runs:
        times = []
        for _ in range(repeats):
            started = time.thread_time()
            summary = metric_summary(runs, run_id)
            times.append(time.thread_time() - started)
    return summary, min(times)


def write_wide_log(folder: Path, columns: int) -> Path:
    log = folder / f"wide{columns}.jsonl"
    rows = [{"step": step, **{f"m{i}": float(i + step) for i in range(columns)}} for step in range(3)]
    log.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return log


@pytest.fixture(scope="module")
def wide_logs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("wide")
    return write_wide_log(folder, COLUMNS), write_wide_log(folder, COLUMNS // NARROW)


def test_a_summary_of_1000_columns_is_linear_in_columns_and_right(wide_logs, record_measurement):
    wide, narrow = wide_logs
    _, narrow_s = summary_cpu_s(narrow, narrow.stem, repeats=2)
    summary, summary_s = summary_cpu_s(wide, wide.stem)
    record_measurement(
        columns=COLUMNS, rows=3, summary_cpu_s=round(summary_s, 3), before_s=74,
        narrow_columns=COLUMNS // NARROW, narrow_cpu_s=round(narrow_s, 3),
    )  # fmt: skip
    # guards against a summary whose time grows with the square of the columns
    assert summary_s < GROWTH_BOUND * narrow_s, (summary_s, narrow_s)
    by_metric = {row["metric"]: row for row in summary.to_pylist()}
    assert len(by_metric) == COLUMNS
    assert by_metric["m7"] == {"metric": "m7", "n": 3, "min": 7.0, "median": 8.0, "max": 9.0, "last": 9.0}
    assert by_metric["m999"]["last"] == 1001.0


MONITOR_KEYS = 5000


def monitor_run(folder: Path, keys: int) -> Path:
    """A ``Monitor`` run of ``keys`` keys: key ``k{i}`` holds ``i + step``, three steps."""
    with Monitor(folder, f"wide{keys}", writer=WriterConfig(flush_interval_s=3600)) as mon:
        for step in range(3):
            mon.log_scalars(step, {f"k{i:05d}": float(i + step) for i in range(keys)})
    return folder / f"wide{keys}"


@pytest.mark.slow
def test_a_monitor_run_of_5000_keys_opens_and_summarises(tmp_path, record_measurement):
    """Issue 27, item 7: "a Monitor run with 5,000 keys hung". Synthetic values: key ``k{i:05d}`` holds
    ``i + step``, three steps through ``Monitor.log_scalars``."""
    narrow = monitor_run(tmp_path, MONITOR_KEYS // NARROW)
    _, narrow_s = summary_cpu_s(narrow, narrow.name, repeats=2)
    started = time.thread_time()
    run = monitor_run(tmp_path, MONITOR_KEYS)
    logged_s = time.thread_time() - started
    summary, summary_s = summary_cpu_s(run, run.name)
    record_measurement(
        keys=MONITOR_KEYS, steps=3, log_cpu_s=round(logged_s, 2), summary_cpu_s=round(summary_s, 2),
        narrow_keys=MONITOR_KEYS // NARROW, narrow_cpu_s=round(narrow_s, 3),
    )  # fmt: skip
    # 16.6 s before the per-batch tables, 4.8 s after (2-core machine, loaded): linear, 8× the keys at most 8×
    assert summary_s < GROWTH_BOUND * narrow_s, (summary_s, narrow_s)
    by_metric = {row["metric"]: row for row in summary.to_pylist()}
    assert {f"k{i:05d}" for i in range(MONITOR_KEYS)} <= set(by_metric)
    assert by_metric["k04999"] == {
        "metric": "k04999",
        "n": 3,
        "min": 4999.0,
        "median": 5000.0,
        "max": 5001.0,
        "last": 5001.0,
    }
