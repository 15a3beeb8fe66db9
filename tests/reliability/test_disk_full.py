"""A full disk: training goes on, the monitor counts what it dropped, and writes resume once space frees up."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
import torch

from sorl_monitor import Monitor, MonitorWarning, WriterConfig
from sorl_monitor.read.query import open_runs
from tests.helpers.paths import ROOT

TMPFS_BYTES = 1 << 20


@pytest.fixture
def small_disk(tmp_path):
    """A 1 MiB tmpfs mounted for the test (skipped where mounting is not permitted)."""
    mount_point = tmp_path / "small_disk"
    mount_point.mkdir()
    mount = shutil.which("mount")
    if mount is None:
        pytest.skip("no mount command")
    done = subprocess.run(
        [mount, "-t", "tmpfs", "-o", f"size={TMPFS_BYTES}", "tmpfs", str(mount_point)], capture_output=True
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({done.stderr.decode().strip() or 'not permitted'})")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


def fill(folder: Path) -> Path:
    """Write a file until the disk says ENOSPC."""
    filler = folder / "filler"
    with open(filler, "wb", buffering=0) as handle:
        try:
            while True:
                handle.write(b"\0" * 4096)
        except OSError:
            pass
    return filler


def update(mon: Monitor, step: int) -> float:
    logp = -torch.rand(32, 48)
    mask = torch.tensor([1, 1, 1, 1, 0, 0] * 8).repeat(32, 1)
    started = time.perf_counter()
    mon.log_update(logp=logp, old_logp=logp + 0.1 * torch.randn(32, 48), mask=mask, step=step)
    return time.perf_counter() - started


@pytest.mark.slow
def test_a_full_tmpfs_drops_counted_rows_and_writes_resume_when_space_frees(small_disk, record_measurement):
    mon = Monitor(small_disk, "full", writer=WriterConfig(flush_interval_s=0.05))
    for step in range(5):
        update(mon, step)
    assert mon.flush()
    filler = fill(small_disk)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        timings = []
        for step in range(5, 45):
            timings.append(update(mon, step))
            time.sleep(0.005)
        mon.flush()
        full_stats = mon.writer_stats()
        filler.unlink()
        for step in range(45, 50):
            update(mon, step)
        assert mon.flush()
        mon.close()
    assert any(issubclass(w.category, MonitorWarning) and "dropping rows" in str(w.message) for w in caught)
    assert full_stats.rows_dropped > 0 and full_stats.write_errors > 0
    assert not list(small_disk.glob("full/*/rank=0/*.tmp"))
    with open_runs(small_disk / "full") as runs:
        steps = runs.sql("SELECT step, monitor_dropped_rows FROM steps ORDER BY step").to_pylist()
    written = [row["step"] for row in steps]
    assert written[:5] == list(range(5)) and written[-5:] == list(range(45, 50))
    assert steps[-1]["monitor_dropped_rows"] >= full_stats.rows_dropped  # the loss is on record in the run
    assert json.loads((small_disk / "full" / "run.json").read_text())["status"] == "finished"
    record_measurement(
        disk_bytes=TMPFS_BYTES, updates_while_full=40, step_rows_lost=40 - sum(5 <= s < 45 for s in written),
        rows_dropped_all_tables=full_stats.rows_dropped, write_errors=full_stats.write_errors,
        slowest_log_update_while_full_s=round(max(timings), 4), last_error=full_stats.last_error,
    )  # fmt: skip


def test_writes_past_a_file_size_limit_fail_without_stopping_training(tmp_path, record_measurement):
    limit = 24 * 1024
    done = subprocess.run(
        [sys.executable, "-m", "tests.helpers.fsize_child", str(tmp_path), str(limit), "30"],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["rows_dropped"] > 0 and summary["write_errors"] > 0
    assert "File too large" in summary["last_error"]
    with open_runs(tmp_path / "fsize") as runs:
        steps = runs.sql("SELECT count(*) FROM steps").column(0)[0].as_py()
    assert steps == 30  # the small steps parts fit; the big turns parts are the ones dropped
    record_measurement(file_size_limit_bytes=limit, **summary)
