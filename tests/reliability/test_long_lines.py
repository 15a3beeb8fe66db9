"""``sorl ingest`` reads a long line in time linear in its length (it was quadratic: 256 MiB took 52 s)."""

from __future__ import annotations

import time
from pathlib import Path

from sorl_monitor import Monitor, WriterConfig
from sorl_monitor.integrations.verl import ingest_verl_jsonl
from sorl_monitor.read.query import open_runs

LINE_MIB = 128
SHORT_LINE_MIB = LINE_MIB // 4
"""Both lines are over glibc's largest mmap threshold (32 MiB): each copy of either costs the same per byte
(fresh pages), so linear code shows 4× the CPU time for 4× the length (a 16 MiB line reuses warm heap
pages and looked 2× cheaper per byte)."""
GROWTH_BOUND = 10
"""CPU time of the 4× longer line over the shorter one's: ~4 when linear (4.5 to 5.3 measured), ~16 and more
when quadratic (28 measured with the quadratic reader restored: 5.3 s for 0.19 s); 10 is 2× from linear and
3× from quadratic, and a ratio of two runs on one thread does not move with the machine's speed or load."""


def ingest_cpu_seconds(folder: Path, line_mib: int) -> tuple[float, list[int], list[int]]:
    """Ingest a verl log whose second line is ``line_mib`` MiB long; this thread's CPU time for it (which
    other processes on a busy machine do not inflate as they do the wall clock), its rows and bad lines."""
    log = folder / f"exp{line_mib}.jsonl"
    with open(log, "wb") as handle:
        handle.write(b'{"step": 1, "data": {"actor/pg_loss": 0.5}}\n')
        handle.write(b"x" * (line_mib << 20) + b"\n")  # e.g. a dumped sample, or a torn write
        handle.write(b'{"step": 2, "data": {"actor/pg_loss": 0.4}}\n')
    with Monitor(folder / "runs", f"exp{line_mib}", writer=WriterConfig(flush_interval_s=60)) as mon:
        cpu_started = time.thread_time()
        report = ingest_verl_jsonl(log, mon)
        cpu_seconds = time.thread_time() - cpu_started
    log.unlink()
    return cpu_seconds, report.rows, report.bad_lines


def test_a_128_mib_line_is_read_in_linear_time_and_skipped_as_unreadable(tmp_path, record_measurement):
    # the shorter line twice, the lower time kept: a one-off stall cannot make the longer line look linear
    short_s = min(ingest_cpu_seconds(tmp_path, SHORT_LINE_MIB)[0] for _ in range(2))
    long_s, rows, bad_lines = ingest_cpu_seconds(tmp_path, LINE_MIB)
    record_measurement(line_mib=LINE_MIB, cpu_seconds=round(long_s, 3), short_line_mib=SHORT_LINE_MIB,
                       short_cpu_seconds=round(short_s, 3), growth=round(long_s / short_s, 1))  # fmt: skip
    assert (rows, bad_lines) == (2, [2])
    # linear: 4× the length, ~4× the CPU time; quadratic (the line re-joined at each 1 MiB chunk): ~27×
    assert long_s < GROWTH_BOUND * short_s, (long_s, short_s)
    with open_runs(tmp_path / "runs") as runs:
        steps = runs.sql("SELECT run_id, step FROM steps ORDER BY step").to_pylist()
    assert [row["step"] for row in steps if row["run_id"] == f"exp{LINE_MIB}"] == [1, 2]
