"""One self-contained HTML page (plotly, opens offline) explaining one or more runs.

Per run, four figures and the post-mortem verdict:

1. ``curves`` — reward, clip fraction, KL(old), grad norm, entropy and ratio tails by step, with alert
   markers (where a detector starts firing; orange warning, red critical), CTN-on spans (green) and
   the labelled collapse (red dashed line);
2. ``turn heatmap`` — turn index × step of the mean turn IS-ratio deviation ``|w̄_k − 1|``;
3. ``clip fraction`` — token vs turn clip fraction (and the token's low/high sides);
4. ``module grad norms`` — pre-clip grad norm per top-level module.

With several runs a first figure overlays their reward curves. Long runs are bucketed to at most
``max_points`` points per curve (mean for levels, max for spikes), so the page stays light.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from sorl_monitor.detectors import DetectorConfig, detect
from sorl_monitor.postmortem import Verdict, postmortem
from sorl_monitor.query import RunSet

FIGURES_PER_RUN = 4
"""Figures each run contributes to the page (one more overview figure when there are several runs)."""

CURVE_ROWS = (
    ("reward_mean", "reward", False),
    ("clip_frac", "clip fraction", False),
    ("kl_old", "KL to the behaviour policy", True),
    ("grad_norm", "grad norm", True),
    ("entropy", "entropy", False),
    ("ratio_max", "token ratio max", True),
    ("response_len", "response length", False),
)
"""The curve panels: steps column, title, log scale."""

DETECTOR_PANEL: dict[str, tuple[str, ...]] = {
    "clip_rise": ("clip_frac",), "turn_clip_rise": ("clip_frac",),
    "kl_rise": ("kl_old", "kl_old_k3"), "kl_ref_rise": ("kl_old", "kl_ref_k3"),
    "ratio_tail_rise": ("ratio_max",), "grad_norm_spike": ("grad_norm",),
    "entropy_collapse": ("entropy",), "entropy_rise": ("entropy",),
    "echo_trap": ("reward_mean",), "reward_std_collapse": ("reward_mean",), "reward_drop": ("reward_mean",),
    "nonfinite": ("reward_mean",), "length_rise": ("response_len", "response_len_mean"),
    "truncation_rise": ("response_len", "response_len_mean"),
}  # fmt: skip
"""Which panel shows each detector's markers: the one plotting any of these columns (the report's curves
name the KL and length signals ``kl_old`` and ``response_len``; the dashboard's panels plot the columns)."""

CURVES_SQL = """
SELECT (step // $width) * $width AS step,
       avg(reward_mean) AS reward_mean, avg(coalesce(clip_frac, clip_frac_active)) AS clip_frac,
       avg(clip_frac_turn) AS clip_frac_turn,
       avg(clip_frac_low) AS clip_frac_low, avg(clip_frac_high) AS clip_frac_high,
       max(coalesce(kl_old_k3, kl_old_k2, kl_old, abs(kl_old_k1))) AS kl_old, max(grad_norm) AS grad_norm,
       avg(entropy) AS entropy, avg(coalesce(response_len_mean, completion_len_mean)) AS response_len,
       max(ratio_max) AS ratio_max, max(ratio_p99) AS ratio_p99, max(turn_ratio_max) AS turn_ratio_max,
       bool_or(ctn_active) AS ctn_active
FROM steps WHERE run_id = $run_id GROUP BY 1 ORDER BY 1
"""
"""Step curves of one run, bucketed by ``$width`` steps (mean for levels, max for spikes)."""

HEATMAP_SQL = """
SELECT (step // $width) * $width AS step, turn_idx, avg(abs(ratio_mean - 1)) AS deviation
FROM turns WHERE run_id = $run_id AND turn_idx < $max_turns AND isfinite(ratio_mean)
GROUP BY 1, 2 ORDER BY 1, 2
"""
"""Mean ``|w̄_k − 1|`` per (step bucket, turn index)."""

