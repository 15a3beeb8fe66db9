"""The overview: per-step curves of one or more runs stacked on one x axis, with their alert onsets.

Top to bottom: a lane of alert onsets (a row per detector family that fired, per run; ▲ warning, ✕
critical; CTN-on spans as green bars), then ``panels.OVERVIEW_PANELS`` that the runs logged. Each onset
is also marked on the curve of its detector's panel (``panels.DETECTOR_PANEL``); markers of one family
show and hide together (click the family in the legend, or leave it out of ``OverviewOptions.families``).
One run: a colour per series, CTN-on spans shaded over every panel. Several runs: a colour per run and a
line style per series; each run's collapse line and CTN bars are labelled with its name.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import plotly.graph_objects as go

from sorl_monitor.diagnose.timeline import FAMILY_ORDER, RunCurves
from sorl_monitor.figures.notes import flat_range, flat_value
from sorl_monitor.figures.panels import Panel, alert_spot, logged_panels
from sorl_monitor.figures.series import XAxis, downsample, log_axis, smooth
from sorl_monitor.figures.style import (
    COLLAPSE_COLOR,
    CTN_BAND,
    CTN_BAR,
    FONT,
    SERIES_STYLES,
    SEVERITY_STYLE,
    empty_figure,
    run_color,
    text_px,
)
from sorl_monitor.read.step_rows import column_values

DASHES = ("solid", "dash", "dot", "dashdot", "longdash")
"""Line style of a panel's 1st, 2nd, … series when several runs are overlaid (the colour tells the run)."""
LANE_ROW_PX, TITLE_PX = 15, 18
LANE_FONT_PX = 10
LANE_MARKS = 25
"""At most about this many marks per lane row: onsets closer than 1/25 of the run's steps share a mark."""


@dataclass(frozen=True)
class OverviewOptions:
    """How to draw: x axis (a key of ``series.X_AXES``), trailing mean over ``smooth_steps`` steps (the raw
    curve stays, faint), panels on a log scale (``None``: each panel's default), alert families shown
    (``None``: all), points per curve, and each panel's height in pixels."""

    x_axis: str = "step"
    smooth_steps: int = 0
    log_panels: frozenset[str] | None = None
    families: frozenset[str] | None = None
    max_points: int = 600
    panel_height: int = 80


def overview_figure(runs: Sequence[RunCurves], options: OverviewOptions | None = None) -> go.Figure:
    """The stacked curves, lane and marks of ``runs`` (see module docstring)."""
    options = options or OverviewOptions()
    panels = logged_panels([run.steps for run in runs])
    if not panels:
        return empty_figure("no step metrics logged yet")
    axes = XAxis({run.run_id: run.steps for run in runs}, options.x_axis)
    lane = _lane_rows(runs, options.families)
    layout = _layout(panels, lane, options, several=len(runs) > 1, x_title=axes.title)
    traces: list[dict[str, Any]] = []
    shapes: list[dict[str, Any]] = []
    annotations = list(layout.pop("annotations"))
    drawn: dict[str, list[np.ndarray]] = {panel.title: [] for panel in panels}
    for index, run in enumerate(runs):
        x = axes.values(run.run_id)
        alarmed = _alarmed_columns(run, panels)
        for row, panel in enumerate(panels, start=1):
            ordered = sorted(
                enumerate(panel.series), key=lambda item: item[1][0] in alarmed
            )  # alarmed on top
            for position, (column, label) in ordered:
                curves = _curve_traces(run, index, x, panel, row, position, column, label, options, len(runs))
                traces += curves
                drawn[panel.title] += [np.asarray(t["y"], dtype=np.float64) for t in curves]
        traces += _marker_traces(run, x, panels, options)
        traces += _lane_traces(run, axes, options, len(panels) + 1, several=len(runs) > 1)
        shapes += _collapse_and_ctn(run, axes, len(runs), annotations, index)
    traces += _legend_samples(runs, panels, options)
    for row, panel in enumerate(panels, start=1):
        flat = flat_value(drawn[panel.title])
        if _is_log(panel, options):
            layout[_axis_name("yaxis", row)].update(log_axis(drawn[panel.title]))
        elif flat is not None:
            layout[_axis_name("yaxis", row)].update(range=flat_range(flat))
            annotations[row - 1]["text"] += f" · every value {flat:g}"
    layout.update(shapes=shapes, annotations=annotations)
    return go.Figure(data=traces, layout=layout)


