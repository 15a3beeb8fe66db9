"""One file on disk, all or nothing: a Parquet part (``.tmp`` first, then ``os.replace``) and a JSON file."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq


def write_json_atomic(path: Path, payload: dict[str, Any]) -> None:
    """Write ``payload`` as JSON to ``path`` via a temporary file and ``os.replace`` (all or nothing)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(payload, indent=2, sort_keys=True, default=str))
    os.replace(tmp, path)


def write_part_file(data: pa.Table, path: Path, compression: str) -> Path:
    """Write ``data`` to ``path`` all or nothing: to ``path.tmp``, then ``os.replace``."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        exact = exact_columns(data.schema)
        pq.write_table(data, tmp, compression=compression, write_statistics=exact, use_dictionary=exact)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def exact_columns(schema: pa.Schema) -> list[str]:
    """Columns written with min/max statistics and dictionary encoding: all but floating-point ones.

    Statistics: Parquet's float statistics leave NaN out, and DuckDB (2.0, duckdb/duckdb#25521) trusts
    them: with ``max`` finite it folds ``isnan(x)`` to false and drops NaN rows from ``x > c``, so a run's
    NaN loss would be invisible to a query. Without float statistics DuckDB reads the values as they are.
    Dictionary: metric floats rarely repeat, so pyarrow builds each float dictionary only to abandon it;
    leaving floats plain writes faster for files of about the same size (``benchmarks/bench_writer.py``,
    docs/results.md).
    """
    return [field.name for field in schema if not pa.types.is_floating(field.type)]
