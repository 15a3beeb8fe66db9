"""Plotly figures of the live dashboard: tables in (from ``LiveRuns``), figure out; no I/O here.

* ``overview_figure`` — per-step curves of one or more runs on a shared step axis (reward, clip
  fraction token vs turn and low/high, KL, grad norm, entropy, response length, IS-ratio maxima),
  with alert markers by severity, CTN-on spans shaded and the collapse step marked;
* ``turn_heatmap_figure`` — turn index × step of the turn-level IS ratio ``w̄_k``;
* ``ratio_distribution_figure`` — at one step, turn ratios vs token ratios (the granularity mismatch);
* ``module_norms_figure`` — per-module grad norms over steps.

Every curve is downsampled with ``minmax_indices`` (each bucket's min and max), so spikes stay visible;
non-finite values (and values ≤ 0 on log axes) are left out of the curves (the ``nonfinite`` detector
marks them).
Figures carry a ``uirevision``: a live update keeps the viewer's zoom.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import plotly.graph_objects as go
import pyarrow as pa
from plotly.colors import qualitative
from plotly.subplots import make_subplots

from sorl_monitor.dashboard_data import RunCurves, column_values, downsample, turn_ratio_grid
from sorl_monitor.report import DETECTOR_PANEL, step_shapes


@dataclass(frozen=True)
class Panel:
    """One row of the overview: a title, the ``steps`` columns drawn in it (with labels), log scale or not."""

    title: str
    series: tuple[tuple[str, str], ...]
    log_y: bool = False


OVERVIEW_PANELS = (
    Panel("reward", (("reward_mean", "mean reward"),)),
    Panel(
        "clip fraction",
        (
            ("clip_frac", "token"),
            ("clip_frac_active", "token, where the clip binds"),
            ("clip_frac_turn", "turn"),
            ("clip_frac_low", "token low (r<1−ε)"),
            ("clip_frac_high", "token high (r>1+ε)"),
        ),
    ),
    Panel(
        "KL",
        (
            ("kl_old_k3", "KL(π_old‖π), k3"),
            ("kl_old", "KL to π_old, the trainer's estimator"),
            ("kl_ref_k3", "KL vs reference, k3"),
            ("kl_ref", "KL vs reference, the trainer's estimator"),
        ),
        log_y=True,
    ),
    Panel("grad norm", (("grad_norm", "pre-clip"), ("grad_norm_clipped", "after clipping")), log_y=True),
    Panel("entropy", (("entropy", "entropy"),)),
    Panel(
        "response length",
        (("response_len_mean", "mean tokens"), ("completion_len_mean", "completion tokens")),
    ),
    Panel("IS ratio max", (("ratio_max", "token r_t"), ("turn_ratio_max", "turn w̄_k")), log_y=True),
)
"""The overview's rows, top to bottom; a row none of whose columns were logged is left out."""

DASHES = ("solid", "dash", "dot", "dashdot")
"""Line style of the 1st, 2nd, … series of a panel (the colour tells the run)."""
SEVERITY_STYLE = {
    "info": ("#7f7f7f", "circle-open"),
    "warning": ("#ff8c00", "triangle-up"),
    "critical": ("#d62728", "x"),
}
"""Marker colour and symbol per alert severity."""
CTN_COLOR = "rgba(44, 160, 44, 0.13)"


def run_color(index: int) -> str:
    """The colour of the ``index``-th run (plotly's qualitative palette, cycled)."""
    return qualitative.Plotly[index % len(qualitative.Plotly)]


def logged_panels(runs: Sequence[RunCurves], panels: Sequence[Panel] = OVERVIEW_PANELS) -> list[Panel]:
    """The panels with at least one column holding a finite value in one of ``runs``."""
    return [
        panel
        for panel in panels
        if any(
            np.isfinite(column_values(run.steps, column)).any() for run in runs for column, _ in panel.series
        )
    ]


def _panel_of(detector: str, panels: Sequence[Panel]) -> int:
    """Row (0-based) that shows ``detector``'s markers: the panel of its metric, else the first."""
    columns = DETECTOR_PANEL.get(detector, ())
    for row, panel in enumerate(panels):
        if any(name in columns for name, _ in panel.series):
            return row
    return 0


