"""Pieces every view shares: settings, the shared ``LiveRuns``, live fragments, friendly errors."""

from __future__ import annotations

import atexit
import logging
import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import streamlit as st

from sorl_monitor.dashboard_data import LiveRuns
from sorl_monitor.detectors import load_config
from sorl_monitor.query import QueryError

LOG_DIR_ENV = "SORL_DASHBOARD_LOG_DIR"
REFRESH_ENV = "SORL_DASHBOARD_REFRESH_S"
CONFIG_ENV = "SORL_DASHBOARD_DETECTOR_CONFIG"
"""A TOML file of detector settings (``sorl dashboard --config``)."""
OVERRIDES_ENV = "SORL_DASHBOARD_DETECTOR_SET"
"""Detector overrides, one ``name=value`` a line (``sorl dashboard --set``)."""
FORMAT_ENV = "SORL_DASHBOARD_LOG_FORMAT"
"""The log format ``sorl dashboard --format`` forces (``sorl_monitor.logs.FORMATS``); detected when unset."""
DEFAULT_REFRESH_S = 2.0
logger = logging.getLogger("sorl_monitor.dashboard")


@dataclass(frozen=True)
class Settings:
    """What ``sorl dashboard`` passes to the app (through the environment)."""

    log_dir: Path | None
    refresh_s: float
    detector_config: str | None = None
    detector_overrides: tuple[str, ...] = ()
    log_format: str | None = None


def settings() -> Settings:
    """Settings from the ``SORL_DASHBOARD_*`` variables ``sorl dashboard`` sets (refresh at least 0.5 s)."""
    raw = os.environ.get(LOG_DIR_ENV)
    try:
        refresh = float(os.environ.get(REFRESH_ENV, DEFAULT_REFRESH_S))
    except ValueError:
        refresh = DEFAULT_REFRESH_S
    overrides = tuple(line for line in os.environ.get(OVERRIDES_ENV, "").splitlines() if line.strip())
    return Settings(
        Path(raw) if raw else None,
        max(0.5, refresh),
        os.environ.get(CONFIG_ENV) or None,
        overrides,
        os.environ.get(FORMAT_ENV) or None,
    )


@st.cache_resource(show_spinner=False, on_release=LiveRuns.close)
def live_runs(
    log_dir: str,
    detector_config: str | None,
    detector_overrides: tuple[str, ...],
    log_format: str | None = None,
) -> LiveRuns:
    """One ``LiveRuns`` per log dir and detector settings, shared by every viewer (each part is read once);
    closed when the cache drops it or the server exits.

    ``ValueError`` (a one-line message) for bad detector settings.
    """
    return LiveRuns(log_dir, detector_config=load_config(detector_config, detector_overrides), fmt=log_format)


atexit.register(live_runs.clear)


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


def pick_one(run_ids: Sequence[str], key: str) -> str:
    """One of the selected runs (a select box when there are several)."""
    if len(run_ids) == 1:
        return run_ids[0]
    return st.selectbox("run", run_ids, key=key)


def refresh_interval(live_on: bool, settings_: Settings) -> float | None:
    """Seconds between a live view's redraws, or ``None`` (no redraws) when live updates are off."""
    return settings_.refresh_s if live_on else None


def starting_message(live: LiveRuns, run_id: str) -> str | None:
    """A friendly note when ``run_id`` has logged no update yet (else ``None``)."""
    info = live.run_info(run_id)
    if info is None:
        return f"Run {run_id} is not in {live.log_dir} any more."
    if info.updates == 0:
        return (
            f"Run {run_id} has started ({info.status}) but has not logged an update yet; "
            "its curves appear here by themselves."
        )
    return None
