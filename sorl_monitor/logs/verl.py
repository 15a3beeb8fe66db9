"""verl's ``file`` logger output: ``{"step": N, "data": {...}}`` per line (``integrations.verl.parse_record``)."""

from __future__ import annotations

from pathlib import Path

from sorl_monitor.logs import jsonl
from sorl_monitor.logs.table import ForeignRun, LogFormatError, foreign_run, one_row_per_step
from sorl_monitor.schema import metric_column

DATA = "data."


def read(path: Path, name: str) -> list[ForeignRun]:
    """The run in a verl file-logger ``.jsonl``; its ``data`` keys are the metric names (``step`` among them
    read as ``metric_step``)."""
    table = jsonl.read_table(path)
    if table.num_rows and "step" not in table.column_names:
        raise LogFormatError(
            f'{path} is not verl file-logger output ({{"step": N, "data": {{...}}}} per line)'
        )
    metrics = [c for c in table.column_names if c.startswith(DATA)]
    names = [metric_column(c[len(DATA) :]) if c == f"{DATA}step" else c[len(DATA) :] for c in metrics]
    table = table.select(["step", *metrics]).rename_columns(["step", *names])
    return [
        foreign_run(
            path, "verl", name, one_row_per_step(table, "step"), info={"algorithm": "verl"}, family="verl"
        )
    ]
