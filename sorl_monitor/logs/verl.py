"""verl's ``file`` logger output: ``{"step": N, "data": {...}}`` per line (``integrations.verl.parse_record``)."""

from __future__ import annotations

from pathlib import Path

from sorl_monitor.logs import jsonl
from sorl_monitor.logs.table import ForeignRun, LogFormatError, foreign_run, one_row_per_step

DATA = "data."


def read(path: Path, name: str) -> list[ForeignRun]:
    """The run in a verl file-logger ``.jsonl``; its ``data`` keys are the metric names."""
    table = jsonl.read_table(path)
    if table.num_rows and "step" not in table.column_names:
        raise LogFormatError(
            f'{path} is not verl file-logger output ({{"step": N, "data": {{...}}}} per line)'
        )
    metrics = [c for c in table.column_names if c.startswith(DATA)]
    table = table.select(["step", *metrics]).rename_columns(["step", *(c[len(DATA) :] for c in metrics)])
    return [
        foreign_run(
            path, "verl", name, one_row_per_step(table, "step"), info={"algorithm": "verl"}, family="verl"
        )
    ]
