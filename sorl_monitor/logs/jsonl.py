"""Flat JSON lines: one object per line with a step column (prime-rl's ``{"step": …, …}`` lines, own dumps).

Read with pyarrow's JSON reader; nested objects become ``outer.inner`` columns. A file pyarrow refuses (a
line that is not JSON, a number beyond double range) is read line by line instead, and its unreadable
lines are skipped with one warning.
"""

from __future__ import annotations

import io
import json
import warnings
from pathlib import Path

import pyarrow as pa
import pyarrow.json as pajson

from sorl_monitor.logs import row_kinds
from sorl_monitor.logs.file_head import complete_lines
from sorl_monitor.logs.input_limits import json_loads, too_deep_lines
from sorl_monitor.logs.segments import wide_run
from sorl_monitor.logs.table import ForeignRun, LogWarning, flat_record, flatten, records_table


def read_table(path: Path) -> pa.Table:
    """Every line's object as one row (a last line still being written is left out)."""
    data = complete_lines(path, _is_object)
    try:
        if not too_deep_lines(data):  # pyarrow's reader crashes the process on a line ~30,000 levels deep
            return flatten(pajson.read_json(io.BytesIO(data)))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        pass
    records, bad = [], []
    for number, line in enumerate(data.split(b"\n"), 1):
        if not line.strip():
            continue
        try:
            record = json_loads(line)
        except (UnicodeDecodeError, json.JSONDecodeError):
            record = None
        if isinstance(record, dict):
            records.append(flat_record(record))
        else:
            bad.append(number)
    if bad:
        warnings.warn(
            f"{path}: skipped {len(bad)} lines that are not JSON objects (first: line {bad[0]})",
            LogWarning,
            stacklevel=3,
        )
    return records_table(records)


def _is_object(line: bytes) -> bool:
    try:
        return isinstance(json_loads(line), dict)
    except (UnicodeDecodeError, json.JSONDecodeError):
        return False


def read(path: Path, name: str, fmt: str = "jsonl") -> list[ForeignRun]:
    """The run in a JSON-lines file (rows of several kinds: ``row_kinds``)."""
    table = read_table(path)
    kinds = row_kinds.kind_column(table)
    if kinds is not None:
        return row_kinds.read_kinds(path, name, table, kinds, fmt)
    return wide_run(path, fmt, name, table)