def _is_log(panel: Panel, options: OverviewOptions) -> bool:
    return panel.log_y if options.log_panels is None else panel.title in options.log_panels


def _axis_name(kind: str, index: int) -> str:
    return kind if index == 1 else f"{kind}{index}"


def _axis_ref(kind: str, index: int) -> str:
    return kind[0] if index == 1 else f"{kind[0]}{index}"


def _lane_rows(runs: Sequence[RunCurves], families: frozenset[str] | None) -> list[str]:
    """The lane's rows, top to bottom: per run, each family with an onset shown, then ``CTN on``."""
    rows = []
    for run in runs:
        prefix = f"{run.run_id} · " if len(runs) > 1 else ""
        shown = {o["family"] for o in run.timeline.onsets if families is None or o["family"] in families}
        rows += [prefix + family for family in FAMILY_ORDER if family in shown]
        if run.timeline.ctn_spans:
            rows.append(prefix + "CTN on")
    return rows


def _layout(
    panels: Sequence[Panel], lane: list[str], options: OverviewOptions, *, several: bool, x_title: str
) -> dict[str, Any]:
    """Axes stacked top to bottom (panels ``1…n``, the lane ``n+1``), one panel title each, sized in pixels."""
    # Margins that already hold the legends above the plot and the lane's labels: a margin plotly's automargin
    # has to widen costs a second layout pass (docs/results.md, "Measurements behind the code").
    # The height is as before (when the top margin was widened from 30 px within it): one run's panels stay
    # on a 1000 px screen.
    top, bottom = 46, 40
    left = max(62, math.ceil(max((text_px(row, LANE_FONT_PX) for row in lane), default=0)) + 14)
    lane_px = LANE_ROW_PX * len(lane) + 8 if lane else 0
    plot = lane_px + len(panels) * (options.panel_height + TITLE_PX)
    layout: dict[str, Any] = {
        "height": (44 if several else 30) + plot + bottom,
        "margin": {"t": top, "b": bottom, "l": left, "r": 190},
        "template": "plotly_white",
        "font": FONT,
        "hovermode": "closest",
        "uirevision": f"overview/{options.x_axis}",
        "showlegend": True,
        "legend": {"orientation": "h", "x": 0, "xanchor": "left", "y": 1 + 4 / plot, "yanchor": "bottom",
                   "title": {"text": "alerts:"}, "font": {"size": 10}},
        _axis_name("legend", len(panels) + 2): {
            "orientation": "h", "x": 1, "xanchor": "right", "y": 1 + 4 / plot, "yanchor": "bottom",
            "itemclick": False, "itemdoubleclick": False, "title": {"text": "runs:"},
        },
    }  # fmt: skip
    annotations = []
    cursor = plot
    n = len(panels)
    if lane:
        lane_axis = n + 1
        layout[_axis_name("yaxis", lane_axis)] = {
            "domain": [(cursor - lane_px) / plot, 1.0], "type": "category", "fixedrange": True,
            "categoryorder": "array", "categoryarray": list(reversed(lane)), "showgrid": False,
            "tickfont": {"size": LANE_FONT_PX}, "anchor": _axis_ref("xaxis", lane_axis),
        }  # fmt: skip
        layout[_axis_name("xaxis", lane_axis)] = {
            "matches": "x", "showticklabels": False, "anchor": _axis_ref("yaxis", lane_axis),
            "showgrid": True,
        }  # fmt: skip
        cursor -= lane_px
    for row, panel in enumerate(panels, start=1):
        cursor -= TITLE_PX
        high = cursor / plot
        cursor -= options.panel_height
        layout[_axis_name("yaxis", row)] = {
            "domain": [max(cursor / plot, 0.0), high],
            "anchor": _axis_ref("xaxis", row),
            "zeroline": False,
        }
        layout[_axis_name("xaxis", row)] = {
            "anchor": _axis_ref("yaxis", row), "showticklabels": row == n,
            **({"matches": "x"} if row > 1 else {}),
            **({"title": {"text": x_title, "standoff": 4}} if row == n else {}),
        }  # fmt: skip
        layout[_axis_name("legend", row + 1)] = {
            "x": 1.01, "xanchor": "left", "y": high, "yanchor": "top", "font": {"size": 10},
            "tracegroupgap": 0, "bgcolor": "rgba(255,255,255,0)",
        }  # fmt: skip
        scale = " (log)" if _is_log(panel, options) else ""
        annotations.append(
            {"text": f"<b>{panel.title}</b>{scale}", "x": 0, "xref": "paper", "xanchor": "left",
             "y": high, "yref": "paper", "yanchor": "bottom", "showarrow": False, "font": {"size": 12}}
        )  # fmt: skip
    layout["annotations"] = annotations
    return layout


