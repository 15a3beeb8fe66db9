"""The same metrics logged through ``Monitor.log_scalars`` and read by a log reader, compared step by step."""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path

from sorl_monitor import Monitor, WriterConfig
from sorl_monitor.logs import ForeignRun
from sorl_monitor.metric_names import guess_family, map_metrics
from sorl_monitor.read.query import open_runs

SKIPPED = {"run_id", "rank", "step", "wall_time"}


def parquet_steps(
    log_dir: Path, metrics_by_step: Mapping[int, Mapping[str, float]], family: str | None = "auto"
) -> dict[int, dict]:
    """Log ``metrics_by_step`` through ``Monitor.log_scalars`` (names mapped with ``family``; ``"auto"``: the
    family all of the names point to) and read the rows back from Parquet: ``{step: {column: value}}``."""
    if family == "auto":
        family = guess_family({name for metrics in metrics_by_step.values() for name in metrics})
    with Monitor(log_dir, "reference", writer=WriterConfig(flush_interval_s=0.05)) as monitor:
        for step, metrics in sorted(metrics_by_step.items()):
            monitor.log_scalars(step, map_metrics(metrics, family), names=None)
    with open_runs(log_dir / "reference") as runs:
        return {row["step"]: row for row in runs.table("steps").to_pylist()}


def same(a: object, b: object) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or a == b or math.isclose(a, b, rel_tol=1e-6)
    return a == b


def assert_same_steps(run: ForeignRun, expected: Mapping[int, Mapping[str, object]]) -> None:
    """Every step and every metric column of ``run`` holds what Parquet holds for the same metrics."""
    rows = {row["step"]: row for row in run.steps.to_pylist()}
    assert sorted(rows) == sorted(expected)
    columns = [c for c in run.steps.column_names if c not in SKIPPED]
    assert columns, "no metric columns read"
    for step, row in rows.items():
        for column in columns:
            if row[column] is None:
                assert expected[step].get(column) is None, (step, column)
            else:
                assert same(row[column], expected[step][column]), (
                    step,
                    column,
                    row[column],
                    expected[step][column],
                )
