"""SQL tab: one read-only statement over ``runs, steps, turns, modules, alerts``, with a time and a row limit."""

from __future__ import annotations

import io
from collections.abc import Sequence

import pyarrow.csv as pacsv
import streamlit as st

from sorl_monitor.dashboard import view_parts
from sorl_monitor.dashboard.launch_settings import settings
from sorl_monitor.diagnose.live import LiveRuns
from sorl_monitor.figures.overview import OverviewOptions
from sorl_monitor.read.sql.background import BackgroundQuery

MAX_ROWS = 10_000
"""Rows fetched, shown and offered as CSV (a statement with more is cut here, and the page says so)."""
EXAMPLE = """SELECT run_id, count(*) AS updates, max(step) AS last_step,
       avg(clip_frac) AS token_clip, avg(clip_frac_turn) AS turn_clip
FROM steps GROUP BY run_id ORDER BY run_id"""


def render(live: LiveRuns, run_ids: Sequence[str], refresh_s: float | None, options: OverviewOptions) -> None:
    time_limit_s = settings().sql_timeout_s
    st.caption(
        "Read-only SQL (DuckDB) over the views `runs, steps, turns, modules, alerts` of every run in the "
        f"folder: one SELECT or EXPLAIN, stopped after {time_limit_s:g} s, at most {MAX_ROWS:,} rows. "
        "It runs on a connection of its own: the other views keep updating meanwhile."
    )
    with view_parts.shown_errors("reading the log folder"):
        live.refresh()
        view_parts.show_skipped_parts(live, live.run_ids())
    with st.form("sql-form"):
        query = st.text_area("SQL", value=EXAMPLE, height=140, key="sql-text")
        submitted = st.form_submit_button("Run")
    if not submitted:
        if st.session_state.get("sql-stop"):
            st.info("Stopped.")
        return
    with view_parts.shown_errors("SQL"):
        if live.run_set is None:
            st.info(live.problem or "no runs to query")
            return
        running = BackgroundQuery(live.run_set, query, timeout_s=time_limit_s, max_rows=MAX_ROWS + 1)
        progress, stop = st.empty(), st.empty()
        stop.button("Stop", key="sql-stop", help="stop the statement")
        try:
            while not running.done(wait_s=0.2):
                # each page call lets Streamlit stop this run (Stop, or the viewer moving on): then the finally
                progress.caption(f"running for {running.elapsed_s:.0f} s (stopped at {time_limit_s:g} s)…")
            progress.empty()
            stop.empty()
        finally:
            running.cancel()
        result = running.result()
        cut = result.num_rows > MAX_ROWS
        result = result.slice(0, MAX_ROWS)
        st.caption(
            f"{result.num_rows:,} row{'' if result.num_rows == 1 else 's'}"
            + (f" (the first {MAX_ROWS:,}: the statement has more)" if cut else "")
        )
        st.dataframe(result, hide_index=True, key="sql-result")
        buffer = io.BytesIO()
        pacsv.write_csv(result, buffer)
        st.download_button("Download CSV", buffer.getvalue(), file_name="query.csv", mime="text/csv")
