"""Collapse-precursor detectors: one named SQL definition each, run offline and live alike (docs/detectors.md).

Each ``Detector`` computes one number per logged step (``value``) with DuckDB window functions over
the ``steps`` rows of a run; an alert is raised where ``value > <name>_warning`` (severity
``warning``) or ``value > <name>_critical`` (severity ``critical``). The same SQL runs

* offline over a ``RunSet`` (the Parquet files of finished or live runs, or a foreign trainer's log), and
* live over an in-memory Arrow table of recent ``steps`` rows (``Monitor.recent_steps()``), which
  DuckDB reads without a copy — what the trainer's CTN guard (``sorl_monitor.remedy.ctn_guard``) does,

so a guard and a post-mortem never disagree.

Time is counted in optimizer steps, not rows: every window is a ``RANGE`` over ``step``, so a run
logged every step and the same run logged every 5 steps see the same windows, and gaps are gaps.
Each signal is judged against the run's own history, never against a fixed scale: a *fold*
detector divides the signal's smoothed level by its quiet level (its running low over the previous
``history_steps`` steps), floored at a small value in the signal's natural unit (the KL at the
trust-region edge, a share of tokens), so a toy at clip fraction 0.15 and a 7B run at 0.003 are
judged alike. A window looks back at most ``DetectorConfig.lookback_steps`` steps and never
forward: an alert at step ``s`` depends only on rows ``≤ s``.

    alerts = detect(open_runs("runs/"), DetectorConfig(kl_rise_critical=20))
    # run_id, step, detector, severity, value, threshold, message  (one row per firing)

Thresholds live in ``DetectorConfig`` (``load_config`` reads a TOML file, ``--set name=value``
overrides; the post-mortem's own settings are ``postmortem.PostmortemConfig``). The critical thresholds of
the fold detectors are the ones ``experiments/detector_eval.py`` fits on the bundled trainer's corpus (scored
leave-one-setting-out); see docs/detectors.md.
"""

from __future__ import annotations

from sorl_monitor.diagnose.detectors.catalogue import (
    DETECTOR_NAMES,
    DETECTORS,
    FAMILY_NAMES,
    Detector,
    get_detectors,
)
from sorl_monitor.diagnose.detectors.config import DetectorConfig, config_from_mapping, load_config
from sorl_monitor.diagnose.detectors.runner import FIRED_COLUMNS, ArrowDetector, detect

__all__ = [
    "DETECTORS",
    "DETECTOR_NAMES",
    "FAMILY_NAMES",
    "FIRED_COLUMNS",
    "ArrowDetector",
    "Detector",
    "DetectorConfig",
    "config_from_mapping",
    "detect",
    "get_detectors",
    "load_config",
]
