"""Overview tab: the selected runs' curves and alert onsets on one x axis, redrawn live; the sidebar's run list."""

from __future__ import annotations

import time
from collections.abc import Sequence

import streamlit as st

from sorl_monitor.dashboard import view_parts
from sorl_monitor.dashboard.verdict_line import ALARMING, colored_status, plain, verdict_line
from sorl_monitor.diagnose.live import LiveRuns, LiveRunState
from sorl_monitor.figures.notes import length_note, log_zero_notes
from sorl_monitor.figures.overview import OverviewOptions, overview_figure
from sorl_monitor.figures.panels import logged_panels

LEGEND = (
    "Top lane: a row per detector family, ▲ warning ✕ critical at the first alert of each streak (hover: "
    "the detector and its message; click a family in the legend to hide its markers). Green: CTN on. "
    "Dashed line: collapse (mean reward below half its peak for good). Curves keep each bucket's min and "
    "max, so spikes stay visible; drag to zoom, double-click to reset."
)


def render(live: LiveRuns, run_ids: Sequence[str], refresh_s: float | None, options: OverviewOptions) -> None:
    view_parts.live_fragment(refresh_s, _overview, live, list(run_ids), options)


VERDICT_WAIT_S = 1.0
"""How long the overview waits for a run's post-mortem (its status line) after the chart is drawn."""


def _overview(live: LiveRuns, run_ids: list[str], options: OverviewOptions) -> None:
    with view_parts.shown_errors("the overview"):
        live.refresh()
        head, body = st.container(), st.container()
        ready = [run_id for run_id in run_ids if view_parts.run_notes(live, run_id) is None]
        if ready:  # the chart first: the status lines may wait for a post-mortem
            with body:
                view_parts.chart(
                    "overview", live, ready, options,
                    lambda: overview_figure([live.curves(run_id) for run_id in ready], options),
                )  # fmt: skip
                st.caption(LEGEND)
        for run_id in run_ids:
            head.markdown(status_line(run_id, live.run_state(run_id), live))
            note = view_parts.run_notes(live, run_id)
            if note:
                head.info(note)
            else:
                head.markdown(run_verdict(live, run_id))
                notes = data_notes(live, run_id, options)
                if notes:
                    head.caption("  \n".join(notes))
        with head:
            view_parts.show_skipped_parts(live, run_ids)


def run_verdict(live: LiveRuns, run_id: str) -> str:
    """The run's verdict in words (``verdict_line``), or that it is being computed."""
    verdict = live.verdict(run_id, wait_s=VERDICT_WAIT_S)
    if verdict is None:
        return ":gray[verdict: computing the post-mortem…]"
    return "↳ " + verdict_line(verdict, live.timeline(run_id).onsets, live.detector_config.smooth_steps)


def data_notes(live: LiveRuns, run_id: str, options: OverviewOptions) -> list[str]:
    """What the run's curves show that the chart would hide: zeros on a log axis, the length across the
    collapse (``figures.notes``), each only when the data shows it."""
    steps = live.steps(run_id)
    panels = logged_panels([steps])
    log_titles = {
        p.title for p in panels if (p.log_y if options.log_panels is None else p.title in options.log_panels)
    }
    notes = log_zero_notes(steps, panels, log_titles)
    length = length_note(steps, live.collapse_step(run_id))
    return [f"{plain(run_id)} · {note}" for note in (*notes, *([length] if length else []))]


def status_line(run_id: str, info: LiveRunState | None, live: LiveRuns | None = None) -> str:
    """``**run** · algorithm · state · step N · reward R · last write S s ago`` (markdown)."""
    if info is None:
        return f"**{plain(run_id)}** · gone"
    algorithm = info.algorithm if live is None else view_parts.algorithm_words(live, run_id, info.algorithm)
    parts = [
        f"**{plain(run_id)}**",
        plain(algorithm) if algorithm else "algorithm not logged",
        plain(info.status),
    ]
    parts.append("no update yet" if info.last_step is None else f"step {info.last_step}")
    if info.last_reward is not None:
        parts.append(f"reward {info.last_reward:.3g}")
    if info.idle_s is not None:
        parts.append(f"last write {info.idle_s:.0f} s ago")
    return " · ".join(parts)


def urgency(info: LiveRunState, status: str | None) -> tuple[int, float]:
    """Sort key, most urgent first: the verdict's alarming statuses in ``ALARMING`` order (a collapse label
    counts as ``collapsed`` until the verdict is in), then the rest, most recently written first."""
    status = status or ("collapsed" if info.collapse_step is not None else None)
    rank = ALARMING.index(status) if status in ALARMING else len(ALARMING)
    return rank, info.idle_s if info.idle_s is not None else float("inf")


def most_urgent(infos: Sequence[LiveRunState], statuses: dict[str, str] | None = None) -> list[str]:
    """The run the first page opens on: the most urgent (``urgency``); none when there are no runs."""
    statuses = statuses or {}
    ranked = sorted(infos, key=lambda info: urgency(info, statuses.get(info.run_id)))
    return [ranked[0].run_id] if ranked else []


def run_status(live: LiveRuns, known: list[str]) -> None:
    """Sidebar: each run's verdict status (when computed), state and last step, most urgent first; reruns the
    page when a new run appears."""
    with view_parts.shown_errors("the run list"):
        live.refresh()
        infos = live.run_states()
        if [info.run_id for info in infos] != known:
            st.rerun()
        first = not st.session_state.get("sidebar-verdicts")  # the first paint is not slowed by post-mortems
        st.session_state["sidebar-verdicts"] = True
        statuses = {info.run_id: None if first else _known_status(live, info.run_id) for info in infos}
        ranked = sorted(infos, key=lambda info: urgency(info, statuses[info.run_id]))
        lines = [
            _sidebar_line(
                info, statuses[info.run_id], view_parts.algorithm_words(live, info.run_id, info.algorithm)
            )
            for info in ranked
        ]
        st.markdown("\n\n".join(lines))
        st.caption(f"checked {time.strftime('%H:%M:%S')}".replace(":", "\\:"))


def _known_status(live: LiveRuns, run_id: str) -> str | None:
    """The run's verdict status when its post-mortem is in (asked for without waiting), else ``None``."""
    if not live.run_state(run_id) or not live.run_state(run_id).updates:
        return None
    verdict = live.verdict(run_id, wait_s=0)
    return None if verdict is None else verdict.status


def _sidebar_line(info: LiveRunState, status: str | None, algorithm: str) -> str:
    """``status · run`` then ``algorithm · state · step N`` in small grey text."""
    mark = colored_status(status) if status else (":red[**collapsed**]" if info.collapse_step else "…")
    detail = " · ".join(
        [plain(algorithm), plain(info.status)]
        + ([f"collapse at {info.collapse_step}"] if info.collapse_step is not None else [])
        + ["no updates yet" if info.last_step is None else f"step {info.last_step}"]
    )
    detail = detail.replace("\\[", "(").replace("\\]", ")")  # a bracket would end the grey text
    return f"{mark} **{plain(info.run_id)}**  \n:gray[{detail}]"


def wait_for_runs(live: LiveRuns, problem: str | None) -> None:
    """Shown while the log folder is missing or empty: the reason, then a full rerun once runs appear."""
    live.refresh()
    if live.problem is None and live.run_ids():
        st.rerun()
    st.info(live.problem or problem or f"No runs in {live.log_dir} yet.")
