"""Alerts & verdict tab: the alerts and CTN switches the trainers logged, then each run's post-mortem verdict."""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa
import pyarrow.compute as pc
import streamlit as st

from sorl_monitor.dashboard import view_parts
from sorl_monitor.dashboard.verdict_line import escape, plain
from sorl_monitor.diagnose.live import LiveRuns
from sorl_monitor.diagnose.postmortem import Verdict
from sorl_monitor.figures.overview import OverviewOptions

VERDICT_WAIT_S = 1.0
"""How long a page run waits for a post-mortem in progress before showing the last one (or a note)."""
VERDICTS_PER_ROW = 3


def render(live: LiveRuns, run_ids: Sequence[str], refresh_s: float | None, options: OverviewOptions) -> None:
    view_parts.live_fragment(refresh_s, _alerts, live, list(run_ids))


def _alerts(live: LiveRuns, run_ids: list[str]) -> None:
    with view_parts.shown_errors("the alerts view"):
        live.refresh()
        view_parts.show_skipped_parts(live, run_ids)
        _verdicts(live, run_ids)
        _logged(live, run_ids)


def _verdicts(live: LiveRuns, run_ids: list[str]) -> None:
    """Each run's post-mortem, side by side (at most ``VERDICTS_PER_ROW`` a row)."""
    for run_id in run_ids:
        note = view_parts.run_notes(live, run_id)
        if note:
            st.info(note)
    ready = [run_id for run_id in run_ids if view_parts.run_notes(live, run_id) is None]
    for start in range(0, len(ready), VERDICTS_PER_ROW):
        row = ready[start : start + VERDICTS_PER_ROW]
        for column, run_id in zip(st.columns(len(row)), row, strict=True):
            with column, view_parts.shown_errors(f"the verdict of {run_id}"):
                verdict = live.verdict(run_id, wait_s=VERDICT_WAIT_S)
                if verdict is None:
                    st.info(f"Computing the post-mortem of {run_id} so far; it appears here by itself.")
                    continue
                show_verdict(verdict, wide=len(ready) == 1)
                if live.verdict_pending(run_id):
                    st.caption("Updating the verdict with the newest updates…")


def _logged(live: LiveRuns, run_ids: list[str]) -> None:
    """The alerts and CTN switches the trainers logged, every run in one table."""
    logged = {run_id: live.alerts(run_id) for run_id in run_ids}
    st.markdown("**Logged alerts and actions**")
    for run_id, rows in logged.items():
        st.caption(f"**{plain(run_id)}**: {logged_summary(rows)}")
    every = pa.concat_tables(
        [
            rows.append_column("run", pa.repeat(pa.scalar(run_id), rows.num_rows))
            for run_id, rows in logged.items()
        ]
    ).select(["run", "step", "kind", "detector", "severity", "value", "threshold", "message"])
    switches = every.filter(pc.equal(every.column("kind"), "action"))
    if switches.num_rows:
        st.markdown("**CTN switches** (the guard's actions)")
        st.dataframe(
            switches.select(["run", "step", "detector", "message"]).rename_columns(
                ["run", "step", "switch", "reason"]
            ),
            hide_index=True,
            key="ctn-table",
        )
    if every.num_rows:
        st.markdown("**All logged rows**, newest first")
        newest = every.sort_by([("step", "descending")]).select(
            ["message", "run", "step", "kind", "detector", "severity", "value", "threshold"]
        )
        st.dataframe(
            blanks_for_missing(newest), hide_index=True, key="alerts-table",
            column_config={"message": st.column_config.TextColumn("message", width="large")},
        )  # fmt: skip


def logged_summary(logged: pa.Table) -> str:
    """How many alerts and CTN actions the trainer logged, and whether CTN is on now."""
    if logged.num_rows == 0:
        return (
            "the trainer itself logged no alerts or CTN actions (yet); the detectors above read its metrics "
            "here, in the dashboard."
        )
    kinds = logged.column("kind")
    alerts = pc.sum(pc.equal(kinds, "alert")).as_py() or 0
    actions = logged.filter(pc.equal(kinds, "action"))
    text = f"{alerts} alerts, {actions.num_rows} CTN actions"
    if actions.num_rows:
        last = actions.sort_by("step").to_pylist()[-1]
        state = "on" if last["detector"] == "ctn_on" else "off"
        text += f"; CTN is {state} since step {last['step']}"
    return text + "."


def show_verdict(verdict: Verdict, wide: bool) -> None:
    """One run's post-mortem: timeline (one row of four when ``wide``, else two of two), root cause and remedy
    (or healthy), the detectors that fired, the evidence."""
    st.markdown(
        f"**Verdict: {plain(verdict.run_id)}** (as of step {verdict.last_step}, {verdict.updates} updates)"
    )
    cells = st.columns(4) if wide else [*st.columns(2), *st.columns(2)]
    collapse = "none" if verdict.collapse_step is None else f"step {verdict.collapse_step}"
    cells[0].metric("collapse", collapse)
    cells[1].metric("lead time", "—" if verdict.lead_time is None else f"{verdict.lead_time} steps")
    cells[2].metric("first warning", _step(verdict.first_warning))
    cells[3].metric("first critical", _step(verdict.first_critical))
    with st.container(border=True):
        if verdict.collapsed:
            st.markdown(
                f":red[**Root cause: {verdict.root_cause.replace('_', ' ')}**] — {verdict.explanation}"
            )
            st.markdown(f"**Remedy:** {verdict.remedy}")
        elif verdict.status == "not_judged":
            st.markdown(":orange[**Not judged**]: the run logs no reward, which the collapse label needs.")
        else:
            st.markdown(":green[**Healthy**]: the reward never fell below half its running peak for good.")
        for note in verdict.notes:
            st.markdown(f"- {note}")
    if verdict.not_evaluated:
        st.caption(f"Not evaluated (the run logs no input for them): {', '.join(verdict.not_evaluated)}")
    if verdict.top_alerts:
        st.markdown("**Detectors that fired** (most urgent first)")
        st.markdown(alerts_markdown(verdict.top_alerts))
    with st.expander("evidence"):
        st.json(verdict.to_dict()["evidence"])


def _step(step: int | None) -> str:
    return "—" if step is None else f"step {step}"


ALERT_COLUMNS = (
    ("message", "what it saw"), ("detector", "detector"), ("severity", "severity"), ("first_step", "first"),
    ("first_critical_step", "first critical"), ("count", "blocks"),
)  # fmt: skip
"""The verdict's alert table: the message first (it explains the alert), blanks for missing values."""


def alerts_markdown(rows: list[dict]) -> str:
    """The verdict's ``top_alerts`` as a markdown table that wraps (message first; blank where missing)."""
    head = "| " + " | ".join(title for _, title in ALERT_COLUMNS) + " |"
    rule = "|" + "---|" * len(ALERT_COLUMNS)
    body = ["| " + " | ".join(_cell(row.get(column)) for column, _ in ALERT_COLUMNS) + " |" for row in rows]
    return "\n".join([head, rule, *body])


def _cell(value: object) -> str:
    if value is None:
        return ""
    return escape(str(value)).replace("|", "\\|")


def blanks_for_missing(table: pa.Table):  # noqa: ANN201 - a pandas DataFrame (pandas is not imported here)
    """``table`` as a DataFrame whose missing values show as blank cells, not "None"."""
    frame = table.to_pandas()
    return frame.astype(object).where(frame.notna(), "")
