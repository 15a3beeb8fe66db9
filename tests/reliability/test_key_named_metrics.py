"""A metric named like a key column (``Step``, ``Run ID``, ``rank`` …) is stored as ``metric_<key>``: it never
moves its row to another step or into a phantom run."""

from __future__ import annotations

import torch
from typer.testing import CliRunner

from sorl_monitor import Monitor, WriterConfig
from sorl_monitor.cli.main import app
from sorl_monitor.read.query import open_runs

RECORDS = (
    '{"step": 1, "data": {"actor/pg_loss": 0.5, "Step": 100, "Run ID": "x"}}\n'
    '{"step": 2, "data": {"actor/pg_loss": 0.4, "step": 7, "rank": 3}}\n'
)
QUERY = "SELECT run_id, rank, step, metric_step, metric_run_id, metric_rank, pg_loss FROM steps ORDER BY step"
EXPECTED = [
    {"run_id": "exp", "rank": 0, "step": 1, "metric_step": 100.0, "metric_run_id": "x", "metric_rank": None,
     "pg_loss": 0.5},
    {"run_id": "exp", "rank": 0, "step": 2, "metric_step": 7.0, "metric_run_id": None, "metric_rank": 3.0,
     "pg_loss": 0.4},
]  # fmt: skip


def test_ingested_verl_records_keep_their_step_and_run(tmp_path):
    log = tmp_path / "exp.jsonl"
    log.write_text(RECORDS)
    result = CliRunner().invoke(app, ["ingest", str(log), "--log-dir", str(tmp_path / "runs")])
    assert result.exit_code == 0, result.output
    with open_runs(tmp_path / "runs") as runs:
        assert runs.sql("SELECT run_id FROM runs").column(0).to_pylist() == ["exp"]
        assert runs.sql(QUERY).to_pylist() == EXPECTED


def test_a_verl_log_read_in_place_keeps_its_step_and_run(tmp_path):
    log = tmp_path / "exp.jsonl"
    log.write_text(RECORDS.replace('"Step": 100, ', "").replace('"step": 7, ', '"Step": 7, '))
    with open_runs(log) as runs:
        rows = runs.sql(QUERY).to_pylist()
    assert [(r["run_id"], r["step"], r["metric_step"], r["metric_run_id"]) for r in rows] == [
        ("exp", 1, None, "x"),
        ("exp", 2, 7.0, None),
    ]


def test_key_named_extras_of_log_update_are_kept_apart(tmp_path):
    with Monitor(tmp_path, "run", writer=WriterConfig(flush_interval_s=60)) as mon:
        mon.log_update(
            logp=torch.zeros(2, 3), old_logp=torch.zeros(2, 3), mask=torch.ones(2, 3),
            extra={"step": 50, "Wall Time": 1.0, "iteration": torch.tensor(9.0)},
        )  # fmt: skip
    with open_runs(tmp_path) as runs:
        row = runs.sql("SELECT step, iteration, wall_time, metric_step, metric_wall_time, metric_iteration "
                       "FROM steps").to_pylist()[0]  # fmt: skip
    assert (row["step"], row["iteration"], row["metric_step"]) == (0, 0, 50.0)
    assert (row["metric_wall_time"], row["metric_iteration"]) == (1.0, 9.0)
    assert row["wall_time"] > 1e9