def _value_at(steps: np.ndarray, values: np.ndarray, step: int) -> float | None:
    index = int(np.searchsorted(steps, step))
    if index < len(steps) and steps[index] == step and np.isfinite(values[index]):
        return float(values[index])
    return None


def overview_figure(
    runs: Sequence[RunCurves], max_points: int = 2000, panels: Sequence[Panel] = OVERVIEW_PANELS
) -> go.Figure:
    """Stacked per-step curves of ``runs`` on one shared step axis (see module docstring)."""
    shown = logged_panels(runs, panels)
    if not shown:
        return _empty("no step metrics logged yet")
    figure = make_subplots(
        rows=len(shown), cols=1, shared_xaxes=True, vertical_spacing=0.035,
        subplot_titles=[panel.title for panel in shown],
    )  # fmt: skip
    several = len(runs) > 1
    shapes: list[dict[str, Any]] = []
    for index, run in enumerate(runs):
        steps = column_values(run.steps, "step")
        for row, panel in enumerate(shown, start=1):
            for position, (column, label) in enumerate(panel.series):
                values = column_values(run.steps, column)
                drawable = np.isfinite(values) & ((values > 0) if panel.log_y else True)
                values = np.where(drawable, values, np.nan)
                if not drawable.any():
                    continue
                x, y = downsample(steps, values, max_points)
                figure.add_trace(
                    go.Scatter(
                        x=x, y=y, mode="lines", name=label, legendgroup=run.run_id, showlegend=False,
                        line={"color": _series_color(index, position, several), "width": 1.5,
                              "dash": DASHES[position % len(DASHES)] if several else "solid"},
                        hovertemplate=f"{run.run_id}<br>{label}: %{{y:.4g}}<br>step %{{x}}<extra></extra>",
                    ),
                    row=row, col=1,
                )  # fmt: skip
        _add_markers(figure, run, shown, steps)
        shapes += step_shapes(run.ctn_spans, run.collapse_step, span_color=CTN_COLOR,
                              collapse_line={"color": "#d62728", "dash": "dash", "width": 1.5})  # fmt: skip
    figure.update_layout(shapes=shapes)
    _add_legends(figure, runs, shown)
    for row, panel in enumerate(shown, start=1):
        if panel.log_y:
            figure.update_yaxes(type="log", row=row, col=1)
    figure.update_xaxes(title_text="step", row=len(shown), col=1)
    figure.update_layout(
        height=150 + 175 * len(shown),
        margin={"t": 60, "b": 40, "l": 60, "r": 170},
        uirevision="overview",
        hovermode="closest",
    )
    return figure


def _series_color(run_index: int, position: int, several: bool) -> str:
    """Several runs: the run's colour (the line style tells the series); one run: a colour per series."""
    return run_color(run_index if several else position)


def _add_legends(figure: go.Figure, runs: Sequence[RunCurves], panels: Sequence[Panel]) -> None:
    """A legend beside each panel with several series; with several runs, a legend of runs on top.

    Legend entries are line samples (no data); clicking a run's entry hides all its curves.
    """
    several = len(runs) > 1
    if several:
        for index, run in enumerate(runs):
            figure.add_trace(
                go.Scatter(x=[None], y=[None], mode="lines", name=run.run_id, legendgroup=run.run_id,
                           line={"color": run_color(index), "width": 3}, legend="legend")
            )  # fmt: skip
        figure.update_layout(legend={"orientation": "h", "yanchor": "bottom", "y": 1.01, "x": 0})
    for row, panel in enumerate(panels, start=1):
        logged = [
            (position, label)
            for position, (column, label) in enumerate(panel.series)
            if any(np.isfinite(column_values(run.steps, column)).any() for run in runs)
        ]
        if len(logged) < 2:
            continue
        name = f"legend{row + 1}"
        for position, label in logged:
            color = "#555555" if several else _series_color(0, position, several)
            figure.add_trace(
                go.Scatter(x=[None], y=[None], mode="lines", name=label, legend=name, hoverinfo="skip",
                           line={"color": color, "dash": DASHES[position % len(DASHES)] if several else "solid"})
            )  # fmt: skip
        top = figure.layout[f"yaxis{row if row > 1 else ''}"].domain[1]
        figure.update_layout(
            {name: {"x": 1.01, "xanchor": "left", "y": top, "yanchor": "top", "font": {"size": 11}}}
        )


