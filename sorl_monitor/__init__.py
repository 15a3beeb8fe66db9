"""sorl-monitor: see RL fine-tuning of LLM agents collapse coming, explain why, and stop it.

Public API (imported on first use, so reading runs never imports torch):
- ``Monitor``: attach to a trainer, stream per-update and per-turn metrics to Parquet (``WriterConfig``: how);
- ``open_runs``: DuckDB views ``runs, steps, turns, modules, alerts`` over written runs;
- ``detect``, ``DetectorConfig``, ``CtnGuard``, ``postmortem``, ``PostmortemConfig``: collapse precursors,
  the live CTN guard, and the root-cause post-mortem;
- ``sorl_monitor.metrics``: the metric definitions, pure torch functions.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "Monitor": "sorl_monitor.monitor",
    "MonitorWarning": "sorl_monitor.monitor",
    "WriterConfig": "sorl_monitor.writer",
    "open_runs": "sorl_monitor.query",
    "QueryError": "sorl_monitor.query",
    "detect": "sorl_monitor.detectors",
    "DetectorConfig": "sorl_monitor.detectors",
    "CtnGuard": "sorl_monitor.guard",
    "postmortem": "sorl_monitor.postmortem",
    "PostmortemConfig": "sorl_monitor.postmortem",
    "Verdict": "sorl_monitor.postmortem",
}
__all__ = [*_EXPORTS, "__version__"]


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'sorl_monitor' has no attribute {name!r}")
