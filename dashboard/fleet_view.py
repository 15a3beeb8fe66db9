"""The sidebar over a fleet (a folder holding ``sorl fleet``'s verdict table): the run list read from the
table, filtered by status and a search, most urgent first. Only the runs a viewer picks are opened
(``sorl_monitor.read.run_list``; ``LiveRuns(run_paths=...)``)."""

from __future__ import annotations

from collections.abc import Sequence

import streamlit as st

from sorl_monitor.dashboard import view_parts
from sorl_monitor.dashboard.verdict_line import ALARMING, colored_status, plain, status_words
from sorl_monitor.read.run_list import UNJUDGED, ListedRun, VerdictList, filter_runs, status_counts

SHOWN = 30
"""Runs the list draws (the first of the filtered list); the picker offers all of them."""


def first_run(runs: Sequence[ListedRun]) -> list[str]:
    """The run the first page opens on: the first alarming one (``ALARMING`` order), else the list's first."""
    for status in ALARMING:
        for run in runs:
            if run.status == status:
                return [run.run_id]
    return [runs[0].run_id] if runs else []


def filters(runs: Sequence[ListedRun]) -> list[ListedRun]:
    """The status pills (with counts; none picked: every status) and the search box; the runs they keep."""
    counts = status_counts(runs)
    picked = st.pills(
        "status", list(counts), selection_mode="multi", key="fleet-status",
        format_func=lambda status: f"{_words(status)} {counts.get(status, 0):,}",
        help="the verdicts of `sorl fleet`; none picked: every run",
    )  # fmt: skip
    search = st.text_input("search runs", key="fleet-search", placeholder="run id, algorithm, root cause")
    return filter_runs(runs, set(picked) if picked else None, search)


def run_list(verdicts: VerdictList, shown: list[str], known: list[str]) -> None:
    """The first ``SHOWN`` runs of the filtered list, most urgent first, and what the table is; reruns the
    page when the table (or the run folders beside it) changed."""
    with view_parts.shown_errors("the run list"):
        verdicts.refresh()
        if [run.run_id for run in verdicts.runs] != known:
            st.rerun()
        listed = verdicts.by_id()
        lines = [_line(listed[run_id]) for run_id in shown[:SHOWN] if run_id in listed]
        if len(shown) > SHOWN:
            lines.append(f":gray[… and {len(shown) - SHOWN:,} more: filter or search to narrow the list]")
        st.markdown("\n\n".join(lines) or ":gray[no run matches]")
        unjudged = sum(run.status == UNJUDGED for run in verdicts.runs)
        note = f"{len(shown):,} of {len(known):,} runs; verdicts of `sorl fleet`"
        if verdicts.judged_at:
            note += f" judged {verdicts.judged_at}"
        if unjudged:
            note += f"; {unjudged:,} run folder{'s' if unjudged > 1 else ''} newer than the table"
        st.caption(note)


def _words(status: str) -> str:
    return "not in the table" if status == UNJUDGED else status_words(status)


def _line(run: ListedRun) -> str:
    """``status · run`` then ``algorithm · collapse at S · step N · root cause`` in small grey text."""
    mark = f":gray[**{_words(run.status)}**]" if run.status == UNJUDGED else colored_status(run.status)
    detail = [plain(run.algorithm) if run.algorithm else "algorithm not logged"]
    if run.collapse_step is not None:
        detail.append(f"collapse at {run.collapse_step}")
    if run.last_step is not None:
        detail.append(f"step {run.last_step}")
    if run.error or run.root_cause:
        detail.append(plain((run.error or status_words(run.root_cause or ""))[:100]))
    text = " · ".join(detail).replace("\\[", "(").replace("\\]", ")")  # a bracket would end the grey text
    return f"{mark} **{plain(run.run_id)}**  \n:gray[{text}]"
