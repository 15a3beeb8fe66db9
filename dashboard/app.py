"""The sorl-monitor dashboard: ``sorl dashboard LOG_DIR`` starts it (Streamlit, bound to 127.0.0.1).

Layout only: the data (incremental reads, detectors, verdict) lives in ``sorl_monitor.diagnose.live``, the figures
in ``sorl_monitor.figures``. Each view is a tab that runs only when open; live views are fragments that
redraw themselves in place every ``--refresh`` seconds.
"""

from __future__ import annotations

import streamlit as st

from sorl_monitor.dashboard import (
    alerts_view,
    fleet_view,
    gradients_view,
    links,
    overview_view,
    sql_view,
    turns_view,
    view_parts,
)
from sorl_monitor.dashboard.launch_settings import LOG_DIR_ENV
from sorl_monitor.dashboard.launch_settings import settings as read_settings
from sorl_monitor.diagnose.live import LiveRuns
from sorl_monitor.diagnose.timeline import FAMILY_ORDER
from sorl_monitor.figures.overview import OverviewOptions
from sorl_monitor.figures.panels import OVERVIEW_PANELS
from sorl_monitor.figures.series import X_AXES
from sorl_monitor.read.run_list import VerdictList

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
with st.sidebar:
    st.title("sorl-monitor")
    st.caption(f"log folder: `{settings.log_dir}`")
    live_on = st.toggle("live updates", value=True, key="live", help=f"redraw every {settings.refresh_s:g} s")


def open_live(run_paths: tuple[str, ...] = ()) -> LiveRuns:
    """The shared ``LiveRuns`` of the log folder (of only ``run_paths`` when given), refreshed."""
    try:
        live = view_parts.live_runs(
            str(settings.log_dir), settings.detector_config, settings.detector_overrides, settings.log_format,
            settings.log_map, settings.logging_steps, run_paths,
        )  # fmt: skip
    except ValueError as error:
        st.error(f"Bad detector settings: {error}")
        st.stop()
    with view_parts.shown_errors("reading the log folder"):
        live.refresh()
    return live


has_verdicts = settings.log_dir is not None and (settings.verdicts or VerdictList.present(settings.log_dir))
fleet = view_parts.verdict_list(str(settings.log_dir), settings.verdicts) if has_verdicts else None
if fleet is None:  # every run of the folder is opened: its run list, the first page's run
    live = open_live()
    if live.problem or not live.run_ids():
        view_parts.live_fragment(
            view_parts.refresh_interval(True, settings), overview_view.wait_for_runs, live, live.problem
        )
        st.stop()
    run_ids = live.run_ids()
    first_runs = overview_view.most_urgent(live.run_states())
else:  # a fleet: the run list comes from its verdict table, and only the runs picked are opened
    with view_parts.shown_errors("reading the verdict table"):
        fleet.refresh()
    run_ids = [run.run_id for run in fleet.runs]
    if not run_ids:
        st.info(f"The verdict table {fleet.table} lists no runs yet (`sorl fleet` writes it).")
        st.stop()
    first_runs = fleet_view.first_run(fleet.runs)
DEFAULTS = links.Choice(
    runs=tuple(first_runs),
    view=next(iter(VIEWS)),
    x_axis="step",
    smooth_steps=0,
    log_panels=tuple(p.title for p in OVERVIEW_PANELS if p.log_y),
    families=FAMILY_ORDER,
)
if "asked-runs" not in st.session_state:  # a new session (a link opened, a reload): the URL seeds the widgets
    link = links.read_link(
        {name: st.query_params.get_all(name) for name in links.PARAMS}, DEFAULTS, views=list(VIEWS),
        x_axes=list(X_AXES), smoothing=SMOOTHING, panels=[p.title for p in OVERVIEW_PANELS],
        families=FAMILY_ORDER,
    )  # fmt: skip
    st.session_state.update(
        {"asked-runs": list(link.runs), "view": link.view, "x-axis": link.x_axis,
         "smoothing": link.smooth_steps, "log-panels": list(link.log_panels), "families": list(link.families)}
    )  # fmt: skip
asked = st.session_state["asked-runs"]  # the link's runs, kept while some are not in the folder yet
pending = [run_id for run_id in asked if run_id not in run_ids]
arrived = [run_id for run_id in asked if run_id in run_ids]
if "runs" not in st.session_state:
    st.session_state["runs"] = arrived