MODULES_SQL = """
SELECT (step // $width) * $width AS step, module, max(grad_norm) AS grad_norm
FROM modules WHERE run_id = $run_id GROUP BY 1, 2 ORDER BY 2, 1
"""
"""Per-module grad norm per step bucket."""

ACTIONS_SQL = """
SELECT step, detector FROM alerts WHERE run_id = $run_id AND kind = 'action' ORDER BY step
"""
"""The guard's CTN switches (``ctn_on`` / ``ctn_off``) of one run."""


@dataclass
class RunFigures:
    """One run's verdict and its figures, named."""

    run_id: str
    verdict: Verdict
    figures: list[tuple[str, go.Figure]]


def _bucket_width(runs: RunSet, run_id: str, max_points: int) -> int:
    span = runs.sql(
        "SELECT min(step) AS lo, max(step) AS hi FROM steps WHERE run_id = $run_id", {"run_id": run_id}
    ).to_pylist()[0]
    if span["lo"] is None:
        return 1
    return max(1, math.ceil((span["hi"] - span["lo"] + 1) / max_points))


def _columns(table: Any) -> dict[str, list[Any]]:
    return {name: table.column(name).to_pylist() for name in table.column_names}


def ctn_spans(
    steps: list[int], active: list[bool | None], actions: list[tuple[int, str]]
) -> list[tuple[int, int]]:
    """Step ranges with CTN on: from the ``ctn_active`` column when logged, else from the guard's actions."""
    spans: list[tuple[int, int]] = []
    if any(a is not None for a in active):
        start = None
        for step, on in zip(steps, active, strict=True):
            if on and start is None:
                start = step
            elif not on and start is not None:
                spans.append((start, step))
                start = None
        if start is not None:
            spans.append((start, steps[-1]))
        return spans
    start = None
    for step, name in actions:
        if name == "ctn_on" and start is None:
            start = step
        elif name == "ctn_off" and start is not None:
            spans.append((start, step))
            start = None
    if start is not None and steps:
        spans.append((start, steps[-1]))
    return spans


def step_shapes(
    spans: Sequence[tuple[int, int]],
    collapse_step: int | None,
    *,
    span_color: str,
    collapse_line: dict[str, Any],
) -> list[dict[str, Any]]:
    """CTN-on spans (shaded bands) and the collapse step (a line) as layout shapes over the whole height.

    One shape per mark on the shared step axis (``xref="x"``, ``yref="paper"``), set with one
    ``update_layout(shapes=...)``: plotly's ``add_vrect(row="all")`` adds one shape per panel and
    re-validates every shape at each call: 0.75–1.0 s per overview figure of a live run with 6 CTN spans.
    """
    shapes: list[dict[str, Any]] = [
        {"type": "rect", "xref": "x", "yref": "paper", "x0": start, "x1": max(end, start + 0.5), "y0": 0, "y1": 1,
         "fillcolor": span_color, "line": {"width": 0}, "layer": "below"}
        for start, end in spans
    ]  # fmt: skip
    if collapse_step is not None:
        shapes.append({"type": "line", "xref": "x", "yref": "paper", "x0": collapse_step, "x1": collapse_step,
                       "y0": 0, "y1": 1, "line": collapse_line})  # fmt: skip
    return shapes


def logged_steps(runs: RunSet, run_id: str) -> list[int]:
    """The steps a run logged, in order."""
    sql = "SELECT DISTINCT step FROM steps WHERE run_id = $run_id ORDER BY step"
    return runs.sql(sql, {"run_id": run_id}).column("step").to_pylist()


