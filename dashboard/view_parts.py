"""Pieces every view shares: settings, the shared ``LiveRuns``, live fragments, charts, friendly messages."""

from __future__ import annotations

import atexit
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import plotly.graph_objects as go
import pyarrow as pa
import streamlit as st

from sorl_monitor.dashboard.launch_settings import Settings
from sorl_monitor.dashboard.live_chart import basic_enough, live_chart
from sorl_monitor.dashboard.verdict_line import plain
from sorl_monitor.diagnose.live import LiveRuns
from sorl_monitor.diagnose.postmortem import load_configs
from sorl_monitor.logs import LogOptions
from sorl_monitor.logs.options import config_tables
from sorl_monitor.read.query import QueryError
from sorl_monitor.read.run_list import VerdictList

logger = logging.getLogger("sorl_monitor.dashboard")


@st.cache_resource(show_spinner=False, on_release=LiveRuns.close, max_entries=16)
def live_runs(
    log_dir: str,
    detector_config: str | None,
    detector_overrides: tuple[str, ...],
    log_format: str | None = None,
    log_map: tuple[str, ...] = (),
    logging_steps: int | None = None,
    run_paths: tuple[str, ...] = (),
) -> LiveRuns:
    """One ``LiveRuns`` per log dir, detector settings and ``run_paths`` (only those runs opened: a fleet's
    picked runs; every run when empty), shared by every viewer (each part is read once); closed when the
    cache drops it (more than 16 kept) or the server exits. ``ValueError`` for bad detector settings."""
    detectors, postmortem_config = load_configs(detector_config, detector_overrides)
    options = LogOptions.build(log_map, logging_steps, config_tables(detector_config))
    return LiveRuns(
        log_dir,
        detector_config=detectors,
        postmortem_config=postmortem_config,
        fmt=log_format,
        log_options=options,
        run_paths=run_paths,
    )


atexit.register(live_runs.clear)


@st.cache_resource(show_spinner=False)
def verdict_list(log_dir: str, table: str | None = None) -> VerdictList:
    """The run list of a folder or ``s3://`` prefix from ``sorl fleet``'s verdict table (its own, or
    ``table`` given with ``--verdicts``), shared by every viewer."""
    return VerdictList(log_dir, table)


@contextmanager
def shown_errors(what: str) -> Iterator[None]:
    """Show a failure inside the block as one line on the page (the traceback goes to the server log)."""
    try:
        yield
    except QueryError as error:
        st.error(f"{what}: {error}")
    except Exception as error:  # noqa: BLE001 - the page shows a message, never a traceback
        logger.exception("dashboard: %s failed", what)
        st.error(f"{what} failed ({type(error).__name__}: {error}). The details are in the dashboard's log.")


def live_fragment(refresh_s: float | None, body: Callable[..., None], *args: Any) -> None:
    """Run ``body(*args)`` as a fragment that reruns by itself every ``refresh_s`` seconds (never if None)."""
    st.fragment(run_every=refresh_s)(body)(*args)


def refresh_interval(live_on: bool, settings_: Settings) -> float | None:
    """Seconds between a live view's redraws, or ``None`` (no redraws) when live updates are off."""
    return settings_.refresh_s if live_on else None


def chart(
    key: str, live: LiveRuns, run_ids: Sequence[str], options: Any, build: Callable[[], go.Figure]
) -> None:
    """Draw ``build()`` in the live chart ``key``, built again only when new rows of ``run_ids`` arrived or
    ``options`` changed (every viewer of the same runs shares the figure)."""
    versions = tuple((run_id, live.version(run_id)) for run_id in run_ids)
    spec, basic = _figure_json(key, id(live), versions, repr(options), build)
    drawn = live_chart(spec, key=key, revision=hash(versions), basic=basic)
    st.session_state[CHART_SENT] = True
    if not st.session_state.get(CHOICES_SHOWN):
        waiting_since = st.session_state.setdefault(CHOICES_WAITING, time.monotonic())
        if drawn or time.monotonic() - waiting_since > CHOICES_WAIT_S:
            st.session_state[CHOICES_SHOWN] = True
            st.rerun(scope="app")  # the page again, now with the sidebar's widgets