def _add_markers(figure: go.Figure, run: RunCurves, panels: Sequence[Panel], steps: np.ndarray) -> None:
    """One marker trace per (panel, severity): at the alert's step, on the panel's first logged curve."""
    groups: dict[tuple[int, str], list[dict[str, Any]]] = {}
    for marker in run.markers:
        row = _panel_of(marker["detector"], panels)
        groups.setdefault((row, marker["severity"]), []).append(marker)
    for (row, severity), marks in sorted(groups.items()):
        columns = [column for column, _ in panels[row].series]
        series = next(
            (v for v in (column_values(run.steps, c) for c in columns) if np.isfinite(v).any()),
            np.full(len(steps), np.nan),
        )
        color, symbol = SEVERITY_STYLE.get(severity, SEVERITY_STYLE["info"])
        figure.add_trace(
            go.Scatter(
                x=[m["step"] for m in marks],
                y=[_value_at(steps, series, m["step"]) for m in marks],
                mode="markers", name=f"{severity} alert", legendgroup=f"alert-{severity}", showlegend=False,
                marker={"color": color, "symbol": symbol, "size": 10, "line": {"width": 2, "color": color}},
                text=[f"{run.run_id} · step {m['step']}<br>{m['detector']} ({severity}): {m['message']}"
                      for m in marks],
                hovertemplate="%{text}<extra></extra>",
            ),
            row=row + 1, col=1,
        )  # fmt: skip


def turn_heatmap_figure(cells: pa.Table, max_columns: int = 400) -> go.Figure:
    """Turn index × step heatmap of the turn-level IS ratio ``w̄_k`` (colour: log₂ w̄, white at 1).

    Long runs are bucketed to ``max_columns`` step columns keeping each bucket's most extreme cell
    (largest ``|log w̄|``), so one bad step stays visible.
    """
    steps, turns, ratios = turn_ratio_grid(cells, max_columns)
    if not len(steps):
        return _empty("no turn rows logged")
    with np.errstate(divide="ignore", invalid="ignore"):
        logs = np.log2(np.where(ratios > 0, ratios, np.nan))
    finite = np.abs(logs[np.isfinite(logs)])
    cap = min(max(float(finite.max()) if len(finite) else 0.0, 0.5), 4.0)
    ticks = [t for t in range(-4, 5) if abs(t) <= cap] if cap >= 1 else [-cap, 0.0, cap]
    figure = go.Figure(
        go.Heatmap(
            x=steps, y=turns, z=logs, zmin=-cap, zmax=cap, zmid=0, colorscale="RdBu_r",
            customdata=ratios, hovertemplate="step %{x}<br>turn %{y}<br>w̄ = %{customdata:.4g}<extra></extra>",
            colorbar={"title": {"text": "turn ratio w̄"}, "tickvals": ticks,
                      "ticktext": [f"{2 ** t:.3g}" for t in ticks]},
        )
    )  # fmt: skip
    figure.update_layout(
        xaxis_title="step",
        yaxis={"title": {"text": "turn index"}, "dtick": 1},
        height=340,
        margin={"t": 30, "b": 40, "l": 60, "r": 20},
        uirevision="turn-heatmap",
    )
    return figure