def alert_onsets(
    alerts: list[dict[str, Any]], steps: list[int], block_steps: int = 1
) -> list[dict[str, Any]]:
    """The first alert of each streak of one detector (and each escalation to critical).

    A streak is a run of consecutive logged blocks: detectors judge blocks of ``block_steps`` steps
    (``DetectorConfig.smooth_steps``), and ``steps`` are the run's logged steps.
    """
    position = {block: i for i, block in enumerate(sorted({step // block_steps for step in steps}))}
    onsets, last = [], {}
    for row in sorted(alerts, key=lambda r: (r["step"], r["detector"])):
        previous = last.get(row["detector"])
        if (
            previous is None
            or position.get(row["step"] // block_steps, -1)
            - position.get(previous["step"] // block_steps, -2)
            != 1
            or (row["severity"] == "critical" and previous["severity"] != "critical")
        ):
            onsets.append(row)
        last[row["detector"]] = row
    return onsets


def curves_figure(
    curves: dict[str, list[Any]], onsets: list[dict[str, Any]], spans: list[tuple[int, int]], verdict: Verdict
) -> go.Figure:
    """Stacked step curves with alert onsets, CTN spans and the collapse line."""
    figure = make_subplots(
        rows=len(CURVE_ROWS), cols=1, shared_xaxes=True, vertical_spacing=0.02,
        subplot_titles=[title for _, title, _ in CURVE_ROWS],
    )  # fmt: skip
    steps = curves["step"]
    index = {step: i for i, step in enumerate(steps)}
    for row, (column, title, log) in enumerate(CURVE_ROWS, start=1):
        figure.add_trace(
            go.Scatter(x=steps, y=curves[column], name=title, mode="lines", showlegend=False), row=row, col=1
        )
        if log:
            figure.update_yaxes(type="log", row=row, col=1)
    width = steps[1] - steps[0] if len(steps) > 1 else 1
    for severity, color in (("warning", "orange"), ("critical", "red")):
        for row, (column, _, _) in enumerate(CURVE_ROWS, start=1):
            marks = [
                a
                for a in onsets
                if a["severity"] == severity and column in DETECTOR_PANEL.get(a["detector"], ())
            ]
            if not marks:
                continue
            xs = [(a["step"] // width) * width for a in marks]
            ys = [curves[column][index[x]] if x in index else None for x in xs]
            figure.add_trace(
                go.Scatter(
                    x=xs, y=ys, mode="markers", name=f"{severity} alert",
                    marker={"color": color, "size": 9, "symbol": "x" if severity == "critical" else "circle"},
                    text=[f"{a['detector']}: {a['message']}" for a in marks], hoverinfo="text+x",
                    showlegend=False,
                ),
                row=row, col=1,
            )  # fmt: skip
    figure.update_layout(
        shapes=step_shapes(
            spans,
            verdict.collapse_step,
            span_color="rgba(0, 128, 0, 0.12)",
            collapse_line={"color": "red", "dash": "dash"},
        ),
        height=170 * len(CURVE_ROWS),
        margin={"t": 40, "b": 30},
        title="curves (green: CTN on, red dashed: collapse)",
    )
    figure.update_xaxes(title_text="step", row=len(CURVE_ROWS), col=1)
    return figure


def heatmap_figure(cells: dict[str, list[Any]]) -> go.Figure:
    """Turn index × step heatmap of mean ``|w̄_k − 1|``."""
    steps = sorted(set(cells["step"]))
    turns = sorted(set(cells["turn_idx"]))
    grid = [[None] * len(steps) for _ in turns]
    where_step = {s: i for i, s in enumerate(steps)}
    where_turn = {t: i for i, t in enumerate(turns)}
    for step, turn, value in zip(cells["step"], cells["turn_idx"], cells["deviation"], strict=True):
        grid[where_turn[turn]][where_step[step]] = value
    figure = go.Figure(
        go.Heatmap(x=steps, y=turns, z=grid, colorscale="Viridis", colorbar={"title": "|w̄−1|"})
    )
    figure.update_layout(
        title="turn IS ratio: mean |w̄_k − 1| by turn and step",
        xaxis_title="step",
        yaxis_title="turn",
        height=320,
    )
    if not steps:
        figure.add_annotation(
            text="no turns logged", showarrow=False, xref="paper", yref="paper", x=0.5, y=0.5
        )
    return figure


def clip_figure(curves: dict[str, list[Any]]) -> go.Figure:
    """Token vs turn clip fraction."""
    figure = go.Figure()
    for column, label in (
        ("clip_frac", "token"),
        ("clip_frac_turn", "turn"),
        ("clip_frac_low", "token low side"),
        ("clip_frac_high", "token high side"),
    ):
        figure.add_trace(go.Scatter(x=curves["step"], y=curves[column], name=label, mode="lines"))
    figure.update_layout(
        title="clip fraction: token vs turn",
        xaxis_title="step",
        yaxis_title="share outside [1−ε, 1+ε]",
        height=320,
    )
    return figure


def modules_figure(rows: dict[str, list[Any]]) -> go.Figure:
    """Pre-clip grad norm per module."""
    figure = go.Figure()
    by_module: dict[str, tuple[list[int], list[float]]] = {}
    for step, module, norm in zip(rows["step"], rows["module"], rows["grad_norm"], strict=True):
        xs, ys = by_module.setdefault(module, ([], []))
        xs.append(step)
        ys.append(norm)
    for module, (xs, ys) in by_module.items():
        figure.add_trace(go.Scatter(x=xs, y=ys, name=module, mode="lines"))
    figure.update_layout(title="grad norm per module", xaxis_title="step", yaxis_type="log", height=320)
    if not by_module:
        figure.add_annotation(
            text="no module grad norms logged (Monitor.watch)",
            showarrow=False,
            xref="paper",
            yref="paper",
            x=0.5,
            y=0.5,
        )
    return figure


def run_figures(
    runs: RunSet, run_id: str, config: DetectorConfig, max_points: int = 2000, max_turns: int = 32
) -> RunFigures:
    """The post-mortem and the four figures of one run."""
    verdict = postmortem(runs, run_id, config)
    params = {"run_id": run_id, "width": _bucket_width(runs, run_id, max_points)}
    curves = _columns(runs.sql(CURVES_SQL, params))
    cells = _columns(runs.sql(HEATMAP_SQL, {**params, "max_turns": max_turns}))
    modules = _columns(runs.sql(MODULES_SQL, params))
    actions = [(r["step"], r["detector"]) for r in runs.sql(ACTIONS_SQL, {"run_id": run_id}).to_pylist()]
    onsets = alert_onsets(
        detect(runs, config, run_id).to_pylist(), logged_steps(runs, run_id), config.smooth_steps
    )
    spans = ctn_spans(curves["step"], curves["ctn_active"], actions)
    return RunFigures(
        run_id,
        verdict,
        [
            ("curves", curves_figure(curves, onsets, spans, verdict)),
            ("turn heatmap", heatmap_figure(cells)),
            ("clip fraction", clip_figure(curves)),
            ("module grad norms", modules_figure(modules)),
        ],
    )


def overview_figure(runs: RunSet, run_ids: Sequence[str], max_points: int = 2000) -> go.Figure:
    """Reward curves of several runs on one plot."""
    figure = go.Figure()
    for run_id in run_ids:
        params = {"run_id": run_id, "width": _bucket_width(runs, run_id, max_points)}
        curves = _columns(runs.sql(CURVES_SQL, params))
        figure.add_trace(go.Scatter(x=curves["step"], y=curves["reward_mean"], name=run_id, mode="lines"))
    figure.update_layout(title="reward by run", xaxis_title="step", yaxis_title="reward", height=360)
    return figure


def _fmt(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def verdict_html(verdict: Verdict) -> str:
    """The verdict as a small HTML block: timeline, root cause, remedy, top alerts."""
    collapse = (
        f"step {verdict.collapse_step} ({verdict.collapse_reason})" if verdict.collapsed else "none: healthy"
    )
    lead = f"{verdict.lead_time} steps" if verdict.lead_time is not None else "—"
    cause = (
        f"<tr><th>root cause</th><td><b>{html.escape(verdict.root_cause)}</b>: {html.escape(verdict.explanation)}</td></tr>"
        f"<tr><th>remedy</th><td>{html.escape(verdict.remedy)}</td></tr>"
        if verdict.collapsed
        else ""
    )
    notes = "".join(f"<tr><th>note</th><td>{html.escape(note)}</td></tr>" for note in verdict.notes)
    rows = "".join(
        f"<tr><td>{html.escape(a['detector'])}</td><td class='{a['severity']}'>{a['severity']}</td>"
        f"<td>{a['first_step']}</td><td>{_fmt(a['first_critical_step'])}</td><td>{a['count']}</td>"
        f"<td>{html.escape(a['message'] or '')}</td></tr>"
        for a in verdict.top_alerts
    )
    evidence = ", ".join(
        f"{html.escape(k)} = {_fmt(v)}" for k, v in verdict.evidence.items() if v is not None
    )
    return (
        f"<table class='timeline'><tr><th>algorithm</th><td>{html.escape(str(verdict.algorithm))}</td></tr>"
        f"<tr><th>updates</th><td>{verdict.updates}</td></tr>"
        f"<tr><th>first warning</th><td>{_fmt(verdict.first_warning)}</td></tr>"
        f"<tr><th>first critical</th><td>{_fmt(verdict.first_critical)}</td></tr>"
        f"<tr><th>collapse</th><td>{html.escape(collapse)}</td></tr>"
        f"<tr><th>lead time</th><td>{lead}</td></tr>"
        f"{cause}{notes}</table>"
        f"<details><summary>evidence</summary><p class='evidence'>{evidence}</p></details>"
        f"<table class='alerts'><tr><th>detector</th><th>severity</th><th>first step</th>"
        f"<th>first critical</th><th>count</th><th>strongest firing</th></tr>{rows}</table>"
    )


PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 1.5em auto; max-width: 1200px; color: #222; }}
table {{ border-collapse: collapse; margin: 0.6em 0; font-size: 0.9em; }}
th, td {{ border: 1px solid #ddd; padding: 3px 8px; text-align: left; vertical-align: top; }}
td.critical {{ color: #b00; font-weight: bold; }} td.warning {{ color: #c60; }}
.evidence {{ font-size: 0.85em; color: #555; }}
section {{ border-top: 2px solid #eee; margin-top: 2em; }}
</style></head><body>
<h1>{title}</h1>
<p>sorl-monitor report: curves with alert onsets (orange warning, red critical), CTN-on spans (green),
collapse (red dashed). Generated offline; plotly is embedded in this file.</p>
{body}
</body></html>
"""


def _figure_html(figure: go.Figure, first: bool) -> str:
    """A figure as a ``<div>``; the first one on the page carries plotly.js inline (the page works offline)."""
    return figure.to_html(
        full_html=False, include_plotlyjs=first, config={"displaylogo": False, "responsive": True}
    )


def build_report(
    runs: RunSet, run_ids: Sequence[str], config: DetectorConfig | None = None, max_points: int = 2000
) -> tuple[str, int]:
    """The HTML page for ``run_ids`` and the number of figures on it."""
    config = config or DetectorConfig()
    body: list[str] = []
    count = 0
    if len(run_ids) > 1:
        body.append(
            f"<section><h2>overview</h2>{_figure_html(overview_figure(runs, run_ids, max_points), True)}</section>"
        )
        count += 1
    for run_id in run_ids:
        result = run_figures(runs, run_id, config, max_points)
        body.append(f"<section><h2>run {html.escape(run_id)}</h2>{verdict_html(result.verdict)}")
        for name, figure in result.figures:
            body.append(f"<h3>{html.escape(name)}</h3>{_figure_html(figure, count == 0)}")
            count += 1
        body.append("</section>")
    title = "sorl-monitor: " + ", ".join(run_ids)
    return PAGE.format(title=html.escape(title), body="".join(body)), count


def write_report(
    runs: RunSet, run_ids: Sequence[str], path: str | Path, config: DetectorConfig | None = None
) -> int:
    """Write the report to ``path``; returns the number of figures."""
    page, count = build_report(runs, run_ids, config)
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(page, encoding="utf-8")
    return count
