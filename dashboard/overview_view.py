"""Overview tab: the selected runs' curves and alert onsets on one x axis, redrawn live; the sidebar's run list."""

from __future__ import annotations

import time
from collections.abc import Sequence

import streamlit as st

from sorl_monitor.dashboard import common
from sorl_monitor.figures.overview import OverviewOptions, overview_figure
from sorl_monitor.live import LiveRuns, RunInfo

LEGEND = (
    "Top lane: a row per detector family, ▲ warning ✕ critical at the first alert of each streak (hover: "
    "the detector and its message; click a family in the legend to hide its markers). Green: CTN on. "
    "Dashed line: collapse (mean reward below half its peak for good). Curves keep each bucket's min and "
    "max, so spikes stay visible; drag to zoom, double-click to reset."
)


def render(live: LiveRuns, run_ids: Sequence[str], refresh_s: float | None, options: OverviewOptions) -> None:
    common.live_fragment(refresh_s, _overview, live, list(run_ids), options)


def _overview(live: LiveRuns, run_ids: list[str], options: OverviewOptions) -> None:
    with common.shown_errors("the overview"):
        live.refresh()
        head, body = st.container(), st.container()
        ready = []
        for run_id in run_ids:
            head.markdown(status_line(run_id, live.run_info(run_id)))
            note = common.run_notes(live, run_id)
            if note:
                head.info(note)
            else:
                ready.append(run_id)
        with head:
            common.show_skipped_parts(live, run_ids)
        if ready:
            with body:
                common.chart(
                    "overview", live, ready, options,
                    lambda: overview_figure([live.curves(run_id) for run_id in ready], options),
                )  # fmt: skip
                st.caption(LEGEND)


def status_line(run_id: str, info: RunInfo | None) -> str:
    """``**run** · algorithm · status · step N · reward R · last write S s ago`` (markdown)."""
    if info is None:
        return f"**{run_id}** · gone"
    parts = [f"**{run_id}**", info.algorithm or "algorithm ?", info.status]
    if info.collapse_step is not None:
        parts.append(f":red[collapsed at step {info.collapse_step}]")
    parts.append("no update yet" if info.last_step is None else f"step {info.last_step}")
    if info.last_reward is not None:
        parts.append(f"reward {info.last_reward:.3g}")
    if info.idle_s is not None:
        parts.append(f"last write {info.idle_s:.0f} s ago")
    return " · ".join(parts)


def run_status(live: LiveRuns, known: list[str]) -> None:
    """Sidebar: each run's status and last step; reruns the page when a new run appears."""
    with common.shown_errors("the run list"):
        live.refresh()
        infos = live.run_infos()
        if [info.run_id for info in infos] != known:
            st.rerun()
        st.caption("\n\n".join(info.label for info in infos) + f"\n\nchecked {time.strftime('%H:%M:%S')}")


def wait_for_runs(live: LiveRuns, problem: str | None) -> None:
    """Shown while the log folder is missing or empty: the reason, then a full rerun once runs appear."""
    live.refresh()
    if live.problem is None and live.run_ids():
        st.rerun()
    st.info(live.problem or problem or f"No runs in {live.log_dir} yet.")
