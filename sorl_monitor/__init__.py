"""sorl-monitor: see RL fine-tuning of LLM agents collapse coming, explain why, and stop it.

Public API (imported on first use, so reading runs never imports torch):
- ``Monitor``: attach to a trainer, stream per-update and per-turn metrics to Parquet (``MetricsConfig``: what it
  computes, ``WriterConfig``: how it writes);
- ``open_runs`` → ``RunSet``: DuckDB views ``runs, steps, turns, modules, alerts`` over written runs;
- ``detect``, ``DetectorConfig``, ``CtnGuard``, ``postmortem``, ``PostmortemConfig``, ``Verdict``: collapse
  precursors, the live CTN guard, and the root-cause post-mortem;
- ``sorl_monitor.write.metrics``: the metric definitions, pure torch functions.

The folders: ``write/`` (the write path), ``read/`` (the read path), ``diagnose/`` (detectors, post-mortem),
``remedy/`` (the SO-PPO objective and CTN), ``logs/`` (other tools' logs), ``figures/``, ``integrations/``,
``trainer/``; docs/architecture.md draws them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sorl_monitor.diagnose.detectors import DetectorConfig, detect
    from sorl_monitor.diagnose.postmortem import PostmortemConfig, Verdict, postmortem
    from sorl_monitor.read.query import QueryError, RunSet, open_runs
    from sorl_monitor.remedy.ctn_guard import CtnGuard
    from sorl_monitor.warn import MonitorWarning
    from sorl_monitor.write.monitor import Monitor
    from sorl_monitor.write.update_metrics import MetricsConfig
    from sorl_monitor.write.writer import WriterConfig

__version__ = "0.1.0"

_EXPORTS = {
    "Monitor": "sorl_monitor.write.monitor",
    "MonitorWarning": "sorl_monitor.warn",
    "MetricsConfig": "sorl_monitor.write.update_metrics",
    "WriterConfig": "sorl_monitor.write.writer",
    "open_runs": "sorl_monitor.read.query",
    "RunSet": "sorl_monitor.read.query",
    "QueryError": "sorl_monitor.read.query",
    "detect": "sorl_monitor.diagnose.detectors",
    "DetectorConfig": "sorl_monitor.diagnose.detectors",
    "CtnGuard": "sorl_monitor.remedy.ctn_guard",
    "postmortem": "sorl_monitor.diagnose.postmortem",
    "PostmortemConfig": "sorl_monitor.diagnose.postmortem",
    "Verdict": "sorl_monitor.diagnose.postmortem",
}
__all__ = [
    "CtnGuard",
    "DetectorConfig",
    "MetricsConfig",
    "Monitor",
    "MonitorWarning",
    "PostmortemConfig",
    "QueryError",
    "RunSet",
    "Verdict",
    "WriterConfig",
    "__version__",
    "detect",
    "open_runs",
    "postmortem",
]


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'sorl_monitor' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})
