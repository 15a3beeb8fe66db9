"""Per-module grad norms (``Monitor.watch``) over steps, one row per run on one x axis."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import plotly.graph_objects as go
import pyarrow as pa

from sorl_monitor.diagnose.timeline import Timeline
from sorl_monitor.figures.rows import axis_refs, run_events, run_rows_layout
from sorl_monitor.figures.series import XAxis, downsample, log_axis
from sorl_monitor.figures.style import empty_figure, module_style
from sorl_monitor.read.step_rows import column_values


def module_norms_figure(
    modules: Mapping[str, pa.Table],
    axis: XAxis | None = None,
    max_points: int = 1200,
    events: Mapping[str, Timeline] | None = None,
) -> go.Figure:
    """Pre-clip grad norm per module (log scale; ranks: the largest), a row per run (``modules``: each run's
    ``step, module, grad_norm`` rows). A module keeps its colour in every row, and one legend entry shows
    or hides it everywhere (``MODULE_STYLES``: colours that are never the alerts' or CTN's). ``axis`` maps
    steps to the chosen x axis (steps when ``None``); ``events``: each run's timeline, whose collapse and CTN
    spans are marked on its row."""
    tables = {run_id: table for run_id, table in modules.items() if table.num_rows}
    if not tables:
        return empty_figure("no per-module grad norms logged (call Monitor.watch(model))")
    merged = {
        run_id: table.group_by(["module", "step"], use_threads=False)
        .aggregate([("grad_norm", "max")])
        .sort_by([("module", "ascending"), ("step", "ascending")])
        for run_id, table in tables.items()
    }
    names = list(dict.fromkeys(m for t in merged.values() for m in t.column("module").to_pylist()))
    styles = {name: module_style(i) for i, name in enumerate(names)}
    layout = run_rows_layout(
        list(merged), row_px=260, x_title="step" if axis is None else axis.title, same_y=True,
        y_axis={"title": {"text": "grad norm"}, **log_axis([column_values(t, "grad_norm_max") for t in merged.values()])},
        uirevision="modules",
    )  # fmt: skip
    traces = []
    shapes: list[dict] = []
    for row, run_id in enumerate(merged, start=1):
        marks, labels = run_events(row, run_id, (events or {}).get(run_id), axis)
        shapes += marks
        layout["annotations"] += labels
    layout["shapes"] = shapes
    legended: set[str] = set()
    for row, (run_id, table) in enumerate(merged.items(), start=1):
        module_of = table.column("module").to_numpy(zero_copy_only=False)
        steps, norms = column_values(table, "step"), column_values(table, "grad_norm_max")
        for module in dict.fromkeys(module_of):
            mine = module_of == module
            x = steps[mine] if axis is None else axis.at(run_id, steps[mine])
            xs, ys = downsample(x, np.where(norms[mine] > 0, norms[mine], np.nan), max_points)
            traces.append(
                {"type": "scatter", "mode": "lines", "x": xs, "y": ys.astype(np.float32), "name": str(module),
                 "legendgroup": str(module), "showlegend": module not in legended, **axis_refs(row),
                 "line": {**styles[module], "width": 1.3},
                 "hovertemplate": f"{run_id} · {module}<br>grad norm %{{y:.4g}}<br>%{{x}}<extra></extra>"}
            )  # fmt: skip
            legended.add(module)
    return go.Figure(data=traces, layout=layout)
