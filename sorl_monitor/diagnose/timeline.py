"""A run's events on its step axis: alert onsets, CTN-on spans, the collapse step.

Used by the figures (dashboard and HTML report) and by ``sorl watch``. An *onset* is the first alert
of a streak of one detector, and each escalation to critical (``notify.OnsetFilter``, which the webhook
posts with too); here a streak runs over consecutive logged blocks of ``DetectorConfig.smooth_steps``
steps: a detector firing for 300 blocks is one mark, not 300.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from sorl_monitor.diagnose.detectors.catalogue import DETECTOR_FAMILY, FAMILY_NAMES
from sorl_monitor.notify import OnsetFilter

FAMILY_ORDER = (*FAMILY_NAMES, "other")
"""Families in the detectors' order (the order the figures list them in)."""


def family_of(detector: str) -> str:
    """The detector's family (``Detector.family``); an alert a trainer logged under another name is ``other``."""
    return DETECTOR_FAMILY.get(detector, "other")


@dataclass
class Timeline:
    """What happened to one run, by step."""

    onsets: list[dict[str, Any]] = field(default_factory=list)
    """``step, detector, family, severity, message`` of each onset, by step."""
    ctn_spans: list[tuple[int, int]] = field(default_factory=list)
    """Step ranges with CTN on."""
    collapse_step: int | None = None


@dataclass
class RunCurves:
    """What the overview draws of one run: its step rows (``step_rows.step_rows``) and its timeline."""

    run_id: str
    steps: pa.Table
    timeline: Timeline = field(default_factory=Timeline)


def alert_onsets(
    alerts: Iterable[dict[str, Any]], steps: Sequence[int], block_steps: int = 1
) -> list[dict[str, Any]]:
    """The onsets (``notify.OnsetFilter``) of ``alerts``, rows with ``step, detector, severity`` (and
    ``message``), each with its ``family``, the ``count`` of alerts from it to the end of its streak (or to
    the detector's next onset, an escalation) and the streak's ``last`` step.

    A streak runs over consecutive logged blocks of ``block_steps`` steps (``steps``: the run's logged steps):
    the filter sees each alert at its block's position among them, with a gap of one (a block nothing was
    logged in counts as the next logged one).
    """
    blocks = sorted({step // block_steps for step in steps})
    streaks = OnsetFilter(gap_steps=1)
    onsets: list[dict[str, Any]] = []
    current: dict[str, dict[str, Any]] = {}
    started: dict[str, list[dict[str, Any]]] = {}
    for row in sorted(alerts, key=lambda r: (r["step"], r["detector"])):
        detector = row["detector"]
        position = bisect.bisect_left(blocks, row["step"] // block_steps)
        fresh = detector not in current or position - current[detector]["position"] > 1
        if streaks.is_onset(detector, position, row["severity"]):
            onset = {**row, "family": family_of(detector), "count": 0, "last": row["step"]}
            onsets.append(onset)
            if fresh:
                started[detector] = []
            started[detector].append(onset)
            current[detector] = {"onset": onset, "position": position}
        current[detector]["position"] = position
        current[detector]["onset"]["count"] += 1
        for onset in started[detector]:
            onset["last"] = row["step"]
    return onsets


def ctn_spans(
    steps: Sequence[int], active: Sequence[bool | None], actions: Iterable[tuple[int, str]]
) -> list[tuple[int, int]]:
    """Step ranges with CTN on: from the ``ctn_active`` column when logged, else from the guard's
    ``ctn_on`` / ``ctn_off`` actions; a span still open ends at the last step."""
    switches = (
        [
            (step, "ctn_on" if on else "ctn_off")
            for step, on in zip(steps, active, strict=True)
            if on is not None
        ]
        if any(on is not None for on in active)
        else list(actions)
    )
    spans: list[tuple[int, int]] = []
    start = None
    for step, name in switches:
        if name == "ctn_on" and start is None:
            start = step
        elif name == "ctn_off" and start is not None:
            spans.append((start, step))
            start = None
    if start is not None and steps:
        spans.append((start, steps[-1]))
    return spans
