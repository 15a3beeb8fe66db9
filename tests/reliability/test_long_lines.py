"""``sorl ingest`` reads a long line in time linear in its length (it was quadratic: 256 MiB took 52 s)."""

from __future__ import annotations

import time

from sorl_monitor import Monitor
from sorl_monitor.integrations.verl import ingest_verl_jsonl
from sorl_monitor.query import open_runs

LINE_MIB = 128


def test_a_128_mib_line_is_read_in_linear_time_and_skipped_as_unreadable(tmp_path, record_measurement):
    log = tmp_path / "exp.jsonl"
    with open(log, "wb") as handle:
        handle.write(b'{"step": 1, "data": {"actor/pg_loss": 0.5}}\n')
        handle.write(b"x" * (LINE_MIB << 20) + b"\n")  # e.g. a dumped sample, or a torn write
        handle.write(b'{"step": 2, "data": {"actor/pg_loss": 0.4}}\n')
    with Monitor(tmp_path / "runs", "exp", flush_interval_s=60) as mon:
        started, cpu_started = time.perf_counter(), time.thread_time()
        report = ingest_verl_jsonl(log, mon)
        seconds, cpu_seconds = time.perf_counter() - started, time.thread_time() - cpu_started
    record_measurement(line_mib=LINE_MIB, seconds=round(seconds, 2), cpu_seconds=round(cpu_seconds, 2))
    assert (report.rows, report.bad_lines) == (2, [2])
    # this thread's CPU time, which other processes on a busy machine do not inflate as they do the wall clock
    assert cpu_seconds < 4, cpu_seconds  # quadratic: ~13 s on a 2-core machine
    with open_runs(tmp_path / "runs") as runs:
        assert runs.sql("SELECT step FROM steps ORDER BY step").column(0).to_pylist() == [1, 2]
