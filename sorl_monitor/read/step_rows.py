"""A step's row: the one definition the figures, the dashboard and the report draw from.

A trainer may log one step in several ``steps`` rows: one per rank, or its scalars split over two
rows. A step's row is, column by column, the mean over ranks of each rank's mean of its rows at that
step (nulls ignored; booleans: any). The detectors and the collapse label read the rows as logged:
they average each rank's rows per block of ``DetectorConfig.smooth_steps`` steps, which for one row per
(rank, step) is the block mean of these step rows, rank by rank.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sorl_monitor.schema import SCHEMAS


def step_rows(rows: pa.Table, run_id: str) -> pa.Table:
    """``rows`` of one run's ``steps`` as one row per step (see module docstring), sorted, ``run_id`` set."""
    if rows.num_rows == 0:
        return SCHEMAS["steps"].empty_table()
    if "rank" in rows.column_names:
        rows = _mean_per(rows, ["step", "rank"])
    rows = _mean_per(rows, ["step"])
    run_ids = pa.repeat(pa.scalar(run_id), rows.num_rows)
    if "run_id" in rows.column_names:
        rows = rows.set_column(rows.schema.get_field_index("run_id"), "run_id", run_ids)
    else:
        rows = rows.append_column("run_id", run_ids)
    return rows.sort_by("step")


def _mean_per(rows: pa.Table, keys: list[str]) -> pa.Table:
    """One row per distinct ``keys``: numbers averaged, booleans any; other columns kept only if unique."""
    if pc.count_distinct(_key(rows, keys)).as_py() == rows.num_rows:
        return rows
    aggregates = [
        (f.name, "mean" if pa.types.is_floating(f.type) or pa.types.is_integer(f.type) else "any")
        for f in rows.schema
        if f.name not in keys
        and (pa.types.is_floating(f.type) or pa.types.is_integer(f.type) or pa.types.is_boolean(f.type))
    ]
    merged = rows.group_by(keys, use_threads=False).aggregate(aggregates)
    return merged.rename_columns([_aggregated_name(name) for name in merged.column_names])


def _key(rows: pa.Table, keys: list[str]) -> pa.Array:
    if len(keys) == 1:
        return rows.column(keys[0])
    return pc.binary_join_element_wise(*(rows.column(k).cast(pa.string()) for k in keys), "/")


def _aggregated_name(name: str) -> str:
    """``clip_frac_mean`` → ``clip_frac`` (pyarrow names an aggregate ``<column>_<function>``)."""
    for suffix in ("_mean", "_any"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def column_values(table: pa.Table, name: str) -> np.ndarray:
    """A numeric column as float64 with nulls as NaN (NaN everywhere when the table lacks it)."""
    if name not in table.column_names:
        return np.full(table.num_rows, np.nan)
    column = table.column(name)
    if not (pa.types.is_floating(column.type) or pa.types.is_integer(column.type)):
        column = column.cast(pa.float64())
    return column.to_numpy(zero_copy_only=False).astype(np.float64)
