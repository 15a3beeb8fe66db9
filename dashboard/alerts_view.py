"""Alerts & verdict tab: the alerts the trainer logged (detector firings, CTN switches), the detectors'
findings and the post-mortem verdict with its root cause."""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa
import pyarrow.compute as pc
import streamlit as st

from dashboard import common
from sorl_monitor.dashboard_data import LiveRuns
from sorl_monitor.postmortem import Verdict

VERDICT_WAIT_S = 1.0
"""How long a page run waits for a post-mortem in progress before showing the last one (or a note)."""


def render(live: LiveRuns, run_ids: Sequence[str], refresh_s: float | None) -> None:
    run_id = common.pick_one(run_ids, key="alerts-run")
    common.live_fragment(refresh_s, _alerts, live, run_id)


def _alerts(live: LiveRuns, run_id: str) -> None:
    with common.shown_errors("the alerts view"):
        live.refresh()
        logged = live.alerts(run_id)
        st.markdown(f"**Logged alerts and actions** — {run_id}")
        st.caption(logged_summary(logged))
        switches = logged.filter(pc.equal(logged.column("kind"), "action"))
        if switches.num_rows:
            st.markdown("**CTN switches** (the guard's actions)")
            st.dataframe(
                switches.select(["step", "detector", "message"]).rename_columns(["step", "switch", "reason"]),
                hide_index=True,
                key="ctn-table",
            )
        if logged.num_rows:
            st.markdown("**All logged rows**, newest first")
            st.dataframe(logged.sort_by([("step", "descending")]), hide_index=True, key="alerts-table")
        message = common.starting_message(live, run_id)
        if message:
            st.info(message)
            return
    with common.shown_errors("the verdict"):
        verdict = live.verdict(run_id, wait_s=VERDICT_WAIT_S)
        if verdict is None:
            st.info("Computing the post-mortem of the run so far; it appears here by itself.")
            return
        show_verdict(verdict)
        if live.verdict_pending(run_id):
            st.caption("Updating the verdict with the newest updates…")


def logged_summary(logged: pa.Table) -> str:
    """How many alerts and CTN actions the trainer logged, and whether CTN is on now."""
    if logged.num_rows == 0:
        return "The trainer logged no alerts or actions for this run (yet)."
    kinds = logged.column("kind")
    alerts = pc.sum(pc.equal(kinds, "alert")).as_py() or 0
    actions = logged.filter(pc.equal(kinds, "action"))
    text = f"{alerts} alerts, {actions.num_rows} CTN actions"
    if actions.num_rows:
        last = actions.sort_by("step").to_pylist()[-1]
        state = "on" if last["detector"] == "ctn_on" else "off"
        text += f"; CTN is {state} since step {last['step']}"
    return text + "."


def show_verdict(verdict: Verdict) -> None:
    """The post-mortem: timeline, root cause and remedy, the detectors that fired, the evidence.

    (Page errors are ``st.error``; the verdict, however bad, is not one.)
    """
    st.markdown(f"**Verdict** (as of step {verdict.last_step}, {verdict.updates} updates)")
    columns = st.columns(4)
    collapse = "none" if verdict.collapse_step is None else f"step {verdict.collapse_step}"
    columns[0].metric("collapse", collapse)
    columns[1].metric("first warning", _step(verdict.first_warning))
    columns[2].metric("first critical", _step(verdict.first_critical))
    columns[3].metric("lead time", "—" if verdict.lead_time is None else f"{verdict.lead_time} steps")
    with st.container(border=True):
        if verdict.collapsed:
            st.markdown(
                f":red[**Root cause: {verdict.root_cause.replace('_', ' ')}**] — {verdict.explanation}"
            )
            st.markdown(f"**Remedy:** {verdict.remedy}")
        else:
            st.markdown(":green[**Healthy**]: the reward never fell below half its running peak for good.")
        for note in verdict.notes:
            st.markdown(f"- {note}")
    if verdict.not_evaluated:
        st.caption(f"Not evaluated (the run logs no input for them): {', '.join(verdict.not_evaluated)}")
    if verdict.top_alerts:
        st.markdown("**Detectors that fired** (most urgent first)")
        st.dataframe(verdict.top_alerts, hide_index=True, key="verdict-alerts")
    with st.expander("evidence"):
        st.json(verdict.to_dict()["evidence"])


def _step(step: int | None) -> str:
    return "—" if step is None else f"step {step}"
