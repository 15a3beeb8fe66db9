"""Gradients tab: per-module grad norms over steps."""

from __future__ import annotations

from collections.abc import Sequence

import streamlit as st

from dashboard import common
from sorl_monitor.dashboard_data import LiveRuns
from sorl_monitor.views import module_norms_figure


def render(live: LiveRuns, run_ids: Sequence[str], refresh_s: float | None) -> None:
    run_id = common.pick_one(run_ids, key="gradients-run")
    common.live_fragment(refresh_s, _gradients, live, run_id)


def _gradients(live: LiveRuns, run_id: str) -> None:
    with common.shown_errors("the gradient view"):
        live.refresh()
        message = common.starting_message(live, run_id)
        if message:
            st.info(message)
            return
        modules = live.modules(run_id)
        if modules.num_rows == 0:
            st.info(
                f"Run {run_id} logged no per-module grad norms (call `Monitor.watch(model)` to get them)."
            )
            return
        st.markdown(f"**Grad norm per module** (pre-clip) — {run_id}")
        st.plotly_chart(module_norms_figure(modules), key="module-norms", config={"displaylogo": False})
