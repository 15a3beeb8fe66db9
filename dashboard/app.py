"""The sorl-monitor dashboard: ``sorl dashboard LOG_DIR`` starts it (Streamlit, bound to 127.0.0.1).

Layout only: the data (incremental reads, detectors, verdict) lives in ``sorl_monitor.live``, the figures
in ``sorl_monitor.figures``. Each view is a tab that runs only when open; live views are fragments that
redraw themselves in place every ``--refresh`` seconds.
"""

from __future__ import annotations

import streamlit as st

from sorl_monitor.dashboard import alerts_view, common, gradients_view, overview_view, sql_view, turns_view
from sorl_monitor.dashboard.settings import LOG_DIR_ENV
from sorl_monitor.dashboard.settings import settings as read_settings
from sorl_monitor.figures.overview import OverviewOptions
from sorl_monitor.figures.panels import OVERVIEW_PANELS
from sorl_monitor.figures.series import X_AXES
from sorl_monitor.timeline import FAMILY_ORDER

VIEWS = {
    "Overview": overview_view.render,
    "Turns": turns_view.render,
    "Gradients": gradients_view.render,
    "Alerts & verdict": alerts_view.render,
    "SQL": sql_view.render,
}
SMOOTHING = (0, 8, 32, 128, 512)
RUN_LIST_REFRESH_S = 5.0  # the sidebar's run list: new runs and statuses (the views redraw every --refresh)
COMPACT = "<style>.block-container {padding-top: 2.2rem; padding-bottom: 1rem;}</style>"
# less white space above the tabs: the overview's panels fit a 1600 × 1000 screen

st.set_page_config(page_title="sorl-monitor", layout="wide")
st.html(COMPACT)
settings = read_settings()
if settings.log_dir is None:
    st.error(
        f"No log folder given. Start the dashboard with `sorl dashboard LOG_DIR` (or set {LOG_DIR_ENV})."
    )
    st.stop()
try:
    live = common.live_runs(
        str(settings.log_dir),
        settings.detector_config,
        settings.detector_overrides,
        settings.log_format,
        settings.log_map,
        settings.logging_steps,
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

run_ids = live.run_ids()
asked = st.session_state.setdefault("asked-runs", st.query_params.get_all("runs"))  # a link's runs, kept
pending = [run_id for run_id in asked if run_id not in run_ids]
arrived = [run_id for run_id in asked if run_id in run_ids]
if "runs" in st.session_state and not set(arrived) <= set(st.session_state["runs"]):
    st.session_state["runs"] = list(dict.fromkeys([*st.session_state["runs"], *arrived]))
with st.sidebar:
    selected = st.multiselect(
        "runs",
        run_ids,
        default=None if "runs" in st.session_state else arrived or run_ids[-1:],
        key="runs",
        bind="query-params",
        help="pick several to compare them in every view",
    )
    with st.expander("chart options", expanded=False):
        options = OverviewOptions(
            x_axis=st.segmented_control("x axis", list(X_AXES), default="step", key="x-axis") or "step",
            smooth_steps=st.select_slider(
                "smoothing (steps)", SMOOTHING, value=0, key="smoothing",
                format_func=lambda steps: "off" if steps == 0 else str(steps),
                help="trailing mean over this many steps; the raw curve stays, faint",
            ),
            log_panels=frozenset(st.multiselect(
                "log scale", [p.title for p in OVERVIEW_PANELS], key="log-panels",
                default=[p.title for p in OVERVIEW_PANELS if p.log_y],
            )),
            families=frozenset(st.pills(
                "alert markers", FAMILY_ORDER, selection_mode="multi", default=FAMILY_ORDER, key="families",
                help="detector families whose alert onsets are drawn",
            )),
        )  # fmt: skip
    common.live_fragment(RUN_LIST_REFRESH_S if live_on else None, overview_view.run_status, live, run_ids)

st.session_state["asked-runs"] = [*selected, *pending]
if pending:
    st.warning(
        f"Not in {settings.log_dir} (yet): {', '.join(pending)}. The page shows "
        f"{'them' if len(pending) > 1 else 'it'} when {'they appear' if len(pending) > 1 else 'it appears'}."
    )
if not selected:
    st.info("Pick one or more runs in the sidebar.")
    st.stop()

tabs = st.tabs(list(VIEWS), key="view", bind="query-params")
for tab, (name, render) in zip(tabs, VIEWS.items(), strict=True):
    with tab:
        if tab.open:
            with common.shown_errors(f"the {name} view"):
                render(live, selected, common.refresh_interval(live_on, settings), options)
