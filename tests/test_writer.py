"""The writer is crash-safe, never raises into training, and readers never see a partial file."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from sorl_monitor import Monitor, MonitorWarning, WriterConfig
from sorl_monitor.read.query import open_runs
from sorl_monitor.schema import visible_parts
from sorl_monitor.write.compaction import Compactor
from sorl_monitor.write.writer import ParquetStreamWriter

ROOT = Path(__file__).resolve().parents[1]


def wait_for(predicate, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not met in time")
        time.sleep(0.05)


def parts(run: Path, table: str = "steps") -> list[Path]:
    return sorted((run / table / "rank=0").glob("part-*.parquet"))


def test_sigkill_mid_run_keeps_every_flushed_part_readable(tmp_path):
    run = tmp_path / "crash"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.helpers.stream_rows", str(tmp_path), "crash", "0.1"], env=env
    )
    try:
        wait_for(lambda: len(parts(run)) >= 5, timeout=120)  # the child starts slowly on a busy machine
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    flushed = {p: pq.read_metadata(p).num_rows for p in parts(run)}
    with open_runs(tmp_path) as runs:
        read = set(runs.files("steps"))
        n_steps = runs.sql("SELECT count(*) FROM steps").column(0)[0].as_py()
        distinct = runs.sql("SELECT count(DISTINCT step) FROM steps").column(0)[0].as_py()
        runs.sql("SELECT count(*) FROM turns").column(0)[0].as_py()
    assert {str(p) for p in flushed} <= read
    assert n_steps == sum(flushed.values()) == distinct
    steps = sorted(runs_steps(tmp_path))
    assert steps == list(range(len(steps)))  # no gap: everything before the last flush is there


def runs_steps(log_dir: Path) -> list[int]:
    with open_runs(log_dir) as runs:
        return runs.sql("SELECT step FROM steps").column(0).to_pylist()


def test_failing_target_drops_and_counts_rows_without_raising(tmp_path):
    with Monitor(tmp_path, "disk", writer=WriterConfig(flush_interval_s=0.05)) as mon:
        mon.log_scalars(0, {"loss": 1.0})
        assert mon.flush()
        steps_dir = tmp_path / "disk" / "steps"
        shutil.rmtree(steps_dir)
        steps_dir.write_text("not a folder any more")  # every later write fails
        for step in range(1, 4):
            mon.log_scalars(step, {"loss": 1.0})
        mon.flush()
        with pytest.warns(MonitorWarning, match="dropping rows"):
            mon.log_scalars(4, {"loss": 1.0})
        stats = mon.writer_stats()
        assert stats.rows_dropped >= 3 and stats.write_errors >= 1
        assert mon.recent_steps().column("monitor_dropped_rows").to_pylist()[-1] >= 3


def test_full_queue_drops_instead_of_blocking(tmp_path):
    # the writer takes nothing from its queue for an hour: a submit that waited for room would wait that long
    writer = ParquetStreamWriter(tmp_path, max_pending_rows=50, flush_rows=10**9, flush_interval_s=3600)
    accepted: list[bool] = []
    caller = threading.Thread(
        target=lambda: accepted.extend(writer.submit("steps", [{"step": i}], 1) for i in range(100)),
        daemon=True,
    )
    caller.start()
    caller.join(timeout=60)
    # never blocks the caller: all 100 returned with the queue full, a yes or no
    assert not caller.is_alive(), len(accepted)
    writer.close()
    stats = writer.stats()
    assert accepted == [True] * 50 + [False] * 50
    assert stats.rows_dropped == 50 and stats.rows_written == 50
    assert "queue full" in stats.last_error


def test_reader_during_writes_never_sees_errors_or_partial_files(tmp_path):
    stop = threading.Event()
    errors: list[BaseException] = []

    def write() -> None:
        try:
            with Monitor(tmp_path, "live", writer=WriterConfig(flush_interval_s=0.02)) as mon:
                step = 0
                while not stop.is_set():
                    mon.log_scalars(step, {"loss": float(step)})
                    step += 1
                    time.sleep(0.001)
        except BaseException as error:  # noqa: BLE001
            errors.append(error)

    thread = threading.Thread(target=write)
    thread.start()
    wait_for(lambda: len(parts(tmp_path / "live")) >= 2)
    counts = []
    with open_runs(tmp_path) as runs:
        # at least 2 s, and on a busy machine until the count grew (at most 120 s)
        deadline, give_up = time.monotonic() + 2.0, time.monotonic() + 120
        while time.monotonic() < give_up and (
            time.monotonic() < deadline or len(counts) < 2 or counts[-1]["n"] == counts[0]["n"]
        ):
            runs.refresh()
            counts.append(
                runs.sql(
                    "SELECT count(*) - count(DISTINCT step) AS dup, count(*) AS n FROM steps"
                ).to_pylist()[0]
            )
    stop.set()
    thread.join()
    assert not errors
    assert all(c["dup"] == 0 for c in counts)
    totals = [c["n"] for c in counts]
    assert totals == sorted(totals) and totals[-1] > totals[0]


def test_small_parts_are_compacted_and_every_row_is_read_once(tmp_path):
    writer = ParquetStreamWriter(tmp_path, compact_parts=4)
    for step in range(10):
        writer.submit("steps", [{"step": step, "loss": float(step)}], 1)
        assert writer.flush()
    folder = tmp_path / "steps" / "rank=0"
    # merged on its own thread: the merged part is written first, the parts it replaced deleted after
    wait_for(lambda: len(list(folder.iterdir())) < 10)
    names_before_close = sorted(p.name for p in folder.iterdir())
    writer.close()
    names = sorted(p.name for p in (tmp_path / "steps" / "rank=0").iterdir())
    assert len(names_before_close) < 10  # compacted while running
    assert names == ["part-000000-000009.parquet"]  # and whatever was left, at close
    with open_runs(tmp_path) as runs:
        assert runs.sql("SELECT step FROM steps ORDER BY step").column(0).to_pylist() == list(range(10))


def test_compaction_merges_by_level_so_each_row_is_rewritten_a_few_times_not_once_per_merge(tmp_path):
    merged_rows = []

    class CountingCompactor(Compactor):
        def merge(self, parts, path):
            rows = super().merge(parts, path)
            merged_rows.append(rows)
            return rows

    class CountingWriter(ParquetStreamWriter):
        compactor_class = CountingCompactor

    writer = CountingWriter(tmp_path, compact_parts=4)
    for step in range(64):
        writer.submit("steps", [{"step": step}], 1)
        assert writer.flush()
    writer.close()
    # levels of 4 parts: a row is merged into ≥ 4-, ≥ 16- and ≥ 64-row parts, then at most once at close;
    # merging the growing merged part with every 3 new ones instead rewrites ≈ 64² / 6 rows
    assert sum(merged_rows) <= 4 * 64
    assert [p.name for p in parts(tmp_path)] == ["part-000000-000063.parquet"]
    with open_runs(tmp_path) as runs:
        assert runs.sql("SELECT step FROM steps ORDER BY step").column(0).to_pylist() == list(range(64))


def test_a_compacted_part_hides_the_parts_it_replaced_in_its_own_folder_only():
    folder0, folder1 = "run/steps/rank=0", "run/steps/rank=1"
    listed = [
        f"{folder0}/part-000000.parquet",
        f"{folder0}/part-000001.parquet",
        f"{folder0}/part-000000-000001.parquet",
        f"{folder0}/part-000002.parquet",
        f"{folder1}/part-000000.parquet",
        f"{folder0}/notes.txt",
    ]
    assert sorted(visible_parts(listed)) == sorted(
        [
            f"{folder0}/part-000000-000001.parquet",
            f"{folder0}/part-000002.parquet",
            f"{folder1}/part-000000.parquet",
        ]
    )


def test_readers_see_no_duplicates_or_errors_while_parts_are_compacted(tmp_path):
    # a part every 50 ms, a merge every 2–3 parts (in a run: every 32 parts, 2 s apart)
    writer = ParquetStreamWriter(tmp_path / "run", compact_parts=3, flush_interval_s=0.05)
    stop = threading.Event()

    def write() -> None:
        step = 0
        while not stop.is_set():
            writer.submit("steps", [{"run_id": "run", "step": step}], 1)
            step += 1
            time.sleep(0.002)
        writer.close()

    thread = threading.Thread(target=write)
    thread.start()
    wait_for(
        lambda: any("-" in p.name for p in (tmp_path / "run" / "steps" / "rank=0").glob("part-*")),
        timeout=120,
    )
    seen = []
    with open_runs(tmp_path) as runs:
        # at least 2 s and 10 reads, and on a busy machine until the count grew (at most 120 s)
        deadline, give_up = time.monotonic() + 2.0, time.monotonic() + 120
        while time.monotonic() < give_up and (
            time.monotonic() < deadline or len(seen) < 10 or seen[-1]["n"] == seen[0]["n"]
        ):
            runs.refresh()
            seen.append(
                runs.sql(
                    "SELECT count(*) - count(DISTINCT step) AS dup, count(*) AS n FROM steps"
                ).to_pylist()[0]
            )
    stop.set()
    thread.join()
    assert all(s["dup"] == 0 for s in seen)
    counts = [s["n"] for s in seen]
    assert counts == sorted(counts) and counts[-1] > counts[0]


def test_float_columns_are_written_plain_and_key_columns_with_dictionaries_and_statistics(tmp_path):
    writer = ParquetStreamWriter(tmp_path, compact_parts=0)
    rows = [{"run_id": "r", "step": s, "ratio_mean": 1.0 + s / 7, "loss": float("nan")} for s in range(50)]
    writer.submit("steps", rows, len(rows))
    writer.close()

    (part,) = parts(tmp_path)
    chunks = {}
    metadata = pq.ParquetFile(part).metadata.row_group(0)
    for i in range(metadata.num_columns):
        chunk = metadata.column(i)
        chunks[chunk.path_in_schema] = chunk
    for name in ("ratio_mean", "loss"):  # no float dictionary to build and drop; no NaN-blind statistics
        assert not any("DICTIONARY" in e for e in chunks[name].encodings), chunks[name].encodings
        assert not chunks[name].is_stats_set
    for name in ("run_id", "step"):
        assert any("DICTIONARY" in e for e in chunks[name].encodings)
        assert chunks[name].is_stats_set
