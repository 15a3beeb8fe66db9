"""The layout of a figure with a row per run on one x axis (the turn heatmap, the module norms)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sorl_monitor.figures.style import FONT


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
