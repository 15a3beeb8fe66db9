"""What every log reader shares: the step column, one row per step, metric names mapped to ``steps`` columns.

A reader turns its log into a *wide* Arrow table (a step column, maybe a wall-time column, one column per
metric under the log's own name), or into *long* arrays (step, metric name, value) that ``pivot`` makes
wide; ``foreign_run`` then merges rows of one step, maps the names (``metric_names.map_metrics``) and builds the
``ForeignRun``.
"""

from __future__ import annotations

import json
import math
import re
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sorl_monitor.logs.input_limits import parse_number
from sorl_monitor.metric_names import guess_family, map_metrics, scalar
from sorl_monitor.schema import metric_column

STEP_COLUMNS = (
    "step",
    "global_step",
    "train/global_step",
    "trainer/global_step",
    "grpo_step",
    "_step",
    "Step",
    "iteration",
    "iter",
    "optimizer_step",
    "current_steps",
)
"""Step columns of flat logs, in the order they are looked for (the first one present is the step).
``train/global_step`` comes before W&B's own ``_step`` (a counter of ``wandb.log`` calls, not of updates);
``grpo_step`` (hand-written GRPO loops: the rollout batch's index) before ``optimizer_step``; ``current_steps``:
LLaMA-Factory's ``trainer_log.jsonl``."""
WALL_TIME_COLUMNS = ("wall_time", "_timestamp", "timestamp")
"""Columns read as the row's wall time (Unix seconds) when numeric, in this order."""
DROPPED_COLUMNS = frozenset({"_step", "_timestamp", "", "Unnamed: 0"})
"""Bookkeeping columns of W&B and pandas dumps that are not metrics (W&B's call counter, its timestamp, the
index column ``DataFrame.to_csv`` writes)."""
TRAINER_PREFIX = "train/"
"""transformers' TensorBoard, W&B and Comet callbacks log ``loss`` as ``train/loss`` (and eval metrics as
``eval/…``): when only the names without this prefix match a trainer family, the prefix is dropped."""

NO_STEPS = pa.table({"step": pa.array([], pa.int64())})
"""The wide table of a log that has logged no training step yet."""


class LogFormatError(ValueError):
    """A log that cannot be read: unknown format, unreadable content, a missing optional package."""


class LogWarning(UserWarning):
    """Part of a log was skipped (lines that do not parse); the rest is read."""


@dataclass
class ForeignRun:
    """One run read from another tool's log, held in memory."""

    run_id: str
    """A safe run name (``schema.check_run_id``-valid), unique within one ``RunSet``."""
    source: Path
    """The file or folder it came from."""
    format: str
    family: str | None
    """Trainer family (``metric_names.guess_family`` over its metric names), or ``None``."""
    info: dict[str, Any] = field(default_factory=dict)
    """What ``run.json`` would hold: ``status`` ("imported"), ``algorithm`` when the log says it, ``config``."""
    steps: pa.Table = field(default_factory=pa.table)
    """One row per logged training step: ``run_id, rank, step, wall_time`` (when known), the mapped columns."""


_UNSAFE = re.compile(r"[^A-Za-z0-9._=+-]+")


def run_name(text: str) -> str:
    """``text`` (a file stem, a folder, a run name from the log) made a valid run id: runs of other
    characters become ``-`` (``grpo exp#1`` → ``grpo-exp-1``), as ``integrations.verl.safe_run_name`` does."""
    return _UNSAFE.sub("-", text).lstrip("._=+-")[:128] or "run"


def unique_ids(runs: Iterable[ForeignRun], taken: Iterable[str] = ()) -> None:
    """Rename runs in place so that no two share an id, nor any run share one of ``taken`` (``-2``, ``-3``…)."""
    used = set(taken)
    for run in runs:
        base, number = run.run_id, 1
        while run.run_id in used:
            number += 1
            suffix = f"-{number}"
            run.run_id = base[: 128 - len(suffix)] + suffix
        used.add(run.run_id)
        if run.steps.num_rows:
            run.steps = run.steps.set_column(
                0, "run_id", pa.repeat(pa.scalar(run.run_id), run.steps.num_rows)
            )


