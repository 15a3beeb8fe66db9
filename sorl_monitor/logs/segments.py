"""One log, several runs: a run restarted or resumed in the same file, two jobs writing one file in turn, told apart
by its step going back (``split_runs``); and a flat log's table made into its runs (``wide_run``)."""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sorl_monitor.logs.input_limits import parse_number
from sorl_monitor.logs.table import (
    NO_STEPS,
    STEP_COLUMNS,
    WALL_TIME_COLUMNS,
    ForeignRun,
    LogFormatError,
    LogWarning,
    foreign_run,
    numeric_type,
    one_row_per_step,
    run_name,
    step_column,
)

INTERLEAVED_MAX_ROWS = 3.0
"""A log whose step goes back this often that its pieces average fewer rows than this is two runs interleaved
(two jobs writing one file), not a run restarted: its rows are told apart by each step's occurrence."""


def restart_segments(steps: np.ndarray, *, one_row_per_step: bool = False) -> tuple[np.ndarray, str]:
    """Which run each row of a log belongs to, rows in the log's order: ``(run index per row, how)``.

    A run restarted in the same file (a job started again, a resume from an earlier checkpoint) shows as its
    step going back: each stretch between such points is a run of its own (``how`` = ``"restart"``), never
    merged into one curve. With ``one_row_per_step`` (a log that prints each step once, as a console does), a
    step printed again goes back too. Where the step goes back so often that the stretches average fewer than
    ``INTERLEAVED_MAX_ROWS`` rows, two runs were written in turn: the k-th row of a step goes to run k
    (``"interleaved"``). Rows without a step (NaN) belong to the run of the row before them. One run:
    ``(zeros, "")``."""
    steps = np.asarray(steps, np.float64)
    valid = np.flatnonzero(~np.isnan(steps))
    runs = np.zeros(len(steps), np.int64)
    if len(valid) < 2:
        return runs, ""
    at = steps[valid]
    goes_back = at[1:] <= at[:-1] if one_row_per_step else at[1:] < at[:-1]
    back = np.flatnonzero(goes_back) + 1  # positions in ``valid`` that start a run
    if not len(back):
        return runs, ""
    if len(valid) / (len(back) + 1) < INTERLEAVED_MAX_ROWS:
        _, inverse = np.unique(at, return_inverse=True)
        order = np.argsort(inverse, kind="stable")
        bounds = np.searchsorted(inverse[order], np.arange(inverse.max() + 2))
        of_valid = np.empty(len(valid), np.int64)
        for start, end in zip(bounds[:-1], bounds[1:], strict=True):
            of_valid[order[start:end]] = np.arange(end - start)
        how = "interleaved"
    else:
        starts = np.zeros(len(valid), np.int64)
        starts[back] = 1
        of_valid = np.cumsum(starts)
        how = "restart"
    runs[valid] = of_valid
    filled = np.maximum.accumulate(np.where(~np.isnan(steps), np.arange(len(steps)), -1))
    return np.where(filled >= 0, runs[np.maximum(filled, 0)], 0), how


def joined_lines(steps: np.ndarray) -> np.ndarray:
    """Rows whose step looks like a cut line joined to the next one (``step:6`` cut, then ``1 - …`` of a
    restart: ``step:61``): far ahead of the rows around it (more than 10 × the usual gap) with the next row
    back at or below the one before it. Their values belong to no step."""
    steps = np.asarray(steps, np.float64)
    valid = np.flatnonzero(~np.isnan(steps))
    bad = np.zeros(len(steps), bool)
    if len(valid) < 4:
        return bad
    at = steps[valid]
    gaps = np.diff(at)
    usual = np.median(gaps[gaps > 0]) if (gaps > 0).any() else 1.0
    middle = (at[1:-1] - at[:-2] > 10 * usual) & (at[2:] <= at[:-2] + usual)
    bad[valid[1:-1][middle]] = True
    return bad


def split_runs(
    source: Path,
    name: str,
    steps: np.ndarray,
    *,
    unit: str = "row",
    positions: Sequence[int] | None = None,
    one_row_per_step: bool = False,
    axis: str = "step",
) -> list[tuple[str, np.ndarray]]:
    """``[(run name, row indices)]`` of a log's rows by ``restart_segments``: ``[(name, all rows)]`` for one run,
    else ``name+1``, ``name+2``, … with one warning naming the file, where (``unit`` ``positions[i]``, 1-based;
    default the row's number) and how many runs it holds; ``axis`` names what ``steps`` count (an ``epoch``).
    Rows that are cut lines joined to the next (``joined_lines``, with ``one_row_per_step``) are left out with
    a warning."""
    steps = np.asarray(steps, np.float64)
    where = list(positions) if positions is not None else list(range(1, len(steps) + 1))
    keep = np.arange(len(steps))
    if one_row_per_step:
        joined = joined_lines(steps)
        if joined.any():
            first = int(np.flatnonzero(joined)[0])
            warnings.warn(
                f"{source}: {int(joined.sum())} {unit}(s) whose step jumps far ahead and back, a cut line joined "
                f"to the next (first: {unit} {where[first]}, step {int(steps[first])}), left out",
                LogWarning,
                stacklevel=3,
            )
            keep = np.flatnonzero(~joined)
    runs, how = restart_segments(steps[keep], one_row_per_step=one_row_per_step)
    pieces = [keep[runs == k] for k in range(int(runs.max()) + 1 if len(runs) else 1)]
    if how == "restart":
        pieces = _stitch_resumes(source, steps, pieces, unit, where, axis)
    count = len(pieces)
    if count == 1:
        return [(name, pieces[0])]
    parts = [(run_name(f"{name}+{k + 1}"), rows) for k, rows in enumerate(pieces)]
    first_new = int(min(rows.min() for rows in pieces[1:]))
    shown = "; ".join(
        f"{part} {axis}s {np.nanmin(steps[rows]):g}–{np.nanmax(steps[rows]):g} ({len(rows)} {unit}s)"
        for part, rows in parts[:4]
        if np.isfinite(steps[rows]).any()
    ) + (f"; and {count - 4} more" if count > 4 else "")
    if how == "interleaved":
        said = f"{axis}s repeat in turn from {unit} {where[first_new]}: {count} runs written into one file"
    else:
        said = f"its {axis} goes back {count - 1} time(s), first at {unit} {where[first_new]}: restarted"
    warnings.warn(
        f"{source}: {said}; read as {count} runs, each judged on its own: {shown}", LogWarning, stacklevel=3
    )
    return parts


