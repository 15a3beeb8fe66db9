"""The sorl-monitor dashboard: ``sorl dashboard LOG_DIR`` starts it (Streamlit, bound to 127.0.0.1).

Layout only: the data (incremental reads, downsampling, detectors, verdict) lives in
``sorl_monitor.dashboard_data``, the figures in ``sorl_monitor.views``. Each view is a tab that runs
only when open; live views are fragments that redraw themselves every few seconds.
"""

from __future__ import annotations

import streamlit as st

from dashboard import alerts_view, common, gradients_view, overview_view, sql_view, turns_view

VIEWS = {
    "Overview": overview_view.render,
    "Turns": turns_view.render,
    "Gradients": gradients_view.render,
    "Alerts & verdict": alerts_view.render,
    "SQL": sql_view.render,
}

st.set_page_config(page_title="sorl-monitor", layout="wide")
settings = common.settings()
if settings.log_dir is None:
    st.error(
        "No log folder given. Start the dashboard with `sorl dashboard LOG_DIR` "
        f"(or set {common.LOG_DIR_ENV})."
    )
    st.stop()
try:
    live = common.live_runs(
        str(settings.log_dir), settings.detector_config, settings.detector_overrides, settings.log_format
    )
except ValueError as error:
    st.error(f"Bad detector settings: {error}")
    st.stop()

with st.sidebar:
    st.title("sorl-monitor")
    st.caption(f"log folder: `{settings.log_dir}`")
    live_on = st.toggle("live updates", value=True, key="live", help=f"redraw every {settings.refresh_s:g} s")

with common.shown_errors("reading the log folder"):
    live.refresh()
if live.problem or not live.run_ids():
    common.live_fragment(
        common.refresh_interval(True, settings), overview_view.wait_for_runs, live, live.problem
    )
    st.stop()

with st.sidebar:
    run_ids = live.run_ids()
    selected = st.multiselect(
        "runs",
        run_ids,
        default=run_ids[-1:],
        key="runs",
        bind="query-params",
        help="pick several to overlay them",
    )
    common.live_fragment(common.refresh_interval(live_on, settings), overview_view.run_status, live, run_ids)

if not selected:
    st.info("Pick one or more runs in the sidebar.")
    st.stop()

tabs = st.tabs(list(VIEWS), key="view", bind="query-params")
for tab, (name, render) in zip(tabs, VIEWS.items(), strict=True):
    with tab:
        if tab.open:
            with common.shown_errors(f"the {name} view"):
                render(live, selected, common.refresh_interval(live_on, settings))
