"""CSV with a header line and a step column (``table.STEP_COLUMNS``), read with pyarrow's CSV reader.

Only empty cells are missing values: ``nan``, ``inf`` and ``-inf`` are read as the numbers they are.
"""

from __future__ import annotations

import io
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pacsv

from sorl_monitor.logs.sniff import complete_lines, csv_header
from sorl_monitor.logs.table import ForeignRun, LogFormatError, wide_run

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


def read(path: Path, name: str, fmt: str = "csv") -> list[ForeignRun]:
    """The run in a CSV file."""
    return wide_run(path, fmt, name, read_table(path))