else:  # a run the link asked for that appeared since the last run of the page (a run the viewer removed stays out)
    appeared = [run_id for run_id in st.session_state.get("pending-runs", ()) if run_id in run_ids]
    if appeared:
        st.session_state["runs"] = list(dict.fromkeys([*st.session_state["runs"], *appeared]))
st.session_state["pending-runs"] = pending


def sidebar_choices() -> None:
    """The sidebar's run picker, chart options and run list. Drawn after the views: the overview's chart frame
    (and its plotly.js load) then starts before the browser renders these widgets; their values are read from
    the session state above, which Streamlit sets from the browser's widgets before each run of the page.
    Once drawn, drawn in every run (``view_parts.CHOICES_SHOWN``): a widget left out of a run loses its value."""
    st.session_state[view_parts.CHOICES_SHOWN] = True
    with choices_slot:
        choices = run_ids
        filtered = run_ids
        if fleet is not None:  # the picker offers the runs the filters keep, and the runs picked
            filtered = [run.run_id for run in fleet_view.filters(fleet.runs)]
            choices = filtered + [run_id for run_id in st.session_state["runs"] if run_id not in filtered]
        st.multiselect("runs", choices, key="runs", help="pick several to compare them in every view")
        with st.expander("chart options", expanded=False):
            st.segmented_control("x axis", list(X_AXES), key="x-axis")
            st.select_slider(
                "smoothing (steps)", SMOOTHING, key="smoothing",
                format_func=lambda steps: "off" if steps == 0 else str(steps),
                help="trailing mean over this many steps; the raw curve stays, faint",
            )  # fmt: skip
            st.multiselect("log scale", [p.title for p in OVERVIEW_PANELS], key="log-panels")
            st.pills(
                "alert markers", FAMILY_ORDER, selection_mode="multi", key="families",
                help="detector families whose alert onsets are drawn",
            )  # fmt: skip
        if fleet is None:
            view_parts.live_fragment(
                RUN_LIST_REFRESH_S if live_on else None, overview_view.run_status, live, run_ids
            )
        else:
            view_parts.live_fragment(
                RUN_LIST_REFRESH_S if live_on else None, fleet_view.run_list, fleet, filtered, run_ids
            )


with st.sidebar:
    choices_slot = st.container()
selected = [run_id for run_id in st.session_state["runs"] if run_id in run_ids]
options = OverviewOptions(
    x_axis=st.session_state.get("x-axis") or "step",
    smooth_steps=st.session_state["smoothing"],
    log_panels=frozenset(st.session_state["log-panels"]),
    families=frozenset(st.session_state["families"] or ()),
)

st.session_state["asked-runs"] = [*selected, *pending]
if pending:
    st.warning(
        f"Not in {settings.log_dir} (yet): {', '.join(pending)}. The page shows "
        f"{'them' if len(pending) > 1 else 'it'} when {'they appear' if len(pending) > 1 else 'it appears'}."
    )


def keep_in_link(view: str) -> None:
    """Write the page's whole choice into the URL (only when it changed)."""
    choice = links.Choice(
        tuple(st.session_state["asked-runs"]), view, options.x_axis, options.smooth_steps,
        tuple(sorted(options.log_panels)), tuple(f for f in FAMILY_ORDER if f in options.families),
    )  # fmt: skip
    wanted = links.link_params(choice, DEFAULTS)
    if {name: st.query_params.get_all(name) for name in links.PARAMS if name in st.query_params} != wanted:
        st.query_params.from_dict(wanted)


if not selected:
    keep_in_link(st.session_state.get("view") or DEFAULTS.view)
    st.info("Pick one or more runs in the sidebar.")
    sidebar_choices()
    st.stop()

if fleet is not None:
    paths = fleet.by_id()
    live = open_live(tuple(paths[run_id].path for run_id in selected))
st.session_state[view_parts.CHART_SENT] = False
tabs = st.tabs(list(VIEWS), key="view", on_change="rerun")
keep_in_link(next(name for tab, name in zip(tabs, VIEWS, strict=True) if tab.open))
for tab, (name, render) in zip(tabs, VIEWS.items(), strict=True):
    with tab:
        if tab.open:
            with view_parts.shown_errors(f"the {name} view"):
                render(live, selected, view_parts.refresh_interval(live_on, settings), options)
if st.session_state.get(view_parts.CHOICES_SHOWN) or not st.session_state[view_parts.CHART_SENT]:
    sidebar_choices()
else:  # a session's first page, its chart on the way: the widgets come once it is drawn (view_parts.chart)
    st.session_state[view_parts.CHOICES_SHOWN] = False
