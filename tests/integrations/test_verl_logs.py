"""verl's metrics dicts: the tracking-backend adapter and ``sorl ingest`` of verl files (once and --follow)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from sorl_monitor import Monitor, MonitorWarning
from sorl_monitor.cli.main import app
from sorl_monitor.integrations.verl import SorlTracking, ingest_verl_jsonl, install_tracking_backend
from sorl_monitor.read.query import open_runs
from tests.helpers.verl_metrics import record, verl_metrics

ROOT = Path(__file__).resolve().parents[2]


def steps_of(log_dir: Path, columns: str = "step") -> list[dict]:
    with open_runs(log_dir) as runs:
        return runs.sql(f"SELECT {columns} FROM steps ORDER BY step").to_pylist()


def test_tracking_adapter_writes_one_row_per_log_call_under_schema_names(tmp_path):
    tracker = SorlTracking(tmp_path, "track", config={"algorithm": {"adv_estimator": "grpo"}})
    for step in (1, 2, 3):
        tracker.log(data=verl_metrics(step), step=step)
    tracker.finish()
    rows = steps_of(tmp_path, "step, clip_frac_active, dual_clip_frac, kl_old_k1, grad_norm, reward_mean, "
                              "completion_len_mean, num_turns_mean, timing_s_gen")  # fmt: skip
    assert [r["step"] for r in rows] == [1, 2, 3]
    third = rows[2]
    assert third["clip_frac_active"] == pytest.approx(0.03) and third["dual_clip_frac"] == pytest.approx(
        0.003
    )
    assert third["kl_old_k1"] == pytest.approx(0.006) and third["grad_norm"] == 1.5
    assert third["reward_mean"] == pytest.approx(0.3) and third["num_turns_mean"] == 5
    assert third["completion_len_mean"] == 120.0 and third["timing_s_gen"] == 2.5


def test_tracking_adapter_drops_values_that_are_not_scalars_and_keeps_the_rest(tmp_path):
    tracker = SorlTracking(tmp_path, "odd")
    tracker.log({"actor/pg_loss": 0.5, "hist": [1, 2, 3], "table": {"a": 1}, "vec": torch.ones(3)}, step=0)
    tracker.finish()
    with open_runs(tmp_path) as runs:
        assert runs.sql("SELECT pg_loss FROM steps").to_pylist() == [{"pg_loss": 0.5}]
        assert not {"hist", "table", "vec"} & set(runs.columns("steps"))


def wait_until(condition, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def write_lines(path: Path, steps) -> None:
    with open(path, "ab") as handle:
        for step in steps:
            handle.write(record(step))


def test_ingest_reads_every_record_and_skips_steps_already_ingested(tmp_path):
    source = tmp_path / "exp.jsonl"
    write_lines(source, range(1, 6))
    with Monitor(tmp_path / "runs", "exp") as mon:
        first = ingest_verl_jsonl(source, mon)
    write_lines(source, range(6, 9))
    with Monitor(tmp_path / "runs", "exp") as mon:
        second = ingest_verl_jsonl(source, mon, after_step=5)
    assert (first.rows, second.rows, second.already_ingested) == (5, 3, 5)
    assert [r["step"] for r in steps_of(tmp_path / "runs")] == list(range(1, 9))


def test_ingest_skips_unreadable_lines_and_reports_the_first(tmp_path):
    source = tmp_path / "exp.jsonl"
    write_lines(source, [1])
    with open(source, "ab") as handle:
        handle.write(b'{"step": 2, "data": {"actor/pg_loss": 0.1}\n')  # truncated JSON
        handle.write(b'{"step": "3", "data": {}}\n')
        handle.write(b"\n")
    write_lines(source, [4])
    with Monitor(tmp_path / "runs", "exp") as mon:
        report = ingest_verl_jsonl(source, mon)
    assert report.rows == 2 and report.bad_lines == [2, 3]
    assert report.first_error.startswith("line 2: not JSON")


def test_follow_picks_up_appended_records_and_waits_for_half_written_lines(tmp_path):
    source = tmp_path / "live.jsonl"
    source.write_bytes(b"")
    stop = threading.Event()
    result = {}
    with Monitor(tmp_path / "runs", "live") as mon:
        reader = threading.Thread(
            target=lambda: result.update(
                report=ingest_verl_jsonl(source, mon, follow=True, poll_s=0.02, stop=stop)
            )
        )
        reader.start()
        for step in range(1, 11):
            line = record(step)
            with open(source, "ab") as handle:
                handle.write(line[:10])
                handle.flush()
                time.sleep(0.03)  # the reader sees half a line
                handle.write(line[10:])
        wait_until(lambda: mon.last_step == 10)
        stop.set()
        reader.join()
    assert result["report"].rows == 10 and not result["report"].bad_lines
    assert [r["step"] for r in steps_of(tmp_path / "runs")] == list(range(1, 11))


def test_follow_rereads_a_file_verl_rewrote_from_the_start_without_duplicates(tmp_path):
    source = tmp_path / "live.jsonl"
    write_lines(source, range(1, 6))
    stop = threading.Event()
    with Monitor(tmp_path / "runs", "restart") as mon:
        reader = threading.Thread(
            target=ingest_verl_jsonl,
            args=(source, mon),
            kwargs={"follow": True, "poll_s": 0.02, "stop": stop},
        )
        reader.start()
        wait_until(lambda: mon.last_step == 5)
        source.write_bytes(b"")  # verl's FileLogger reopens its file with "wb" on a restart
        write_lines(source, range(4, 8))  # resumed from a checkpoint at step 3
        wait_until(lambda: mon.last_step == 7)
        stop.set()
        reader.join()
    assert [r["step"] for r in steps_of(tmp_path / "runs")] == list(range(1, 8))


runner = CliRunner()


def test_cli_ingest_prints_what_it_did_and_names_the_run_after_the_file(tmp_path):
    source = tmp_path / "grpo exp#1.jsonl"
    write_lines(source, range(1, 4))
    result = runner.invoke(app, ["ingest", str(source), "--log-dir", str(tmp_path / "runs")])
    assert result.exit_code == 0, result.output
    assert "ingested 3 rows" in result.output
    assert [p.name for p in (tmp_path / "runs").iterdir()] == ["grpo-exp-1"]
    meta = json.loads((tmp_path / "runs" / "grpo-exp-1" / "run.json").read_text())
    assert meta["status"] == "ingested" and meta["config"]["source"] == str(source.resolve())


@pytest.mark.slow
def test_cli_follow_streams_a_growing_file_and_stops_cleanly_on_ctrl_c(tmp_path):
    source = tmp_path / "exp.jsonl"
    source.write_bytes(b"")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "sorl_monitor.cli.main", "ingest", str(source), "--follow", "--poll", "0.05",
               "--log-dir", str(tmp_path / "runs")]  # fmt: skip
    proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for step in range(1, 6):
            write_lines(source, [step])
            time.sleep(0.1)
        parts = tmp_path / "runs" / "exp" / "steps"
        wait_until(lambda: proc.poll() is None and any(parts.glob("rank=0/part-*.parquet")), timeout=60)
        wait_until(lambda: len(steps_of(tmp_path / "runs")) == 5)
    finally:
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "ingested 5 rows" in out and "Traceback" not in err
    assert json.loads((tmp_path / "runs" / "exp" / "run.json").read_text())["status"] == "ingested"
    assert [r["reward_mean"] for r in steps_of(tmp_path / "runs", "step, reward_mean")] == pytest.approx(
        [0.1 * step for step in range(1, 6)]
    )


def test_install_tracking_backend_adds_a_sorl_logger_to_every_tracking(tmp_path, verl_modules_installed):
    from verl.utils.tracking import Tracking

    install_tracking_backend(tmp_path / "runs")
    install_tracking_backend(tmp_path / "runs")  # idempotent
    tracking = Tracking("proj", "grpo exp #1", default_backend=[], config={"trainer": {"total_epochs": 1}})
    for step in (1, 2):
        tracking.log(data=verl_metrics(step), step=step)
    tracking.logger["sorl"].finish()
    assert list(tracking.logger) == ["sorl"]
    assert [r["step"] for r in steps_of(tmp_path / "runs" / "grpo-exp-1")] == [1, 2]
    meta = json.loads((tmp_path / "runs" / "grpo-exp-1" / "run.json").read_text())
    assert meta["config"]["trainer"] == {"total_epochs": 1}


def test_a_tracking_backend_that_cannot_start_leaves_verls_tracking_working(tmp_path, verl_modules_installed):
    from verl.utils.tracking import Tracking

    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    install_tracking_backend(blocker / "runs")
    with pytest.warns(MonitorWarning, match="no sorl tracking backend"):
        tracking = Tracking("proj", "exp", default_backend=[])
    tracking.log(data={"x": 1.0}, step=1)
    assert "sorl" not in tracking.logger