def ratio_distribution_figure(turn_rows: pa.Table, step_row: dict[str, Any], clip_eps: float) -> go.Figure:
    """At one step: each turn's ratio ``w̄_k`` and its tokens' extremes vs the step's token-ratio summary.

    Rows: ``turn w̄_k`` (one point per turn, from ``turns``), ``tokens in each turn`` (each turn's
    ``ratio_min`` and ``ratio_max``), and ``token r_t`` (the step's ``ratio_min, ratio_p01, ratio_mean,
    ratio_p99, ratio_max`` from ``steps``: thin line min–max, thick p01–p99, mark at the mean). The
    shaded band is the trust region ``[1−ε, 1+ε]``.
    """
    figure = go.Figure()
    figure.add_vrect(x0=1 - clip_eps, x1=1 + clip_eps, fillcolor="rgba(44, 160, 44, 0.12)", line_width=0)
    turn_ratios = _positive(column_values(turn_rows, "ratio_mean"))
    if len(turn_ratios):
        figure.add_trace(
            go.Box(x=turn_ratios, name="turn w̄_k", boxpoints="all", jitter=0.5, pointpos=0,
                   marker={"size": 4, "color": "#1f77b4"}, line={"color": "#1f77b4"}, orientation="h",
                   hovertemplate="w̄ = %{x:.4g}<extra></extra>")
        )  # fmt: skip
    extremes = _positive(
        np.concatenate([column_values(turn_rows, "ratio_min"), column_values(turn_rows, "ratio_max")])
    )
    if len(extremes):
        figure.add_trace(
            go.Box(x=extremes, name="tokens in each turn (min, max)", boxpoints="all", jitter=0.5, pointpos=0,
                   marker={"size": 4, "color": "#9467bd"}, line={"color": "#9467bd"}, orientation="h",
                   hovertemplate="r = %{x:.4g}<extra></extra>")
        )  # fmt: skip
    token = {k: step_row.get(k) for k in ("ratio_min", "ratio_p01", "ratio_mean", "ratio_p99", "ratio_max")}
    if all(_is_positive(v) for v in token.values()):
        name = "token r_t (min, p01, mean, p99, max)"
        figure.add_trace(
            go.Scatter(x=[token["ratio_min"], token["ratio_max"]], y=[name, name], mode="lines+markers",
                       line={"color": "#d62728", "width": 2}, marker={"symbol": "line-ns-open", "size": 14},
                       showlegend=False, hovertemplate="token min/max %{x:.4g}<extra></extra>")
        )  # fmt: skip
        figure.add_trace(
            go.Scatter(x=[token["ratio_p01"], token["ratio_p99"]], y=[name, name], mode="lines",
                       line={"color": "#d62728", "width": 12}, showlegend=False,
                       hovertemplate="token p01/p99 %{x:.4g}<extra></extra>")
        )  # fmt: skip
        figure.add_trace(
            go.Scatter(x=[token["ratio_mean"]], y=[name], mode="markers", showlegend=False,
                       marker={"color": "white", "size": 9, "line": {"color": "black", "width": 1.5}},
                       hovertemplate="token mean %{x:.4g}<extra></extra>")
        )  # fmt: skip
    if not figure.data:
        return _empty("no turn or token ratios logged at this step")
    figure.update_layout(
        xaxis={
            "type": "log",
            "title": {"text": "importance ratio π_θ/π_old (log scale; band: trust region)"},
        },
        showlegend=False,
        height=330,
        margin={"t": 20, "b": 50, "l": 230, "r": 20},
    )
    return figure


def module_norms_figure(modules: pa.Table, max_points: int = 2000) -> go.Figure:
    """Pre-clip grad norm per module over steps (log scale), one line per module (ranks: max)."""
    if modules.num_rows == 0:
        return _empty("no per-module grad norms logged (call Monitor.watch(model))")
    merged = (
        modules.group_by(["module", "step"])
        .aggregate([("grad_norm", "max")])
        .sort_by([("module", "ascending"), ("step", "ascending")])
    )
    figure = go.Figure()
    names = merged.column("module").to_numpy(zero_copy_only=False)
    steps = column_values(merged, "step")
    norms = column_values(merged, "grad_norm_max")
    for index, module in enumerate(dict.fromkeys(names)):
        rows = names == module
        values = np.where(norms[rows] > 0, norms[rows], np.nan)
        x, y = downsample(steps[rows], values, max_points)
        figure.add_trace(
            go.Scatter(x=x, y=y, mode="lines", name=str(module), line={"color": run_color(index), "width": 1.3},
                         hovertemplate=f"{module}<br>step %{{x}}<br>grad norm %{{y:.4g}}<extra></extra>")
        )  # fmt: skip
    figure.update_layout(
        xaxis_title="step",
        yaxis={"type": "log", "title": {"text": "grad norm (pre-clip)"}},
        height=420,
        margin={"t": 30, "b": 40, "l": 60, "r": 20},
        uirevision="modules",
    )
    return figure


def _positive(values: np.ndarray) -> np.ndarray:
    return values[np.isfinite(values) & (values > 0)]


def _is_positive(value: Any) -> bool:
    return isinstance(value, int | float) and math.isfinite(value) and value > 0


def _empty(message: str) -> go.Figure:
    figure = go.Figure()
    figure.add_annotation(text=message, showarrow=False, xref="paper", yref="paper", x=0.5, y=0.5)
    figure.update_layout(height=200, xaxis={"visible": False}, yaxis={"visible": False})
    return figure
