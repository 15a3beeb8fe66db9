"""``sorl ingest`` of each format, the post-mortem of what it wrote, ``--follow``, the dashboard's data, and
the real logs in ``../shared/real_logs``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sorl_monitor.cli.main import app
from sorl_monitor.diagnose.live import LiveRuns
from sorl_monitor.logs import read_log
from sorl_monitor.read.query import open_runs
from tests.helpers.log_writers import (
    TRL_STEPS,
    csv_file,
    hf_history,
    jsonl_file,
    mlflow_store,
    tensorboard_run,
    verl_file,
)

ROOT = Path(__file__).resolve().parents[2]
REAL_LOGS = Path(__file__).parents[2].parent / "shared" / "real_logs"
runner = CliRunner()


WRITERS = {
    "tensorboard": lambda tmp, _: tensorboard_run(tmp / "tb"),
    "jsonl": lambda tmp, _: jsonl_file(tmp / "m.jsonl"),
    "csv": lambda tmp, _: csv_file(tmp / "m.csv"),
    "verl": lambda tmp, _: verl_file(tmp / "exp.jsonl"),
    "hf": lambda tmp, _: hf_history(tmp / "step_logs.json"),
    "mlflow": lambda tmp, monkeypatch: mlflow_store(tmp / "mlruns", monkeypatch),
}


@pytest.mark.parametrize("fmt", sorted(WRITERS))
def test_ingest_writes_the_logs_steps_as_a_run_that_postmortem_reads(tmp_path, monkeypatch, fmt):
    source = WRITERS[fmt](tmp_path, monkeypatch)
    (foreign,) = read_log(source)
    result = runner.invoke(app, ["ingest", str(source), "--log-dir", str(tmp_path / "runs"), "--run", "x"])
    assert result.exit_code == 0, result.output
    assert f"ingested {foreign.steps.num_rows} rows" in result.output
    with open_runs(tmp_path / "runs" / "x") as runs:
        meta = runs.sql("SELECT status, config FROM runs").to_pylist()[0]
        columns = [c for c in foreign.steps.column_names if c not in {"run_id", "rank", "wall_time"}]
        stored = runs.sql(f"SELECT {', '.join(columns)} FROM steps ORDER BY step").to_pylist()
    expected = foreign.steps.select(columns).to_pylist()
    assert json.dumps(stored) == json.dumps(expected)  # NaN included
    assert meta["status"] == "ingested" and json.loads(meta["config"])["format"] == fmt
    again = runner.invoke(app, ["ingest", str(source), "--log-dir", str(tmp_path / "runs"), "--run", "x"])
    assert "ingested 0 rows" in again.output  # steps already in the run are skipped
    verdict = runner.invoke(app, ["postmortem", str(tmp_path / "runs" / "x"), "--json"])
    assert verdict.exit_code in (0, 3), verdict.output
    assert json.loads(verdict.stdout)["run_id"] == "x"


def test_a_multi_run_wandb_export_is_ingested_as_one_run_each(tmp_path):
    path = tmp_path / "export.csv"
    path.write_text("Step,a - reward,a - reward__MIN,b - reward\n1,0.1,0.0,0.2\n2,0.3,0.2,\n")
    result = runner.invoke(app, ["ingest", str(path), "--log-dir", str(tmp_path / "runs")])
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["a", "b"]


def wait_until(condition, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def stored_steps(run_dir: Path) -> list[int]:
    if not any(run_dir.glob("steps/rank=0/part-*.parquet")):
        return []
    with open_runs(run_dir) as runs:
        return [r["step"] for r in runs.sql("SELECT step FROM steps ORDER BY step").to_pylist()]


@pytest.mark.slow
def test_ingest_follow_streams_a_growing_jsonl_and_stops_cleanly_on_ctrl_c(tmp_path):
    source = tmp_path / "prime.jsonl"
    source.write_text("")
    command = [sys.executable, "-m", "sorl_monitor.cli.main", "ingest", str(source), "--format", "jsonl", "--follow",
               "--poll", "0.05", "--log-dir", str(tmp_path / "runs")]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for step in range(1, 6):
            with open(source, "a") as handle:
                handle.write(json.dumps({"step": step, "reward": 0.1 * step}) + "\n")
            time.sleep(0.1)
        wait_until(
            lambda: proc.poll() is None and stored_steps(tmp_path / "runs" / "prime") == [1, 2, 3, 4, 5]
        )
    finally:
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "ingested 5 rows" in out and "Traceback" not in err


def test_the_dashboard_lists_and_plots_foreign_runs(tmp_path):
    tensorboard_run(tmp_path / "tb")
    jsonl_file(tmp_path / "m.jsonl")
    live = LiveRuns(tmp_path, min_refresh_s=0)
    try:
        live.refresh()
        assert live.problem is None
        infos = {info.run_id: info for info in live.run_states()}
        assert sorted(infos) == ["m", "tb"]
        assert infos["m"].status == "imported" and infos["m"].updates == len(TRL_STEPS)
        assert live.curves("tb").steps.column("reward_mean").to_pylist()[-1] == pytest.approx(0.6)
        assert live.verdict("m") is not None
    finally:
        live.close()


def real_logs() -> list[Path]:
    if not REAL_LOGS.is_dir():
        return []
    return sorted(p for p in REAL_LOGS.rglob("*") if p.is_file() and p.name != "README.md")


@pytest.mark.skipif(
    not REAL_LOGS.is_dir(), reason="../shared/real_logs is not here (it lives beside the repo)"
)
@pytest.mark.parametrize("path", real_logs(), ids=lambda p: p.name)
def test_every_real_log_opens_in_postmortem_without_a_conversion(path):
    result = runner.invoke(app, ["postmortem", str(path), "--json"])
    assert result.exit_code in (0, 3), result.output
    verdict = json.loads(result.stdout)
    assert verdict["updates"] > 0
