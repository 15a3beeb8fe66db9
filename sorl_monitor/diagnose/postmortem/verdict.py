"""The verdict on one run (``Verdict``): its status, collapse and fall steps, lead time, root cause and remedy."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

STATUSES = ("healthy", "collapsed", "collapsing", "diverging")
"""What a verdict's ``status`` can be (docs/detectors.md; ``sorl postmortem`` exits 0, 3, 4, 5 on them)."""


@dataclass
class Verdict:
    """The post-mortem of one run (``to_dict()`` for JSON; docs/detectors.md lists the fields).

    ``status``: ``healthy``, ``collapsed`` (the label confirmed), ``collapsing`` (the log ends in a fall, not yet
    confirmed: ``end_signs`` say why) or ``diverging`` (the log ends with several families above their quiet
    levels, ``diverging_score``, the reward still up). ``collapse_step``: where a confirmed collapse's fall
    started (``confirmed_step``: where the label was confirmed); ``fall_step``: the same for a collapsing log.
    ``lead_time`` = the fall's start − ``streak_first_critical``, the first critical alert after the last dip the
    run recovered from. ``root_cause``/``explanation``/``remedy`` are ``None`` for a healthy or diverging run;
    ``inputs`` maps each detector family to the columns the run logs for it, ``not_evaluated`` lists the
    detectors it has no inputs for."""

    run_id: str
    algorithm: str | None
    updates: int
    last_step: int | None
    status: str
    collapse_step: int | None
    collapse_reason: str | None
    ends_collapsed: bool
    first_warning: int | None
    first_critical: int | None
    lead_time: int | None
    root_cause: str | None
    explanation: str | None
    remedy: str | None
    evidence: dict[str, Any]
    notes: list[str] = field(default_factory=list)
    inputs: dict[str, list[str]] = field(default_factory=dict)
    not_evaluated: list[str] = field(default_factory=list)
    top_alerts: list[dict[str, Any]] = field(default_factory=list)
    confirmed_step: int | None = None
    fall_step: int | None = None
    streak_first_critical: int | None = None
    judged_by: dict[str, Any] | None = None
    """For another tool's log: the column the run is judged by (``column``), ``why``, the ``optimized`` reward
    beside a task score, the ``others`` that might have been (``logs.judged``); ``None`` for the monitor's runs."""
    warned_by: dict[str, Any] | None = None
    """The alert the lead time counts from (``streak_first_critical``): ``detector``, ``step``, ``message``. The
    CLI, the dashboard and ``sorl demo`` all tell this one story."""
    last_critical_before_fall: dict[str, Any] | None = None
    """The last critical alert at or before the fall's start, in the streak or not (``detector``, ``step``,
    ``message``): what a fall with no lead was last warned by, told the same way everywhere."""
    came_back_step: int | None = None
    """For a collapse the run recovered from: the first step its reward moving average was back within
    ``peak_band`` of the peak it fell from (the status stays ``collapsed``; ``notes`` say where it ended)."""
    divergence_step: int | None = None
    diverging_score: str | None = None
    families_rising: list[str] = field(default_factory=list)
    end_signs: list[str] = field(default_factory=list)

    @property
    def collapsed(self) -> bool:
        return self.collapse_step is not None

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready values (NaN and ±Inf become ``None``)."""
        return _json_safe({**dataclasses.asdict(self), "collapsed": self.collapsed})


def _json_safe(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    return value
