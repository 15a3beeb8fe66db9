"""SQL tab: read-only SQL over the views ``runs, steps, turns, modules, alerts``, results and CSV."""

from __future__ import annotations

import io
from collections.abc import Sequence

import pyarrow.csv as pacsv
import streamlit as st

from dashboard import common
from sorl_monitor.dashboard_data import LiveRuns

SHOWN_ROWS = 10_000
"""Rows drawn in the results table (the CSV download has them all)."""
EXAMPLE = """SELECT run_id, count(*) AS updates, max(step) AS last_step,
       avg(clip_frac) AS token_clip, avg(clip_frac_turn) AS turn_clip
FROM steps GROUP BY run_id ORDER BY run_id"""


def render(live: LiveRuns, run_ids: Sequence[str], refresh_s: float | None) -> None:
    st.caption(
        "Read-only SQL (DuckDB) over the views `runs, steps, turns, modules, alerts` of every run in the "
        "folder; only SELECT/EXPLAIN statements run."
    )
    with st.form("sql-form"):
        query = st.text_area("SQL", value=EXAMPLE, height=140, key="sql-text")
        submitted = st.form_submit_button("Run")
    if not submitted:
        return
    with common.shown_errors("the query"):
        live.refresh()
        if live.run_set is None:
            st.info(live.problem or "no runs to query")
            return
        result = live.run_set.sql(query)
        st.caption(
            f"{result.num_rows} rows"
            + (f" (first {SHOWN_ROWS} shown)" if result.num_rows > SHOWN_ROWS else "")
        )
        st.dataframe(result.slice(0, SHOWN_ROWS), hide_index=True, key="sql-result")
        buffer = io.BytesIO()
        pacsv.write_csv(result, buffer)
        st.download_button("Download CSV", buffer.getvalue(), file_name="query.csv", mime="text/csv")
