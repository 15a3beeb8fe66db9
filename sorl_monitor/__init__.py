"""sorl-monitor: see RL fine-tuning of LLM agents collapse coming, explain why, and stop it.

Public API (imported on first use, so reading runs never imports torch):
- ``Monitor``: attach to a trainer, stream per-update and per-turn metrics to Parquet (``WriterConfig``: how);
- ``open_runs``: DuckDB views ``runs, steps, turns, modules, alerts`` over written runs;
- ``detect``, ``DetectorConfig``, ``CtnGuard``, ``postmortem``, ``PostmortemConfig``: collapse precursors,
  the live CTN guard, and the root-cause post-mortem;
- ``sorl_monitor.write.metrics``: the metric definitions, pure torch functions.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "Monitor": "sorl_monitor.write.monitor",
    "MonitorWarning": "sorl_monitor.write.monitor",
    "WriterConfig": "sorl_monitor.write.writer",
    "open_runs": "sorl_monitor.read.query",
    "QueryError": "sorl_monitor.read.query",
    "detect": "sorl_monitor.diagnose.detectors",
    "DetectorConfig": "sorl_monitor.diagnose.detectors",
    "CtnGuard": "sorl_monitor.remedy.ctn_guard",
    "postmortem": "sorl_monitor.diagnose.postmortem",
    "PostmortemConfig": "sorl_monitor.diagnose.postmortem",
    "Verdict": "sorl_monitor.diagnose.postmortem",
}
__all__ = [*_EXPORTS, "__version__"]


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'sorl_monitor' has no attribute {name!r}")
