"""What ``sorl dashboard`` passes to the app, through the environment (no Streamlit here: the CLI imports it)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from sorl_monitor.storage import is_remote, parse_storage_options, set_default_storage_options

LOG_DIR_ENV = "SORL_DASHBOARD_LOG_DIR"
REFRESH_ENV = "SORL_DASHBOARD_REFRESH_S"
CONFIG_ENV = "SORL_DASHBOARD_DETECTOR_CONFIG"
"""A TOML file of detector settings (``sorl dashboard --config``)."""
OVERRIDES_ENV = "SORL_DASHBOARD_DETECTOR_SET"
"""Detector overrides, one ``name=value`` a line (``sorl dashboard --set``)."""
FORMAT_ENV = "SORL_DASHBOARD_LOG_FORMAT"
"""The log format ``sorl dashboard --format`` forces (``sorl_monitor.logs.FORMATS``); detected when unset."""
LOG_MAP_ENV = "SORL_DASHBOARD_LOG_MAP"
"""``sorl dashboard --map`` items, one ``column=name`` a line (``sorl_monitor.logs.options``)."""
LOGGING_STEPS_ENV = "SORL_DASHBOARD_LOGGING_STEPS"
"""``sorl dashboard --logging-steps`` (Hugging Face console logs)."""
SQL_TIMEOUT_ENV = "SORL_DASHBOARD_SQL_TIMEOUT_S"
"""Seconds a statement of the SQL tab may run (``sorl dashboard --sql-timeout``)."""
VERDICTS_ENV = "SORL_DASHBOARD_VERDICTS"
"""The fleet's verdict table when it is not at the log folder's root (``sorl dashboard --verdicts``)."""
STORAGE_OPTIONS_ENV = "SORL_DASHBOARD_STORAGE_OPTIONS"
"""``sorl --storage-option`` items, one ``key=value`` a line (an ``s3://`` log folder or table)."""
DEFAULT_REFRESH_S = 0.5
DEFAULT_SQL_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class Settings:
    """What ``sorl dashboard`` passes to the app (through the environment)."""

    log_dir: Path | str | None
    """The log folder; an object-store URI (``s3://bucket/runs``) stays text."""
    refresh_s: float
    detector_config: str | None = None
    detector_overrides: tuple[str, ...] = ()
    log_format: str | None = None
    sql_timeout_s: float = DEFAULT_SQL_TIMEOUT_S
    log_map: tuple[str, ...] = ()
    logging_steps: int | None = None
    verdicts: str | None = None
    """The verdict table's file or URI given with ``--verdicts`` (else the log folder's own, if any)."""


def settings() -> Settings:
    """Settings from the ``SORL_DASHBOARD_*`` variables ``sorl dashboard`` sets (refresh at least 0.25 s);
    the storage options become this process's defaults (``storage.set_default_storage_options``)."""
    raw = os.environ.get(LOG_DIR_ENV)
    storage = [line for line in os.environ.get(STORAGE_OPTIONS_ENV, "").splitlines() if line.strip()]
    if storage:
        set_default_storage_options(parse_storage_options(storage))
    refresh = _number(REFRESH_ENV, DEFAULT_REFRESH_S)
    overrides = tuple(line for line in os.environ.get(OVERRIDES_ENV, "").splitlines() if line.strip())
    return Settings(
        (raw if is_remote(raw) else Path(raw)) if raw else None,
        max(0.25, refresh),
        os.environ.get(CONFIG_ENV) or None,
        overrides,
        os.environ.get(FORMAT_ENV) or None,
        max(0.1, _number(SQL_TIMEOUT_ENV, DEFAULT_SQL_TIMEOUT_S)),
        tuple(line for line in os.environ.get(LOG_MAP_ENV, "").splitlines() if line.strip()),
        int(steps) if (steps := os.environ.get(LOGGING_STEPS_ENV, "")).isdigit() else None,
        os.environ.get(VERDICTS_ENV) or None,
    )


def _number(name: str, default: float) -> float:
    try:
        return float(os.environ.get(name, default))
    except ValueError:
        return default
