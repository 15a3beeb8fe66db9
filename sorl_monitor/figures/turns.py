"""Turn-level figures: the turn ratio ``w̄_k`` by turn and step, and turn vs token ratios at one step."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import plotly.graph_objects as go
import pyarrow as pa

from sorl_monitor.diagnose.timeline import Timeline
from sorl_monitor.figures.rows import axis_refs, run_events, run_rows_layout
from sorl_monitor.figures.series import XAxis
from sorl_monitor.figures.style import FONT, MISSING_CELL, empty_figure, run_color
from sorl_monitor.read.step_rows import column_values

RATIO_SUMMARY = ("ratio_min", "ratio_p01", "ratio_mean", "ratio_p99", "ratio_max")
"""The step's token-ratio summary drawn beside the turn ratios (``steps`` columns)."""


def turn_ratio_grid(cells: pa.Table, max_columns: int = 400) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(steps, turn indices, grid)`` of the mean turn ratio ``w̄`` per (turn, step) from turn cells.

    With more than ``max_columns`` steps, consecutive steps are bucketed and each (turn, bucket) keeps
    the cell furthest from 1 (largest ``|log w̄|``), labelled with the bucket's first step.
    """
    if cells.num_rows == 0:
        return np.array([], np.int64), np.array([], np.int64), np.empty((0, 0))
    steps, step_at = np.unique(column_values(cells, "step").astype(np.int64), return_inverse=True)
    turns, turn_at = np.unique(column_values(cells, "turn_idx").astype(np.int64), return_inverse=True)
    grid = np.full((len(turns), len(steps)), np.nan)
    grid[turn_at, step_at] = column_values(cells, "ratio_mean")
    if len(steps) <= max_columns:
        return steps, turns, grid
    size = math.ceil(len(steps) / max_columns)
    buckets = math.ceil(len(steps) / size)
    padded = np.full((len(turns), buckets * size), np.nan)
    padded[:, : len(steps)] = grid
    blocks = padded.reshape(len(turns), buckets, size)
    with np.errstate(divide="ignore", invalid="ignore"):
        distance = np.abs(np.log(blocks))
    chosen = np.argmax(np.where(np.isfinite(distance), distance, -np.inf), axis=2)
    return steps[::size], turns, np.take_along_axis(blocks, chosen[..., None], axis=2)[..., 0]


def turn_heatmap_figure(
    cells: Mapping[str, pa.Table],
    axis: XAxis | None = None,
    max_columns: int = 400,
    events: Mapping[str, Timeline] | None = None,
) -> go.Figure:
    """Turn index × step of ``w̄_k`` per run (``cells``: each run's turn cells), one row per run on one x axis.

    Colour: log₂ w̄, white at 1, red above, blue below; grey: no turn logged there. Long runs keep, per
    bucket of steps, the cell furthest from 1, so one bad step stays visible. ``axis`` maps steps to the
    chosen x axis (steps when ``None``); ``events``: each run's timeline, whose collapse and CTN spans are
    marked on its row.
    """
    grids = {run_id: turn_ratio_grid(table, max_columns) for run_id, table in cells.items()}
    grids = {run_id: grid for run_id, grid in grids.items() if len(grid[0])}
    if not grids:
        return empty_figure("no turn rows logged")
    logs = {run_id: _log2(grid[2]) for run_id, grid in grids.items()}
    finite = np.concatenate([np.abs(v[np.isfinite(v)]) for v in logs.values()])
    cap = min(max(float(finite.max()) if len(finite) else 0.0, 0.5), 4.0)
    ticks = [t for t in range(-4, 5) if abs(t) <= cap] if cap >= 1 else [-cap, 0.0, cap]
    layout = run_rows_layout(
        list(grids), row_px=150, x_title="step" if axis is None else axis.title,
        y_axis={"title": {"text": "turn"}, "dtick": 1, "showgrid": False}, uirevision="turn-heatmap",
    )  # fmt: skip
    layout["plot_bgcolor"] = MISSING_CELL
    traces = []
    for row, (run_id, (steps, turns, ratios)) in enumerate(grids.items(), start=1):
        x = steps if axis is None else axis.at(run_id, steps)
        traces.append(
            {"type": "heatmap", "x": x, "y": turns, "z": logs[run_id].astype(np.float32), "zmin": -cap,
             "zmax": cap, "zmid": 0, "colorscale": "RdBu_r", "customdata": ratios.astype(np.float32),
             **axis_refs(row), "showscale": row == 1,
             "hovertemplate": f"{run_id}<br>step %{{x}}<br>turn %{{y}}<br>w̄ = %{{customdata:.4g}}<extra></extra>",
             "colorbar": {"title": {"text": "w̄"}, "tickvals": ticks, "ticktext": [f"{2**t:.3g}" for t in ticks],
                          "len": min(1.0, 260 / (layout["height"] - 70)), "y": 1, "yanchor": "top"}}
        )  # fmt: skip
        marks, labels = run_events(row, run_id, (events or {}).get(run_id), axis)
        layout.setdefault("shapes", []).extend(marks)
        layout["annotations"] += labels
    return go.Figure(data=traces, layout=layout)


def _log2(ratios: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.log2(np.where(ratios > 0, ratios, np.nan))


@dataclass(frozen=True)
class StepRatios:
    """One run at one step: its raw ``turns`` rows, its ``steps`` row (a dict), and its PPO clip ε."""

    step: int
    turns: pa.Table
    step_row: dict[str, Any]
    clip_eps: float


def ratio_distribution_figure(runs: Mapping[str, StepRatios]) -> go.Figure:
    """At one step per run: each turn's ``w̄_k``, its tokens' extremes, and the step's token-ratio summary.

    Rows per run: ``turn w̄_k`` (one point per turn), ``tokens in each turn`` (each turn's ``ratio_min``
    and ``ratio_max``), ``token r_t`` (thin line min–max, thick p01–p99, mark at the mean); the green band
    is the run's trust region ``[1−ε, 1+ε]``. Log x axis.
    """
    traces: list[dict[str, Any]] = []
    shapes: list[dict[str, Any]] = []
    categories: list[str] = []
    for index, (run_id, at) in enumerate(runs.items()):
        prefix = f"{run_id} · " if len(runs) > 1 else ""
        color = run_color(index)
        rows = []
        turn_ratios = _positive(column_values(at.turns, "ratio_mean"))
        if len(turn_ratios):
            rows.append(prefix + "turn w̄_k")
            traces.append(_box(turn_ratios, rows[-1], color, "w̄"))
        extremes = _positive(
            np.concatenate([column_values(at.turns, "ratio_min"), column_values(at.turns, "ratio_max")])
        )
        if len(extremes):
            rows.append(prefix + "tokens in each turn (min, max)")
            traces.append(_box(extremes, rows[-1], color, "r"))
        token = {k: at.step_row.get(k) for k in RATIO_SUMMARY}
        if all(_is_positive(v) for v in token.values()):
            rows.append(prefix + "token r_t (min, p01, mean, p99, max)")
            traces += _token_summary(token, rows[-1], color)
        if rows:
            first = len(categories)
            categories += rows
            shapes.append(
                {"type": "rect", "xref": "x", "yref": "y", "x0": 1 - at.clip_eps, "x1": 1 + at.clip_eps,
                 "y0": first - 0.5, "y1": len(categories) - 0.5, "fillcolor": "rgba(34, 139, 34, 0.12)",
                 "line": {"width": 0}, "layer": "below"}
            )  # fmt: skip
    if not traces:
        return empty_figure("no turn or token ratios logged at this step")
    return go.Figure(
        data=traces,
        layout={
            "xaxis": {"type": "log", "dtick": 1, "title": {"text": "importance ratio π_θ/π_old (band: trust region)"}},
            "yaxis": {"categoryorder": "array", "categoryarray": list(reversed(categories)), "type": "category"},
            "shapes": shapes, "showlegend": False, "height": 90 + 56 * len(categories), "font": FONT,
            "margin": {"t": 16, "b": 46, "l": 300 if len(runs) > 1 else 230, "r": 20},
            "template": "plotly_white", "uirevision": "ratio-distribution",
        },
    )  # fmt: skip


def _box(values: np.ndarray, name: str, color: str, symbol: str) -> dict[str, Any]:
    return {"type": "box", "x": values, "y": [name] * len(values), "name": name, "boxpoints": "all",
            "jitter": 0.5, "pointpos": 0, "orientation": "h", "marker": {"size": 4, "color": color},
            "line": {"color": color}, "hovertemplate": f"{symbol} = %{{x:.4g}}<extra></extra>"}  # fmt: skip


def _token_summary(token: dict[str, Any], name: str, color: str) -> list[dict[str, Any]]:
    """Thin line min–max, thick line p01–p99, a white mark at the mean."""
    return [
        {"type": "scatter", "x": [token["ratio_min"], token["ratio_max"]], "y": [name, name],
         "mode": "lines+markers", "line": {"color": color, "width": 2},
         "marker": {"symbol": "line-ns-open", "size": 14}, "hovertemplate": "token min/max %{x:.4g}<extra></extra>"},
        {"type": "scatter", "x": [token["ratio_p01"], token["ratio_p99"]], "y": [name, name], "mode": "lines",
         "line": {"color": color, "width": 12}, "hovertemplate": "token p01/p99 %{x:.4g}<extra></extra>"},
        {"type": "scatter", "x": [token["ratio_mean"]], "y": [name], "mode": "markers",
         "marker": {"color": "white", "size": 9, "line": {"color": "black", "width": 1.5}},
         "hovertemplate": "token mean %{x:.4g}<extra></extra>"},
    ]  # fmt: skip


def _positive(values: np.ndarray) -> np.ndarray:
    return values[np.isfinite(values) & (values > 0)]


def _is_positive(value: Any) -> bool:
    return isinstance(value, int | float) and math.isfinite(value) and value > 0
