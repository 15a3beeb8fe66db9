"""What the writer is given, as Arrow tables: row dicts (typed column by column), dicts of columns, Arrow data."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

_ARROW_TYPES = {
    frozenset({float}): pa.float64(),
    frozenset({int}): pa.int64(),
    frozenset({int, float}): pa.float64(),
    frozenset({bool}): pa.bool_(),
    frozenset({str}): pa.string(),
}


def _column(values: list[Any]) -> pa.Array:
    """An Arrow column from Python values (typed up front: Arrow's own type inference is far slower).

    Mixed numbers become double; anything that is not a number, bool or string becomes a string.
    """
    kinds = frozenset(type(v) for v in values if v is not None)
    try:
        return pa.array(values, _ARROW_TYPES.get(kinds))
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):  # e.g. an int beyond int64
        try:
            return pa.array([None if v is None else float(v) for v in values], pa.float64())
        except (TypeError, ValueError):
            return pa.array([None if v is None else str(v) for v in values], pa.string())


def rows_to_table(rows: list[dict[str, Any]]) -> pa.Table:
    """Row dicts as one Arrow table over the union of their keys (missing values are null)."""
    names = list(dict.fromkeys(name for row in rows for name in row))
    return pa.table({name: _column([row.get(name) for row in rows]) for name in names})


def to_arrow(payloads: list[Any]) -> pa.Table:
    """Queued payloads (lists of row dicts, dicts of columns, Arrow data) as one Arrow table.

    All row dicts are converted together, column by column: one conversion per flush, not per row.
    """
    rows = [row for p in payloads if isinstance(p, list) for row in p]
    tables = [rows_to_table(rows)] if rows else []
    for p in payloads:
        if isinstance(p, pa.Table):
            tables.append(p)
        elif isinstance(p, pa.RecordBatch):
            tables.append(pa.Table.from_batches([p]))
        elif not isinstance(p, list):
            tables.append(pa.table(p))
    return pa.concat_tables(tables, promote_options="permissive") if len(tables) > 1 else tables[0]


def payload_rows(payload: Any) -> int:
    """Rows in one queued payload (a list of row dicts, a dict of columns, or Arrow data)."""
    if isinstance(payload, list):
        return len(payload)
    if isinstance(payload, pa.Table | pa.RecordBatch):
        return payload.num_rows
    return len(next(iter(payload.values()), []))
