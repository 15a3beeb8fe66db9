"""verl's ``file`` logger output: ``{"step": N, "data": {...}}`` per line (``parse_record``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sorl_monitor.logs import jsonl
from sorl_monitor.logs.input_limits import json_loads
from sorl_monitor.logs.segments import segmented_runs
from sorl_monitor.logs.table import ForeignRun, LogFormatError
from sorl_monitor.schema import metric_column


def parse_record(line: bytes) -> tuple[int, dict[str, Any]]:
    """``(step, data)`` of one file-logger line ``{"step": N, "data": {...}}``; ``ValueError`` if it is not one."""
    try:
        record = json_loads(line)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"not JSON ({error})") from None
    if not isinstance(record, dict) or "data" not in record or "step" not in record:
        raise ValueError('not a {"step": …, "data": {…}} record')
    step, data = record["step"], record["data"]
    if isinstance(step, bool) or not isinstance(step, int) or not isinstance(data, dict):
        raise ValueError("step must be an integer and data an object")
    if not 0 <= step < 2**63:
        raise ValueError(f"step {step} is outside 0 … 2^63 − 1")
    return step, data


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
    return segmented_runs(path, "verl", name, table, "step", info={"algorithm": "verl"}, family="verl")