def _curve_traces(
    run: RunCurves,
    index: int,
    x: np.ndarray,
    panel: Panel,
    row: int,
    position: int,
    column: str,
    label: str,
    options: OverviewOptions,
    runs: int,
) -> list[dict[str, Any]]:
    """One series of one run: its curve (smoothed when asked, with the raw curve faint behind it)."""
    values = column_values(run.steps, column)
    if _is_log(panel, options):
        values = np.where(values > 0, values, np.nan)
    values = np.where(np.isfinite(values), values, np.nan)
    if not np.isfinite(values).any():
        return []
    several = runs > 1
    color, dash = (
        (run_color(index), DASHES[position % len(DASHES)])
        if several
        else SERIES_STYLES[position % len(SERIES_STYLES)]
    )
    group = f"{panel.title}/{column}"
    common = {
        "type": "scatter", "mode": "lines", "xaxis": _axis_ref("xaxis", row), "yaxis": _axis_ref("yaxis", row),
        "legendgroup": group, "legend": _axis_name("legend", row + 1), "name": label,
        "hovertemplate": f"{run.run_id}<br>{label}: %{{y:.4g}}<br>%{{x}}<extra></extra>",
    }  # fmt: skip
    show_legend = not several and index == 0 and _series_count(panel, run) > 1
    traces = []
    smoothed = smooth(column_values(run.steps, "step"), values, options.smooth_steps)
    if smoothed is not values:
        raw_x, raw_y = downsample(x, values, options.max_points)
        traces.append({**common, "x": raw_x, "y": raw_y.astype(np.float32), "showlegend": False,
                       "opacity": 0.3, "line": {"color": color, "width": 1, "dash": dash}, "hoverinfo": "skip"})  # fmt: skip
    xs, ys = downsample(x, smoothed, options.max_points)
    traces.append({**common, "x": xs, "y": ys.astype(np.float32), "showlegend": show_legend,
                   "line": {"color": color, "width": 1.5, "dash": dash}})  # fmt: skip
    return traces


def _alarmed_columns(run: RunCurves, panels: Sequence[Panel]) -> set[str]:
    """The columns whose curves carry a critical onset of the run (drawn last, so on top)."""
    return {
        column
        for onset in run.timeline.onsets
        if onset["severity"] == "critical"
        for column in [alert_spot(onset["detector"], panels, run.steps)[1]]
        if column is not None
    }


def _series_count(panel: Panel, run: RunCurves) -> int:
    return sum(bool(np.isfinite(column_values(run.steps, column)).any()) for column in panel.columns)


def _marker_traces(
    run: RunCurves, x: np.ndarray, panels: Sequence[Panel], options: OverviewOptions
) -> list[dict[str, Any]]:
    """Each onset on the curve of its detector's panel, one trace per (panel, family)."""
    steps = column_values(run.steps, "step")
    groups: dict[tuple[int, str], list[tuple[dict[str, Any], float]]] = {}
    for onset in run.timeline.onsets:
        if options.families is not None and onset["family"] not in options.families:
            continue
        row, column = alert_spot(onset["detector"], panels, run.steps)
        if column is None:
            continue
        values = smooth(steps, column_values(run.steps, column), options.smooth_steps)
        at = int(np.searchsorted(steps, onset["step"]))
        if at < len(steps) and steps[at] == onset["step"] and np.isfinite(values[at]):
            groups.setdefault((row, onset["family"]), []).append((onset, float(values[at])))
    traces = []
    for (row, family), marks in sorted(groups.items()):
        onsets = [onset for onset, _ in marks]
        traces.append(
            {"type": "scatter", "mode": "markers", "xaxis": _axis_ref("xaxis", row + 1),
             "yaxis": _axis_ref("yaxis", row + 1), "legendgroup": f"alerts/{family}", "showlegend": False,
             "name": family, "x": [x[int(np.searchsorted(steps, o["step"]))] for o in onsets],
             "y": [value for _, value in marks], "text": [_hover(run, o) for o in onsets],
             "hovertemplate": "%{text}<extra></extra>", "marker": _marker_style(onsets, size=8)}
        )  # fmt: skip
    return traces


