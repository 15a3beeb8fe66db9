"""JSON lines of several row kinds (``{"type": "rollout"|"train"|"eval", "grpo_step": …, …}``) on one step axis.

Hand-written RL loops log one row per kind of event: a rollout batch's rewards and lengths, a training
update's loss and entropy, an evaluation. The kind is a text column (``KIND_COLUMNS``). Evaluation rows
(``EVAL_KINDS``) are left out. The step is the first column of ``table.STEP_COLUMNS`` that every remaining
row has (``grpo_step``, the rollout batch's index, comes before ``optimizer_step``: a rollout batch is one
training step, as verl logs a step), else the first that any row has. Rows of one kind at one step
(several optimizer updates of one rollout batch) become one: numbers are averaged, other step counters
keep their largest value, text its last. The kinds then join on the step; a name that two kinds both log
keeps its name in the kind seen first and becomes ``<kind>/<name>`` in the others.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sorl_monitor.logs.file_head import first_json_line, head
from sorl_monitor.logs.input_limits import json_loads
from sorl_monitor.logs.segments import split_runs
from sorl_monitor.logs.table import (
    STEP_COLUMNS,
    WALL_TIME_COLUMNS,
    ForeignRun,
    LogFormatError,
    foreign_run,
    one_row_per_step,
    step_column,
)

KIND_COLUMNS = ("type", "kind", "row_type", "event", "phase", "split")
"""Columns that name a row's kind, in the order they are looked for (text columns only)."""
EVAL_KINDS = ("eval", "val", "test")
"""A kind that starts with one of these (``eval``, ``evaluation``, ``validation``, ``test``) is evaluation."""


def kind_column(table: pa.Table) -> str | None:
    """The column naming each row's kind, or ``None`` when the rows are of one kind."""
    for name in KIND_COLUMNS:
        if name in table.column_names and pa.types.is_string(table.schema.field(name).type):
            return name
    return None


def file_has_kinds(path: Path) -> bool:
    """Whether a JSON-lines file's first object has a text kind column (``KIND_COLUMNS``)."""
    first = first_json_line(head(path))
    return isinstance(first, dict) and any(isinstance(first.get(name), str) for name in KIND_COLUMNS)


def looks_like(start: bytes, lines: int = 64) -> bool:
    """JSON lines whose first object has a kind column and one of the first ``lines`` objects a step column
    (a loop may log a ``config`` row before its first step)."""
    rows = []
    for line in start.split(b"\n")[:lines]:
        try:
            rows.append(json_loads(line))
        except (UnicodeDecodeError, json.JSONDecodeError):
            continue
    rows = [row for row in rows if isinstance(row, dict)]
    if not rows or not any(isinstance(rows[0].get(name), str) for name in KIND_COLUMNS):
        return False
    return any(step_column(row) for row in rows)


def is_eval(kind: str | None) -> bool:
    return kind is not None and kind.strip().lower().startswith(EVAL_KINDS)


def _step_axis(table: pa.Table) -> str:
    present = [name for name in STEP_COLUMNS if name in table.column_names]
    if not present:
        raise LogFormatError(f"no step column (looked for {', '.join(STEP_COLUMNS)})")
    return next((name for name in present if table.column(name).null_count == 0), present[0])


def _one_row_per_step(rows: pa.Table, step: str) -> pa.Table:
    """Rows of one kind merged per step: numbers averaged, step counters' maximum, anything else the last."""
    rows = rows.filter(pc.is_valid(rows.column(step)))
    others = [n for n in rows.column_names if n != step and rows.column(n).null_count < rows.num_rows]
    if not others:
        return rows.select([step])
    aggregations = []
    for name in others:
        kind = rows.schema.field(name).type
        numeric = pa.types.is_integer(kind) or pa.types.is_floating(kind)
        how = "max" if name in STEP_COLUMNS and numeric else "mean" if numeric else "last"
        aggregations.append((name, how))
    merged = rows.group_by(step, use_threads=False).aggregate(aggregations)
    merged = merged.select([step, *(f"{name}_{how}" for name, how in aggregations)])
    return merged.rename_columns([step, *(name for name, _ in aggregations)])


def merge_kinds(table: pa.Table, kinds: str) -> tuple[pa.Table, str, list[str]]:
    """The rows that are not evaluation, one per step: ``(table, step column, kinds kept)``."""
    labels = table.column(kinds).to_pylist()
    keep = pa.array([not is_eval(label) for label in labels])
    table = table.filter(keep)
    step = _step_axis(table)
    order = list(dict.fromkeys(label for label in table.column(kinds).to_pylist()))
    merged: pa.Table | None = None
    taken = {step}
    for label in order:
        column = table.column(kinds)
        rows = table.filter(pc.is_null(column) if label is None else pc.equal(column, label))
        part = _one_row_per_step(rows.drop_columns([kinds]), step)
        names = []
        for name in part.column_names:
            if name == step or name not in taken or name in STEP_COLUMNS:
                names.append(name)
            else:
                names.append(f"{label}/{name}")
        part = part.rename_columns(names)
        if merged is None:
            merged = part
        else:
            shared = [n for n in part.column_names if n != step and n in merged.column_names]
            merged = merged.join(part, keys=step, join_type="full outer", right_suffix="__right")
            for name in shared:
                left, right = merged.column(name), merged.column(f"{name}__right")
                merged = merged.set_column(merged.column_names.index(name), name, pc.coalesce(left, right))
                merged = merged.drop_columns([f"{name}__right"])
        taken.update(part.column_names)
    assert merged is not None
    return merged, step, [str(label) for label in order]


def read_kinds(path: Path, name: str, table: pa.Table, kinds: str, fmt: str = "jsonl") -> list[ForeignRun]:
    """The runs in a JSON-lines table whose rows are of several kinds (module docstring); a restart in the
    file (its step going back) starts a run of its own (``segments.split_runs``)."""
    training = table.filter(pa.array([not is_eval(label) for label in table.column(kinds).to_pylist()]))
    axis = training.column(_step_axis(training))
    steps = (
        axis.cast(pa.float64()).fill_null(np.nan).to_numpy()
        if pa.types.is_integer(axis.type) or pa.types.is_floating(axis.type)
        else np.zeros(training.num_rows)
    )
    runs = []
    for part, rows in split_runs(path, name, steps):
        piece = training if len(rows) == training.num_rows else training.take(pa.array(rows))
        runs.append(_kinds_run(path, part, piece, kinds, fmt))
    return runs


def _kinds_run(path: Path, name: str, table: pa.Table, kinds: str, fmt: str) -> ForeignRun:
    merged, step, kept = merge_kinds(table, kinds)
    wall = next((c for c in WALL_TIME_COLUMNS if c in merged.column_names and _numeric(merged, c)), None)
    if wall is not None and wall != "wall_time":
        merged = merged.rename_columns(["wall_time" if c == wall else c for c in merged.column_names])
    if "step" in merged.column_names and step != "step":
        merged = merged.rename_columns(["metric_step" if c == "step" else c for c in merged.column_names])
    config = {"step_column": step, "row_kinds": ",".join(kept)}
    return foreign_run(path, fmt, name, one_row_per_step(merged, step), info={"config": config})


def _numeric(table: pa.Table, name: str) -> bool:
    kind = table.schema.field(name).type
    return pa.types.is_integer(kind) or pa.types.is_floating(kind)
