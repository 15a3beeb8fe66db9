"""One self-contained HTML page (plotly, opens offline) explaining one or more runs.

With several runs, their overview overlaid first; then per run its post-mortem verdict and three
figures, the dashboard's own (``sorl_monitor.figures``): the overview (curves, alert onsets per detector
family, CTN-on spans, collapse), the turn-ratio heatmap and the per-module grad norms. The runs are read
through ``LiveRuns``, as the dashboard reads them.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import plotly.graph_objects as go

from sorl_monitor.diagnose.detectors import DetectorConfig
from sorl_monitor.diagnose.live import LiveRuns
from sorl_monitor.diagnose.postmortem import PostmortemConfig, Verdict, postmortem
from sorl_monitor.figures.modules import module_norms_figure
from sorl_monitor.figures.overview import OverviewOptions, overview_figure
from sorl_monitor.figures.turns import turn_heatmap_figure
from sorl_monitor.read.query import RunSet

FIGURES_PER_RUN = 3
"""Figures each run contributes to the page (one more overview figure when there are several runs)."""
OPTIONS = OverviewOptions(panel_height=120)
"""The report's overview: the dashboard's, with taller panels."""


def _fmt(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def verdict_html(verdict: Verdict) -> str:
    """The verdict as a small HTML block: timeline, root cause, remedy, top alerts."""
    collapse = {
        "collapsed": f"the fall starts at step {verdict.collapse_step} ({verdict.collapse_reason})",
        "collapsing": f"collapsing when the log ends (the fall starts at step {verdict.fall_step})",
        "diverging": f"diverging when the log ends: {verdict.diverging_score}",
        "not_judged": "not judged: no reward logged",
    }.get(verdict.status, "none: healthy")
    lead = f"{verdict.lead_time} steps" if verdict.lead_time is not None else "—"
    cause = (
        f"<tr><th>root cause</th><td><b>{html.escape(verdict.root_cause)}</b>: {html.escape(verdict.explanation)}</td></tr>"
        f"<tr><th>remedy</th><td>{html.escape(verdict.remedy)}</td></tr>"
        if verdict.root_cause is not None
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
<p>sorl-monitor report: curves with alert onsets (▲ amber warning, ✕ red critical; the top lane has a row
per detector family), CTN-on spans (green), collapse (dark red dashed). Generated offline; plotly is
embedded in this file.</p>
{body}
</body></html>
"""


def _figure_html(figure: go.Figure, first: bool) -> str:
    """A figure as a ``<div>``; the first one on the page carries plotly.js inline (the page works offline)."""
    return figure.to_html(
        full_html=False, include_plotlyjs=first, config={"displaylogo": False, "responsive": True}
    )


def build_report(
    runs: RunSet,
    run_ids: Sequence[str],
    config: DetectorConfig | None = None,
    postmortem_config: PostmortemConfig | None = None,
) -> tuple[str, int]:
    """The HTML page for ``run_ids`` and the number of figures on it."""
    config = config or DetectorConfig()
    postmortem_config = postmortem_config or PostmortemConfig()
    live = LiveRuns(runs, detector_config=config, postmortem_config=postmortem_config, min_refresh_s=0)
    body: list[str] = []
    count = 0

    def add(name: str, figure: go.Figure, level: str = "h3") -> None:
        nonlocal count
        body.append(f"<{level}>{html.escape(name)}</{level}>{_figure_html(figure, count == 0)}")
        count += 1

    try:
        live.refresh()
        if len(run_ids) > 1:
            body.append("<section>")
            add("overview", overview_figure([live.curves(run_id) for run_id in run_ids], OPTIONS), "h2")
            body.append("</section>")
        for run_id in run_ids:
            verdict = postmortem(runs, run_id, config, postmortem_config)
            body.append(f"<section><h2>run {html.escape(run_id)}</h2>{verdict_html(verdict)}")
            add("curves and alert onsets", overview_figure([live.curves(run_id)], OPTIONS))
            events = {run_id: live.timeline(run_id)}
            add(
                "turn ratio w̄_k by turn and step",
                turn_heatmap_figure({run_id: live.turn_cells(run_id)}, events=events),
            )
            add("grad norm per module", module_norms_figure({run_id: live.modules(run_id)}, events=events))
            body.append("</section>")
    finally:
        live.close()
    title = "sorl-monitor: " + ", ".join(run_ids)
    return PAGE.format(title=html.escape(title), body="".join(body)), count


def write_report(
    runs: RunSet,
    run_ids: Sequence[str],
    path: str | Path,
    config: DetectorConfig | None = None,
    postmortem_config: PostmortemConfig | None = None,
) -> int:
    """Write the report to ``path``; returns the number of figures."""
    page, count = build_report(runs, run_ids, config, postmortem_config)
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(page, encoding="utf-8")
    return count