CHART_SENT = "chart-sent"
"""Session key: a live chart was sent in this run of the page (``app.py`` resets it before the views)."""
CHOICES_SHOWN = "choices-shown"
"""Session key: the sidebar's run picker, chart options and run list are drawn. A session's first page leaves
them out while its chart is on the way (their widgets' code, loaded by the browser when they first appear,
held the chart's frame and its plotly.js fetch back); the chart's first draw (the component's value) or
``CHOICES_WAIT_S`` of fragment reruns without it sets it and reruns the page."""
CHOICES_WAITING = "choices-waiting"
"""Session key: since when (``time.monotonic()``) the page waits for its first chart to be drawn."""
CHOICES_WAIT_S = 3.0
"""The sidebar's widgets are drawn at the latest this long after the first chart was sent (a browser whose
chart never reports being drawn), at the view's next live redraw."""


@st.cache_data(max_entries=48, show_spinner=False)
def _figure_json(
    key: str, live_id: int, versions: tuple, options: str, _build: Callable[[], go.Figure]
) -> tuple[str, bool]:
    """The figure's JSON, and whether the basic plotly.js bundle draws all its traces."""
    figure = _build()
    return figure.to_json(), basic_enough(trace.type or "scatter" for trace in figure.data)


def foreign_log(live: LiveRuns, run_id: str) -> str | None:
    """``a trl log (rho.json)`` for a run read from another tool's log (``None`` for a sorl-monitor run)."""
    run = None if live.run_set is None else live.run_set.foreign.get(run_id)
    if run is None:
        return None
    family = f"{run.family} " if run.family else ""
    return f"a {family}log (`{Path(run.source).name}`, format {run.format})"


def algorithm_words(live: LiveRuns, run_id: str, algorithm: str | None) -> str:
    """The run's algorithm; else the trainer family its log's names show; else that the log does not say."""
    if algorithm:
        return algorithm
    run = None if live.run_set is None else live.run_set.foreign.get(run_id)
    if run is not None and run.family:
        return f"{run.family} trainer (algorithm not in the log)"
    return "algorithm not logged"


def run_notes(live: LiveRuns, run_id: str, table: str | None = None) -> str | None:
    """Why ``run_id`` has nothing to draw yet (``None`` when it has steps), naming unreadable parts."""
    info = live.run_state(run_id)
    if info is None:
        return f"Run {run_id} is not in {live.log_dir} (any more)."
    if info.updates:
        return None
    unreadable = [p for p in live.skipped_parts(run_id) if p.table == "steps"]
    if unreadable:
        return (
            f"Run {run_id} has no readable steps rows: {len(unreadable)} of its steps parts could not be read "
            "(listed below)."
        )
    return (
        f"Run {run_id} has started ({info.status}) but has not logged an update yet; "
        "its curves appear here by themselves."
    )


def tables_per_run(
    live: LiveRuns,
    run_ids: Sequence[str],
    head: Any,
    read: Callable[[str], pa.Table],
    missing: Callable[[str], str],
) -> dict[str, pa.Table]:
    """Each run's ``read(run_id)`` that has rows; in ``head``, why each other run has none (``missing``), and
    the unreadable parts of every run."""
    found = {}
    for run_id in run_ids:
        note = run_notes(live, run_id)
        table = None if note else read(run_id)
        if table is not None and table.num_rows:
            found[run_id] = table
        else:
            head.info(note or missing(run_id))
    with head:
        show_skipped_parts(live, run_ids)
    return found


def show_skipped_parts(live: LiveRuns, run_ids: Sequence[str]) -> None:
    """A warning per run with part files that could not be read: each file (relative to the log folder) and why."""
    for run_id in run_ids:
        parts = live.skipped_parts(run_id)
        if not parts:
            continue
        lines = "\n".join(f"- `{_relative(p.path, live.log_dir)}`: {p.reason}" for p in parts)
        st.warning(
            f"**{plain(run_id)}**: {len(parts)} part file{'s' if len(parts) > 1 else ''} could not be read and "
            f"{'are' if len(parts) > 1 else 'is'} left out:\n{lines}"
        )


def _relative(path: str, root: Path | str) -> str:
    try:
        return str(Path(path).relative_to(Path(root).resolve()))
    except ValueError:
        return path
