"""The fleet's verdict table: its columns, its order, and reading and writing it (``sorl fleet``).

Kept apart from ``fleet`` (which judges runs) so the query layer can show the table as the ``verdicts``
view without importing the post-mortem.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

VERDICTS_FILE = "verdicts.parquet"
"""The fleet's verdict table, written at the root it judged."""

VERDICT_COLUMNS = pa.schema(
    [
        pa.field("run_id", pa.string()),
        pa.field("path", pa.string()),
        pa.field("algorithm", pa.string()),
        pa.field("status", pa.string()),
        pa.field("collapse_step", pa.int64()),
        pa.field("first_critical", pa.int64()),
        pa.field("lead_time", pa.int64()),
        pa.field("root_cause", pa.string()),
        pa.field("families_rising", pa.string()),
        pa.field("last_step", pa.int64()),
        pa.field("updates", pa.int64()),
        pa.field("error", pa.string()),
        pa.field("source_mtime", pa.float64()),
        pa.field("updated_at", pa.timestamp("us", tz="UTC")),
    ]
)
"""One row per run: its verdict, or ``status = 'error'`` with the reason."""

STATUS_ORDER = ("error", "collapsing", "diverging", "collapsed", "not_judged", "healthy")
"""Most urgent first: the order ``sorted_verdicts`` puts runs in (unknown statuses after these)."""


def verdict_table(rows: Iterable[dict[str, Any]]) -> pa.Table:
    """Rows as a ``VERDICT_COLUMNS`` table (missing columns null)."""
    rows = list(rows)
    return pa.Table.from_pylist(
        [{name: row.get(name) for name in VERDICT_COLUMNS.names} for row in rows], schema=VERDICT_COLUMNS
    )


def sorted_verdicts(table: pa.Table) -> pa.Table:
    """Most urgent status first (``STATUS_ORDER``), then run id."""
    order = {status: i for i, status in enumerate(STATUS_ORDER)}
    rows = sorted(table.to_pylist(), key=lambda r: (order.get(r["status"], len(order)), r["run_id"] or ""))
    return verdict_table(rows)


def write_verdicts(table: pa.Table, path: str | os.PathLike[str]) -> Path:
    """Write the table to ``path`` all or nothing (a temporary file, then ``os.replace``)."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    pq.write_table(table, tmp)
    os.replace(tmp, path)
    return path


def read_verdicts(path: str | os.PathLike[str]) -> pa.Table | None:
    """The verdict table at ``path`` (a file, or a folder holding ``VERDICTS_FILE``), or ``None``."""
    path = Path(path)
    if path.is_dir():
        path = path / VERDICTS_FILE
    if not path.is_file():
        return None
    try:
        return pq.read_table(path)
    except (OSError, pa.ArrowInvalid):
        return None