def _lane_traces(
    run: RunCurves, axes: XAxis, options: OverviewOptions, axis: int, *, several: bool
) -> list[dict[str, Any]]:
    """The run's rows of the lane: onsets per family, CTN-on spans as bars."""
    prefix = f"{run.run_id} · " if several else ""
    refs = {"xaxis": _axis_ref("xaxis", axis), "yaxis": _axis_ref("yaxis", axis)}
    traces = []
    by_family: dict[str, list[dict[str, Any]]] = {}
    for onset in run.timeline.onsets:
        if options.families is None or onset["family"] in options.families:
            by_family.setdefault(onset["family"], []).append(onset)
    steps = column_values(run.steps, "step")
    merge_gap = (float(steps[-1] - steps[0]) / LANE_MARKS) if len(steps) else 0.0
    for family, onsets in by_family.items():
        marks = lane_marks(onsets, merge_gap)
        traces.append(
            {"type": "scatter", "mode": "markers+text", **refs, "legendgroup": f"alerts/{family}",
             "showlegend": False, "name": family, "x": axes.at(run.run_id, [m["step"] for m in marks]),
             "y": [prefix + family] * len(marks), "hovertext": [_lane_hover(run, m) for m in marks],
             "text": [f"×{m['count']}" if m["count"] > 1 else "" for m in marks], "textposition": "middle right",
             "textfont": {"size": 9, "color": "#4b5563"}, "hovertemplate": "%{hovertext}<extra></extra>",
             "marker": _marker_style(marks, size=9), "cliponaxis": False}
        )  # fmt: skip
    if run.timeline.ctn_spans:
        xs: list[float | None] = []
        for start, end in run.timeline.ctn_spans:
            xs += [*axes.at(run.run_id, [start, end]), None]
        traces.append(
            {"type": "scatter", "mode": "lines", **refs, "name": "CTN on", "showlegend": False,
             "x": xs, "y": [prefix + "CTN on" if x is not None else None for x in xs],
             "line": {"color": CTN_BAR, "width": 8}, "hovertemplate": f"{run.run_id}: CTN on<extra></extra>"}
        )  # fmt: skip
    return traces


def lane_marks(onsets: Sequence[dict[str, Any]], merge_gap: float) -> list[dict[str, Any]]:
    """One family's lane marks: its onsets by step, an onset of the same severity starting within
    ``merge_gap`` steps of the previous mark's streak's end joins that mark (``count`` alerts in all,
    ``detectors`` named, ``last`` step)."""
    marks: list[dict[str, Any]] = []
    for onset in sorted(onsets, key=lambda o: o["step"]):
        count, last = onset.get("count", 1), onset.get("last", onset["step"])
        previous = marks[-1] if marks else None
        if (
            previous
            and previous["severity"] == onset["severity"]
            and onset["step"] - previous["last"] <= merge_gap
        ):
            previous["count"] += count
            previous["last"] = max(previous["last"], last)
            previous["detectors"] = list(dict.fromkeys([*previous["detectors"], onset["detector"]]))
        else:
            marks.append({**onset, "count": count, "last": last, "detectors": [onset["detector"]]})
    return marks


def _lane_hover(run: RunCurves, mark: dict[str, Any]) -> str:
    span = f"steps {mark['step']}–{mark['last']}" if mark["last"] > mark["step"] else f"step {mark['step']}"
    return (
        f"{run.run_id} · {span} · {mark['count']} alert{'s' if mark['count'] > 1 else ''}<br>"
        f"{', '.join(mark['detectors'])} ({mark['severity']}), first: {mark.get('message') or ''}"
    )


