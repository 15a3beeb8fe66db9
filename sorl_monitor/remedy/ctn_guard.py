"""The CTN guard: turns Clipping-Triggered Normalization on when a detector trips, off after a quiet spell.

A trainer in ``ctn=auto`` mode calls ``update`` after each optimiser update with the monitor's recent
window and applies (and logs) any switch it returns:

    guard = CtnGuard()
    ...
    decision = guard.update(mon.recent_steps())
    if decision is not None:
        ctn_active = decision.ctn_on
        mon.log_alert(**decision.alert_fields())        # an ``alerts`` row of kind "action"

The guard runs the same detector SQL as the post-mortem (``sorl_monitor.diagnose.detectors``) over the
in-memory window, so what switched CTN on is exactly what ``sorl postmortem`` reports. Hysteresis:
CTN goes on at the first update where a ``trip_on`` detector fires at ``min_severity`` or above, and
off once ``quiet_updates`` updates have passed with none of them firing. ``start_active`` begins with
CTN on, as if a detector had fired just before the first update.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from sorl_monitor.diagnose.detectors.catalogue import get_detectors
from sorl_monitor.diagnose.detectors.config import DetectorConfig
from sorl_monitor.diagnose.detectors.runner import FIRED_COLUMNS, ArrowDetector
from sorl_monitor.remedy.ctn_guard_screen import GuardScreen

DEFAULT_TRIP_ON = ("clip_rise", "turn_clip_rise", "kl_rise", "ratio_tail_rise")
"""Detectors of importance-ratio drift (the ``ratio`` and behaviour-KL signals): what CTN (λ · clip fraction ·
KL) counteracts."""


@dataclass(frozen=True)
class GuardDecision:
    """A CTN switch: on (a detector tripped) or off (quiet for ``quiet_updates``), with its reason."""

    ctn_on: bool
    step: int
    detector: str
    severity: str
    value: float
    threshold: float
    reason: str

    def alert_fields(self) -> dict[str, Any]:
        """Keyword arguments for ``Monitor.log_alert``: an ``action`` row named ``ctn_on`` / ``ctn_off``."""
        return {
            "detector": "ctn_on" if self.ctn_on else "ctn_off",
            "severity": "info",
            "message": self.reason,
            "value": self.value,
            "threshold": self.threshold,
            "step": self.step,
            "kind": "action",
        }


ARMED = GuardDecision(
    True, 0, "ctn_auto_start", "info", 1.0, 1.0, "CTN on from the first update (ctn_auto_start = on)"
)
"""The switch an armed guard (``ctn_auto_start = on``) records at the first update: CTN on from the start."""


class CtnGuard:
    """Hysteresis switch for CTN driven by the live detectors (see module docstring).

    Args:
        config: detector thresholds (the same ``DetectorConfig`` the post-mortem uses).
        trip_on: detectors whose firing turns CTN on.
        quiet_updates: updates without any ``trip_on`` firing before CTN goes off again (the bundled
            trainer passes its ``ctn_quiet_updates``, 1024: in its failing runs at 256 each switch-off was
            followed by a clip spike).
        min_severity: ``"warning"`` (default: act early) or ``"critical"``.
        start_active: begin with CTN on (armed), as if a detector had fired just before the first update,
            so it goes off only after ``quiet_updates`` updates without a firing.
        screen: skip the detector SQL on a call where ``ctn_guard_screen`` shows every trip detector clearly
            below its warning level (the same decisions; False runs the SQL on every call).
    """

    def __init__(
        self,
        config: DetectorConfig | None = None,
        trip_on: tuple[str, ...] = DEFAULT_TRIP_ON,
        quiet_updates: int = 256,
        min_severity: str = "warning",
        start_active: bool = False,
        screen: bool = True,
    ) -> None:
        if quiet_updates < 1:
            raise ValueError(f"quiet_updates must be at least 1, not {quiet_updates}")
        if min_severity not in ("warning", "critical"):
            raise ValueError(f"min_severity must be 'warning' or 'critical', not {min_severity!r}")
        self.config = config or DetectorConfig()
        self.trip_on = tuple(trip_on)
        self.quiet_updates = quiet_updates
        self.min_severity = min_severity
        self._detector = ArrowDetector(self.config, get_detectors(self.trip_on), optimize=False)
        self._screen = GuardScreen(self.config, self.trip_on) if screen else None
        self.active = start_active
        self._last_seen: int | None = None
        self._last_fired: int | None = -1 if start_active else None  # armed: "fired" before step 0

    def update(self, recent_steps: pa.Table) -> GuardDecision | None:
        """Look at the updates logged since the last call; return a switch, or ``None`` if CTN stays as is."""
        if recent_steps.num_rows == 0 or "step" not in recent_steps.column_names:
            return None
        last_step = pc.max(recent_steps.column("step")).as_py()
        if last_step is None or (self._last_seen is not None and last_step <= self._last_seen):
            return None
        if self._screen is not None and self._screen.quiet(recent_steps, self._last_seen):
            fired = FIRED_COLUMNS.empty_table()  # no trip detector can fire: the SQL would return no row
        else:
            fired = self._detector(recent_steps, after_step=self._last_seen)
        self._last_seen = last_step
        if self.min_severity == "critical":
            fired = fired.filter(pc.equal(fired.column("severity"), "critical"))
        if fired.num_rows:
            self._last_fired = pc.max(fired.column("step")).as_py()
            if not self.active:
                self.active = True
                return _switch_on(fired)
            return None
        if (
            self.active
            and self._last_fired is not None
            and last_step - self._last_fired >= self.quiet_updates
        ):
            self.active = False
            return GuardDecision(
                ctn_on=False,
                step=last_step,
                detector=",".join(self.trip_on),
                severity="info",
                value=float(last_step - self._last_fired),
                threshold=float(self.quiet_updates),
                reason=f"CTN off: no {'/'.join(self.trip_on)} alert for {last_step - self._last_fired} updates",
            )
        return None

    def close(self) -> None:
        self._detector.close()


def _switch_on(fired: pa.Table) -> GuardDecision:
    """The decision naming the first firing (the most severe one at that step)."""
    rows = fired.to_pylist()
    first_step = min(row["step"] for row in rows)
    at_first = [row for row in rows if row["step"] == first_step]
    row = max(at_first, key=lambda r: (r["severity"] == "critical", r["value"] / max(r["threshold"], 1e-12)))
    return GuardDecision(
        ctn_on=True,
        step=row["step"],
        detector=row["detector"],
        severity=row["severity"],
        value=row["value"],
        threshold=row["threshold"],
        reason=f"CTN on: {row['detector']} ({row['severity']}): {row['message']}",
    )


def guard_for(
    ctn: str, detectors: DetectorConfig | None, quiet_updates: int, auto_start: str
) -> CtnGuard | None:
    """The guard of a trainer in ``ctn`` mode (``ctn.CTN_MODES``): one for ``auto``, on from the first update when
    ``auto_start`` is ``on``; none for ``on`` and ``off``."""
    if ctn != "auto":
        return None
    return CtnGuard(detectors, quiet_updates=quiet_updates, start_active=auto_start == "on")