def _stitch_resumes(
    source: Path, steps: np.ndarray, pieces: list[np.ndarray], unit: str, where: Sequence[int], axis: str
) -> list[np.ndarray]:
    """Pieces of a log that go back to an earlier step but not to the start of the run they follow are that run
    resumed from a checkpoint: stitched onto it, the resumed rows replacing those of the steps it ran again
    (one warning each); a piece that starts again from the first step (or before) is a run of its own."""
    out: list[np.ndarray] = []
    for rows in pieces:
        finite = rows[~np.isnan(steps[rows])]
        if out and len(finite):
            earlier = out[-1]
            start = steps[finite[0]]
            known = earlier[~np.isnan(steps[earlier])]
            if len(known) and start > steps[known].min():
                kept = earlier[~(steps[earlier] >= start)]
                warnings.warn(
                    f"{source}: resumed at {unit} {where[int(finite[0])]} from {axis} {start:g}: "
                    f"{len(earlier) - len(kept)} earlier {unit}s of {axis}s {start:g}–"
                    f"{np.nanmax(steps[earlier]):g} replaced by the resumed run's",
                    LogWarning,
                    stacklevel=4,
                )
                out[-1] = np.concatenate([kept, rows])
                continue
        out.append(rows)
    return out


def segmented_runs(
    source: Path,
    fmt: str,
    name: str,
    table: pa.Table,
    step: str,
    *,
    info: Mapping[str, Any] | None = None,
    family: str | None = "auto",
    unit: str = "row",
    positions: Sequence[int] | None = None,
) -> list[ForeignRun]:
    """``foreign_run`` of each run in a flat table whose rows are in the log's order (``split_runs``), each with
    one row per step (``one_row_per_step``)."""
    column = table.column(step)
    if pa.types.is_integer(column.type) or pa.types.is_floating(column.type):
        steps = column.cast(pa.float64()).fill_null(np.nan).to_numpy()
    elif pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
        parsed = [parse_number(text) if text is not None else None for text in column.to_pylist()]
        steps = np.array([np.nan if v is None else v for v in parsed], np.float64)
    else:
        steps = np.zeros(table.num_rows)  # one_row_per_step says what is wrong with it
    out = []
    for part, rows in split_runs(source, name, steps, unit=unit, positions=positions):
        piece = table if len(rows) == table.num_rows else table.take(pa.array(rows))
        extra = {"segment_of": name} if part != name else {}
        out.append(
            foreign_run(
                source,
                fmt,
                part,
                one_row_per_step(piece, step, source),
                info={**(info or {}), **extra},
                family=family,
            )
        )
    return out


def wide_run(
    source: Path, fmt: str, name: str, table: pa.Table, info: Mapping[str, Any] | None = None
) -> list[ForeignRun]:
    """``foreign_run`` of a flat log's table: its step column found (``STEP_COLUMNS``), its wall time
    (``WALL_TIME_COLUMNS``, numeric) as ``wall_time``, rows of one step merged, a restart a run of its own
    (``segmented_runs``)."""
    if not table.column_names:
        return [foreign_run(source, fmt, name, NO_STEPS, info=info)]
    step = step_column(table.column_names)
    if step is None:
        raise LogFormatError(f"{source} has no step column (looked for {', '.join(STEP_COLUMNS)})")
    wall = next(
        (
            c
            for c in WALL_TIME_COLUMNS
            if c in table.column_names and numeric_type(table.schema.field(c).type)
        ),
        None,
    )
    if wall is not None:
        table = table.rename_columns(["wall_time" if c == wall else c for c in table.column_names])
    _warn_rows_without_step(source, table, step)
    return segmented_runs(source, fmt, name, table, step, info=info)


def _warn_rows_without_step(source: Path, table: pa.Table, step: str) -> None:
    """Warn (naming the columns they hold) about rows with values but no step: ``one_row_per_step`` leaves
    them out (a W&B history's reward rows logged without ``train/global_step``)."""
    if not table.column(step).null_count:
        return
    stepless = table.filter(pc.is_null(table.column(step)))
    held = [
        c for c in stepless.column_names if c != step and stepless.column(c).null_count < stepless.num_rows
    ]
    if held:
        shown = ", ".join(held[:6]) + (f" and {len(held) - 6} more" if len(held) > 6 else "")
        warnings.warn(
            f"{source}: {stepless.num_rows} rows without a {step} are left out (they hold {shown})",
            LogWarning,
            stacklevel=4,
        )
