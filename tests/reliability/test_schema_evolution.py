"""Runs written by an older schema, and parts with columns added since, read together (union_by_name)."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
from typer.testing import CliRunner

from sorl_monitor import Monitor, WriterConfig
from sorl_monitor.cli.main import app
from sorl_monitor.read.query import open_runs
from sorl_monitor.read.summary import metric_summary, run_overview


def write_version_zero_run(run_dir, steps=range(3)):
    """A run as a hypothetical schema version 0 wrote it: fewer columns, narrower and other types.

    ``step`` int32 (now int64), ``rank`` int64 (now int32), ``ctn_active`` as 0/1 doubles (now bool),
    no ``wall_time``/``iteration``, and a metric since renamed (``clipfrac``, now ``clip_frac``).
    """
    folder = run_dir / "steps" / "rank=0"
    folder.mkdir(parents=True)
    for step in steps:
        table = pa.table(
            {
                "run_id": pa.array([run_dir.name]),
                "rank": pa.array([0], pa.int64()),
                "step": pa.array([step], pa.int32()),
                "loss": pa.array([1.0 / (step + 1)]),
                "clipfrac": pa.array([0.1 * step]),
                "ctn_active": pa.array([float(step % 2)]),
            }
        )
        pq.write_table(table, folder / f"part-{step:06d}.parquet")
    (run_dir / "run.json").write_text(
        json.dumps({"run_id": run_dir.name, "schema_version": 0, "status": "finished"})
    )


def test_a_version_zero_run_resumed_by_the_current_monitor_reads_as_one_table(tmp_path):
    run = tmp_path / "old"
    write_version_zero_run(run)
    with Monitor(tmp_path, "old", writer=WriterConfig(flush_interval_s=0.05)) as mon:
        for step in (3, 4):
            mon.log_scalars(step, {"loss": 0.1, "clip_frac": 0.5, "ctn_active": True, "new_metric": 7.0})
    with open_runs(tmp_path) as runs:
        rows = runs.sql(
            "SELECT step, loss, clipfrac, clip_frac, ctn_active, new_metric FROM steps ORDER BY step"
        )
        types = {r["column_name"]: r["column_type"] for r in runs.sql("DESCRIBE steps").to_pylist()}
    rows = rows.to_pylist()
    assert [r["step"] for r in rows] == [0, 1, 2, 3, 4]
    assert [r["clipfrac"] is None for r in rows] == [False] * 3 + [True] * 2
    assert [r["new_metric"] for r in rows] == [None, None, None, 7.0, 7.0]
    assert types["step"] == "BIGINT"
    assert [float(r["ctn_active"]) for r in rows] == [0.0, 1.0, 0.0, 1.0, 1.0]
    names = sorted(p.name for p in (run / "steps" / "rank=0").iterdir())
    assert names[:3] == [f"part-{n:06d}.parquet" for n in range(3)] and len(names) > 3  # numbering continues


def test_old_and_new_runs_side_by_side_in_overview_and_summary(tmp_path):
    write_version_zero_run(tmp_path / "old")
    with Monitor(tmp_path, "new", writer=WriterConfig(flush_interval_s=0.05)) as mon:
        mon.log_scalars(0, {"loss": 0.5, "reward_mean": 1.0})
    with open_runs(tmp_path) as runs:
        overview = {r["run_id"]: r for r in run_overview(runs).to_pylist()}
        old = {r["metric"]: r for r in metric_summary(runs, "old").to_pylist()}
    assert overview["old"]["updates"] == 3 and overview["new"]["updates"] == 1
    assert old["loss"]["n"] == 3 and old["clipfrac"]["max"] == 0.2
    result = CliRunner().invoke(app, ["summary", str(tmp_path), "--run", "old", "--json"])
    assert result.exit_code == 0 and {"loss", "clipfrac"} <= {r["metric"] for r in json.loads(result.stdout)}
