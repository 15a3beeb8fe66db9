"""The layout of a figure with a row per run on one x axis (the turn heatmap, the module norms)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sorl_monitor.figures.style import COLLAPSE_COLOR, CTN_BAND, FONT


def axis_refs(row: int) -> dict[str, str]:
    """The ``xaxis``/``yaxis`` a trace of the ``row``-th run (from 1) is drawn on."""
    suffix = "" if row == 1 else str(row)
    return {"xaxis": f"x{suffix}", "yaxis": f"y{suffix}"}


def run_rows_layout(
    run_ids: Sequence[str],
    *,
    row_px: int,
    x_title: str,
    y_axis: dict[str, Any],
    uirevision: str,
    same_y: bool = False,
    gap_px: int = 26,
) -> dict[str, Any]:
    """Rows of ``row_px`` pixels, top to bottom, one per run: each with a y axis of ``y_axis`` settings (the
    same range in every row with ``same_y``), x axes zoomed together with ticks under the last row, each row
    named after its run."""
    rows = len(run_ids)
    plot_px = rows * row_px + (rows - 1) * gap_px
    layout: dict[str, Any] = {
        "height": plot_px + 70, "margin": {"t": 24, "b": 46, "l": 60, "r": 20}, "font": FONT,
        "template": "plotly_white", "uirevision": uirevision, "hovermode": "closest", "annotations": [],
    }  # fmt: skip
    for row, run_id in enumerate(run_ids, start=1):
        high = 1 - (row - 1) * (row_px + gap_px) / plot_px
        suffix = "" if row == 1 else str(row)
        layout[f"yaxis{suffix}"] = {
            "domain": [max(high - row_px / plot_px, 0), high], "anchor": f"x{suffix}", **y_axis,
            **({"matches": "y"} if same_y and row > 1 else {}),
        }  # fmt: skip
        layout[f"xaxis{suffix}"] = {
            "anchor": f"y{suffix}", "showticklabels": row == rows,
            **({"matches": "x"} if row > 1 else {}), **({"title": {"text": x_title}} if row == rows else {}),
        }  # fmt: skip
        layout["annotations"].append(
            {"text": f"<b>{run_id}</b>", "x": 0, "xref": "paper", "y": high, "yref": "paper",
             "xanchor": "left", "yanchor": "bottom", "showarrow": False}
        )  # fmt: skip
    return layout


def event_marks(
    row: int, collapse_step: float | None, ctn_spans: Sequence[tuple[float, float]]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Shapes and labels of one run's row: its collapse as a dashed line labelled at the row's top, its CTN-on
    spans shaded green (positions already on the figure's x axis)."""
    suffix = "" if row == 1 else str(row)
    refs = {"xref": f"x{suffix}", "yref": f"y{suffix} domain"}
    shapes = [
        {"type": "rect", **refs, "x0": a, "x1": b, "y0": 0, "y1": 1, "fillcolor": CTN_BAND,
         "line": {"width": 0}, "layer": "below"}
        for a, b in ctn_spans
    ]  # fmt: skip
    labels = []
    if collapse_step is not None:
        shapes.append({"type": "line", **refs, "x0": collapse_step, "x1": collapse_step, "y0": 0, "y1": 1,
                       "line": {"color": COLLAPSE_COLOR, "dash": "dash", "width": 1.5}})  # fmt: skip
        labels.append(
            {"text": "collapse", "x": collapse_step, "y": 1, **refs, "xanchor": "left", "yanchor": "top",
             "showarrow": False, "font": {"size": 10, "color": COLLAPSE_COLOR}, "bgcolor": "rgba(255,255,255,0.8)"}
        )  # fmt: skip
    return shapes, labels


def run_events(
    row: int, run_id: str, timeline: Any, axis: Any = None
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``event_marks`` of a run's ``timeline.Timeline`` (``None``: nothing), its steps mapped by ``axis``
    (a ``series.XAxis``; steps when ``None``)."""
    if timeline is None:
        return [], []

    def at(steps: Sequence[float]) -> list[float]:
        return list(steps) if axis is None else [float(x) for x in axis.at(run_id, list(steps))]

    collapse = None if timeline.collapse_step is None else at([timeline.collapse_step])[0]
    return event_marks(row, collapse, [tuple(at(span)) for span in timeline.ctn_spans])
