"""CSV with a header line and a step column (``table.STEP_COLUMNS``), read with pyarrow's CSV reader.

Only empty cells are missing values: ``nan``, ``inf`` and ``-inf`` are read as the numbers they are.
"""

from __future__ import annotations

import io
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from sorl_monitor.logs.file_head import complete_lines, csv_header
from sorl_monitor.logs.segments import wide_run
from sorl_monitor.logs.table import ForeignRun, LogFormatError, run_name, step_column

CONVERT = pacsv.ConvertOptions(null_values=[""], strings_can_be_null=True)


def read_table(path: Path) -> pa.Table:
    """The whole CSV file as a table (a last line still being written is left out)."""
    width = len(csv_header(path.read_bytes()[: 1 << 16]))
    data = complete_lines(path, lambda line: len(csv_header(line)) == width)
    try:
        # a block holds whole rows: as large as the file (at least pyarrow's 1 MiB), so a long cell reads
        read = pacsv.ReadOptions(block_size=max(1 << 20, min(len(data) + 1, 1 << 30)))
        return pacsv.read_csv(io.BytesIO(data), read_options=read, convert_options=CONVERT)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as error:
        raise LogFormatError(f"cannot read {path} as CSV: {str(error).splitlines()[0]}") from None


def run_columns(names: list[str]) -> dict[str, str] | None:
    """``{run: column}`` when every column but the step is ``<run>-<metric>`` with one metric shared by two or
    more runs (one chart of several runs, exported), else ``None``; the metric is ``metric_of``'s."""
    step = step_column(names)
    others = [c for c in names if c != step]
    if step is None or len(others) < 2:
        return None
    first = others[0]
    for at in (i for i, ch in enumerate(first) if ch == "-"):
        tail = first[at:]
        prefixes = [c[: -len(tail)] for c in others if c.endswith(tail)]
        if len(prefixes) == len(others) and all(prefixes) and len(set(prefixes)) == len(prefixes):
            return {prefix: column for prefix, column in zip(prefixes, others, strict=True)}
    return None


def metric_of(column: str, run: str) -> str:
    """``critic/score/mean`` of ``<run>-critic/score/mean_step`` (W&B's x-axis suffix dropped)."""
    metric = column[len(run) + 1 :]
    return metric.removesuffix("_step") if "/" in metric else metric


def read(path: Path, name: str, fmt: str = "csv") -> list[ForeignRun]:
    """The run in a CSV file; one run per ``<run>-<metric>`` column where each column is one run's
    (``run_columns``)."""
    table = read_table(path)
    runs = run_columns(table.column_names)
    if runs is None:
        return wide_run(path, fmt, name, table)
    step = step_column(table.column_names)
    out = []
    for run, column in runs.items():
        part = table.select([step, column]).rename_columns([step, metric_of(column, run)])
        part = part.filter(pc.is_valid(part.column(1)))
        out.extend(wide_run(path, fmt, run_name(run), part))
    return out