def step_column(names: Iterable[str]) -> str | None:
    """The step column among ``names`` (``STEP_COLUMNS`` order), or ``None``."""
    present = set(names)
    return next((name for name in STEP_COLUMNS if name in present), None)


def records_table(records: Sequence[Mapping[str, Any]]) -> pa.Table:
    """Rows (dicts of scalars) as a table; a column whose values mix types keeps them as ``scalar`` makes them
    (numbers as float, huge integers as ±inf), and as text when numbers and text mix."""
    names = list(dict.fromkeys(name for record in records for name in record))
    columns = {}
    for name in names:
        values = [record.get(name) for record in records]
        try:
            columns[name] = pa.array(values)
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
            values = [scalar(value) for value in values]
            try:
                columns[name] = pa.array(values)
            except (pa.ArrowInvalid, pa.ArrowTypeError):
                columns[name] = pa.array([None if v is None else str(v) for v in values], pa.string())
    return pa.table(columns) if columns else pa.table({})


def flat_record(record: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested dict as one level: ``{"data": {"a": 1}}`` → ``{"data.a": 1}`` (as Arrow's ``flatten`` names it)."""
    flat: dict[str, Any] = {}
    for key, value in record.items():
        if isinstance(value, Mapping):
            flat.update(flat_record(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def flatten(table: pa.Table) -> pa.Table:
    """Struct columns flattened (``data.a``) until none is left."""
    while any(pa.types.is_struct(f.type) for f in table.schema):
        table = table.flatten()
    return table


def one_row_per_step(table: pa.Table, step: str, source: Path | None = None) -> pa.Table:
    """``table`` with its ``step`` column as ``step`` (int64), one row per step in step order.

    Rows without a step are dropped; rows of one step are merged, the last non-null value of each column
    winning (a metric logged twice at one step keeps the later value). ``LogFormatError`` when the step
    column holds values that are not whole numbers.
    """
    column = table.column(step)
    textual = pa.types.is_string(column.type) or pa.types.is_large_string(column.type)
    if not (pa.types.is_integer(column.type) or pa.types.is_floating(column.type) or textual):
        raise LogFormatError(f"its step column {step!r} holds {column.type} values, not step numbers")
    try:
        if textual:
            raise pa.ArrowInvalid("text steps")
        column = column.cast(pa.int64())
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        if source is None:
            raise LogFormatError(
                f"its step column {step!r} holds values that are not whole numbers"
            ) from None
        table, column = _rows_with_64_bit_steps(table, step, source)
    table = table.drop_columns([step]).add_column(0, "step", column)
    table = table.filter(pc.is_valid(table.column("step")))
    if table.num_rows and pc.count_distinct(table.column("step")).as_py() < table.num_rows:
        others = table.column_names[1:]
        merged = table.group_by("step", use_threads=False).aggregate([(name, "last") for name in others])
        table = merged.select(["step", *(f"{name}_last" for name in others)]).rename_columns(
            table.column_names
        )
    steps = table.column("step").to_numpy()
    return table if np.all(steps[1:] >= steps[:-1]) else table.sort_by("step")


def _rows_with_64_bit_steps(table: pa.Table, step: str, source: Path) -> tuple[pa.Table, pa.ChunkedArray]:
    """The rows whose step is a whole number that fits 64 bits (a number, or text that is one: ``"25"``), and
    their steps; one warning naming the file, the first such row and how many were left out."""
    raw = table.column(step).to_pylist()
    steps = [parse_number(s) if isinstance(s, str) else s for s in raw]
    fits = [
        s is None or (s is not False and math.isfinite(s) and float(s).is_integer() and -(2**63) <= s < 2**63)
        for s in steps
    ]
    bad = [i for i, ok in enumerate(fits) if not ok]
    if bad:
        warnings.warn(
            f"{source}: {len(bad)} rows with a step that is not a 64-bit whole number left out "
            f"(first: row {bad[0] + 1}, step {raw[bad[0]]!r})",
            LogWarning,
            stacklevel=4,
        )
    kept = [int(s) if s is not None else None for s, ok in zip(steps, fits, strict=True) if ok]
    return table.filter(pa.array(fits)), pa.chunked_array([pa.array(kept, pa.int64())])


def pivot(
    steps: np.ndarray, names: Sequence[str] | pa.Array, values: np.ndarray, wall: np.ndarray | None
) -> pa.Table:
    """Long ``(step, name, value)`` points as a wide table: ``step``, ``wall_time`` (latest per step), one
    column per name (null where that name has no point at that step; the last point of a name at one step wins)."""
    steps = np.asarray(steps, np.int64)
    codes = (
        names if isinstance(names, pa.DictionaryArray) else pa.array(names, pa.string()).dictionary_encode()
    )
    indices = np.asarray(codes.indices.to_numpy(zero_copy_only=False), np.int64)
    unique_steps, at = np.unique(steps, return_inverse=True)
    columns: dict[str, pa.Array] = {"step": pa.array(unique_steps, pa.int64())}
    if wall is not None:
        latest = np.full(len(unique_steps), -np.inf)
        np.maximum.at(latest, at, np.asarray(wall, np.float64))
        columns["wall_time"] = pa.array(latest, pa.float64())
    order = np.argsort(indices, kind="stable")
    bounds = np.searchsorted(indices[order], np.arange(len(codes.dictionary) + 1))
    values = np.asarray(values, np.float64)
    for code, name in enumerate(codes.dictionary.to_pylist()):
        chosen = order[bounds[code] : bounds[code + 1]]
        if not len(chosen):
            continue
        last = len(chosen) - 1 - np.unique(at[chosen][::-1], return_index=True)[1]
        where = at[chosen][last]
        column = np.full(len(unique_steps), np.nan)
        present = np.zeros(len(unique_steps), bool)
        column[where] = values[chosen][last]
        present[where] = True
        columns[name] = pa.array(column, pa.float64(), mask=~present)
    return pa.table(columns)


def without_trainer_prefix(names: Sequence[str]) -> dict[str, str]:
    """``{name: name to map}``: ``train/loss`` → ``loss`` when only the unprefixed names match a trainer family
    (transformers' logging callbacks add the prefix); otherwise every name as it is."""
    if guess_family(names) is not None or not any(n.startswith(TRAINER_PREFIX) for n in names):
        return {name: name for name in names}
    stripped = {name: name.removeprefix(TRAINER_PREFIX) for name in names}
    if guess_family(stripped.values()) is None:
        return {name: name for name in names}
    return stripped


def column_mapping(names: Sequence[str], family: str | None) -> list[tuple[str, str]]:
    """``(log name, steps column)`` pairs as ``metric_names.map_metrics`` maps one row holding every name.

    ``map_metrics`` renames (mapped names first, others snake-cased, collisions dropped); asking it once with
    each name's position as its value tells which name fills which column, so the mapping runs once per
    log, not once per value.
    """
    probe = {name: float(position) for position, name in enumerate(names)}
    return [(names[int(position)], column) for column, position in map_metrics(probe, family).items()]


def foreign_run(
    source: Path,
    fmt: str,
    name: str,
    wide: pa.Table,
    *,
    info: Mapping[str, Any] | None = None,
    family: str | None = "auto",
) -> ForeignRun:
    """A ``ForeignRun`` from a wide table with a ``step`` column (one row per step) and maybe ``wall_time``.

    Metric columns are renamed through ``map_metrics`` with ``family`` (``"auto"``: guessed from their
    names, after ``without_trainer_prefix``; a format that is one trainer's own, like verl's file
    logger, gives its family); a metric whose column is a key's is kept as ``metric_<key>``; columns
    in ``DROPPED_COLUMNS``, columns that are all null and non-scalar columns are left out;
    integers become floats (as ``Monitor.log_scalars`` stores them), booleans and text stay.
    """
    skipped = DROPPED_COLUMNS | {"step", "wall_time"}
    metrics = [
        n
        for n in wide.column_names
        if n not in skipped
        and _scalar_type(wide.schema.field(n).type)
        and wide.column(n).null_count < wide.num_rows
    ]
    renamed = without_trainer_prefix(metrics) if family == "auto" else {n: n for n in metrics}
    by_name = {renamed[n]: n for n in metrics}
    if family == "auto":
        family = guess_family(by_name)
    mapping = column_mapping(list(by_name), family)
    if len(mapping) > MAX_METRIC_COLUMNS:
        mapping = _widest_kept(source, mapping, wide, by_name)
    columns: dict[str, pa.ChunkedArray] = {
        "run_id": pa.chunked_array([pa.repeat(pa.scalar(name), wide.num_rows)]),
        "rank": pa.chunked_array([pa.repeat(pa.scalar(0, pa.int32()), wide.num_rows)]),
        "step": wide.column("step"),
    }
    if "wall_time" in wide.column_names:
        columns["wall_time"] = wide.column("wall_time").cast(pa.float64())
    for mapped_name, column in mapping:
        values = wide.column(by_name[mapped_name])
        if pa.types.is_string(values.type) or pa.types.is_large_string(values.type):
            values = _numbers_with_bad_cells_null(values, wide.column("step"), source, by_name[mapped_name])
        if pa.types.is_integer(values.type) or pa.types.is_null(values.type):
            values = values.cast(pa.float64())
        columns.setdefault(metric_column(column), values)
    run_info = {"status": "imported", "format": fmt, "source": str(source), **(info or {})}
    return ForeignRun(name, source, fmt, family, run_info, pa.table(columns))


MAX_METRIC_COLUMNS = 2000
"""The most metric columns one foreign run keeps: the schema's columns and the names with the most values first
(a line of 60,000 cells would otherwise cost the query layer minutes and gigabytes for names no detector reads)."""


def _widest_kept(
    source: Path, mapping: list[tuple[str, str]], wide: pa.Table, by_name: Mapping[str, str]
) -> list[tuple[str, str]]:
    """``MAX_METRIC_COLUMNS`` of ``mapping``: the schema's columns, then the others by how many values they hold
    (first logged first among equals); one warning naming the file and how many were left out."""
    from sorl_monitor.schema import STEP_METRICS

    known = set(STEP_METRICS)
    ranked = sorted(
        range(len(mapping)),
        key=lambda i: (mapping[i][1] not in known, wide.column(by_name[mapping[i][0]]).null_count, i),
    )
    kept = sorted(ranked[:MAX_METRIC_COLUMNS])
    left = len(mapping) - len(kept)
    first = mapping[ranked[MAX_METRIC_COLUMNS]][0]
    warnings.warn(
        f"{source}: {left} of its {len(mapping)} metric names left out (at most {MAX_METRIC_COLUMNS} a run, the "
        f"schema's and the most often logged first; first left out: {first!r})",
        LogWarning,
        stacklevel=4,
    )
    return [mapping[i] for i in kept]


def _numbers_with_bad_cells_null(
    values: pa.ChunkedArray, steps: pa.ChunkedArray, source: Path, name: str
) -> pa.ChunkedArray:
    """A text column whose cells are mostly numbers (``"0.5"``, or JSON numbers beside one ``"N/A"``) as
    doubles, each cell that is no number null, with one warning naming the file, the column and the first
    such cell's step; a column of mostly words stays text."""
    texts = values.to_pylist()
    numbers = [None if text is None else parse_number(text) for text in texts]
    bad = [
        i
        for i, (text, number) in enumerate(zip(texts, numbers, strict=True))
        if text is not None and number is None
    ]
    if len(bad) * 2 > len(texts) - values.null_count:
        return values
    if bad:
        first = bad[0]
        warnings.warn(
            f"{source}: {len(bad)} cells of {name} are not numbers, read as null "
            f"(first: step {steps[first].as_py()}: {texts[first][:40]!r})",
            LogWarning,
            stacklevel=5,
        )
    return pa.chunked_array([pa.array(numbers, pa.float64())])


def numeric_type(kind: pa.DataType) -> bool:
    return pa.types.is_integer(kind) or pa.types.is_floating(kind)


def _scalar_type(kind: pa.DataType) -> bool:
    return (
        pa.types.is_integer(kind)
        or pa.types.is_floating(kind)
        or pa.types.is_boolean(kind)
        or pa.types.is_string(kind)
        or pa.types.is_large_string(kind)
        or pa.types.is_null(kind)
    )


def json_config(values: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON-able scalar entries of a mapping (a log's hyperparameters, as ``run.json``'s ``config``)."""
    config = {}
    for key, value in values.items():
        try:
            json.dumps(value)
        except (TypeError, ValueError):
            continue
        config[str(key)] = value
    return config
