"""Gradients tab: per-module grad norms of the selected runs, a row per run."""

from __future__ import annotations

from collections.abc import Sequence

import streamlit as st

from sorl_monitor.dashboard import view_parts
from sorl_monitor.diagnose.live import LiveRuns
from sorl_monitor.figures.modules import module_norms_figure
from sorl_monitor.figures.overview import OverviewOptions
from sorl_monitor.figures.series import XAxis


def render(live: LiveRuns, run_ids: Sequence[str], refresh_s: float | None, options: OverviewOptions) -> None:
    view_parts.live_fragment(refresh_s, _gradients, live, list(run_ids), options.x_axis)


def _gradients(live: LiveRuns, run_ids: list[str], x_axis: str) -> None:
    with view_parts.shown_errors("the gradient view"):
        live.refresh()
        head, body = st.container(), st.container()
        modules = view_parts.tables_per_run(
            live, run_ids, head, live.modules, lambda run_id: no_modules(live, run_id)
        )
        if modules:
            body.markdown("**Grad norm per module** (pre-clip; ranks: the largest)")
            axis = XAxis({run_id: live.steps(run_id) for run_id in modules}, x_axis)
            with body:
                view_parts.chart(
                    "module-norms",
                    live,
                    list(modules),
                    x_axis,
                    lambda: module_norms_figure(modules, axis, events={r: live.timeline(r) for r in modules}),
                )


def no_modules(live: LiveRuns, run_id: str) -> str:
    if any(p.table == "modules" for p in live.skipped_parts(run_id)):
        return f"Run {run_id}'s module parts could not be read (listed below)."
    foreign = view_parts.foreign_log(live, run_id)
    if foreign:
        return (
            f"Run {run_id} logged no per-module grad norms: it is {foreign}, with one total grad norm "
            "per step (on the Overview)."
        )
    return f"Run {run_id} logged no per-module grad norms (call `Monitor.watch(model)` to get them)."
