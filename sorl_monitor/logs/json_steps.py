"""A JSON document that holds its steps as a list of records: ``{"model": …, "step_log": [{"step": 1, …}, …]}``.

Hand-written loops often save one summary file per run: the run's settings and totals as top-level values,
its steps as a list of objects with a step column (``table.STEP_COLUMNS``). The longest such list is the
run's rows; the top-level scalars are its config.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sorl_monitor.logs.input_limits import json_loads
from sorl_monitor.logs.segments import wide_run
from sorl_monitor.logs.table import ForeignRun, LogFormatError, json_config, records_table, step_column


def step_records(document: Any) -> list[dict] | None:
    """The longest list of objects with a step column among a JSON object's values, or ``None``."""
    if not isinstance(document, dict):
        return None
    lists = [
        value
        for value in document.values()
        if isinstance(value, list) and value and all(isinstance(row, dict) for row in value)
        and step_column(value[0]) is not None
    ]  # fmt: skip
    return max(lists, key=len) if lists else None


def read(path: Path, name: str) -> list[ForeignRun]:
    """The run in a JSON summary file whose steps are a list of records."""
    try:
        document = json_loads(path.read_bytes())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise LogFormatError(f"cannot read {path} as JSON: {error}") from None
    rows = step_records(document)
    if rows is None:
        raise LogFormatError(f"{path} holds no list of records with a step column")
    config = json_config({k: v for k, v in document.items() if not isinstance(v, list | dict)})
    return wide_run(path, "json", name, records_table(rows), info={"config": config})