def _collapse_and_ctn(
    run: RunCurves, axes: XAxis, runs: int, annotations: list[dict[str, Any]], index: int = 0
) -> list[dict[str, Any]]:
    """The run's collapse line (labelled with its name) and, for a lone run, CTN-on bands over every panel."""
    shapes: list[dict[str, Any]] = []
    if runs == 1:
        shapes += [
            {"type": "rect", "xref": "x", "yref": "paper", "x0": a, "x1": b, "y0": 0, "y1": 1,
             "fillcolor": CTN_BAND, "line": {"width": 0}, "layer": "below"}
            for a, b in (axes.at(run.run_id, span) for span in run.timeline.ctn_spans)
        ]  # fmt: skip
    step = run.timeline.collapse_step
    if step is not None:
        at = float(axes.at(run.run_id, [step])[0])
        shapes.append({"type": "line", "xref": "x", "yref": "paper", "x0": at, "x1": at, "y0": 0, "y1": 1,
                       "line": {"color": COLLAPSE_COLOR, "dash": "dash", "width": 1.5}})  # fmt: skip
        label = f"collapse at {step}" if runs == 1 else f"collapse · {run.run_id} · {step}"
        annotations.append(
            {"text": label, "x": at, "xref": "x", "y": 1, "yref": "paper", "yanchor": "top", "xanchor": "left",
             "yshift": -14 * index, "showarrow": False, "font": {"size": 10, "color": COLLAPSE_COLOR},
             "bgcolor": "rgba(255,255,255,0.8)"}
        )  # fmt: skip
    return shapes


def _legend_samples(
    runs: Sequence[RunCurves], panels: Sequence[Panel], options: OverviewOptions
) -> list[dict[str, Any]]:
    """Legend entries without data: one per alert family (click: show or hide its markers), per run (several
    runs: its colour), and, with several runs, per series of a panel (its line style; click: show or hide it)."""
    fired = {o["family"] for run in runs for o in run.timeline.onsets}
    families = [f for f in FAMILY_ORDER if f in fired and (options.families is None or f in options.families)]
    samples = [
        {"type": "scatter", "mode": "markers", "x": [None], "y": [None], "name": family, "legend": "legend",
         "legendgroup": f"alerts/{family}", "marker": {"color": "#6b7280", "symbol": "triangle-up", "size": 8},
         "hoverinfo": "skip"}
        for family in families
    ]  # fmt: skip
    if len(runs) < 2:
        return samples
    runs_legend = _axis_name("legend", len(panels) + 2)
    samples += [
        {"type": "scatter", "mode": "lines", "x": [None], "y": [None], "name": run.run_id, "legend": runs_legend,
         "line": {"color": run_color(index), "width": 3}, "hoverinfo": "skip"}
        for index, run in enumerate(runs)
    ]  # fmt: skip
    for row, panel in enumerate(panels, start=1):
        logged = [
            (position, column, label)
            for position, (column, label) in enumerate(panel.series)
            if any(np.isfinite(column_values(run.steps, column)).any() for run in runs)
        ]
        if len(logged) < 2:
            continue
        samples += [
            {"type": "scatter", "mode": "lines", "x": [None], "y": [None], "name": label,
             "legend": _axis_name("legend", row + 1), "legendgroup": f"{panel.title}/{column}",
             "line": {"color": "#555555", "dash": DASHES[position % len(DASHES)]}, "hoverinfo": "skip"}
            for position, column, label in logged
        ]  # fmt: skip
    return samples


def _marker_style(onsets: Sequence[dict[str, Any]], size: int) -> dict[str, Any]:
    styles = [SEVERITY_STYLE.get(o["severity"], SEVERITY_STYLE["info"]) for o in onsets]
    colors = [color for color, _ in styles]
    return {"color": colors, "symbol": [symbol for _, symbol in styles], "size": size,
            "line": {"width": 1.5, "color": colors}}  # fmt: skip


def _hover(run: RunCurves, onset: dict[str, Any]) -> str:
    return (
        f"{run.run_id} · step {onset['step']}<br>{onset['detector']} ({onset['severity']}): "
        f"{onset.get('message') or ''}"
    )
