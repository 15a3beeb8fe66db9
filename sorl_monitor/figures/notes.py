"""One-line notes on what a run's curves show that a chart alone would hide or mislead on, each printed only
when the data shows it: exact zeros left as gaps on a log axis, a length that rose or fell across the
collapse (said as it went), a panel whose every value is the same.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa

from sorl_monitor.figures.panels import Panel
from sorl_monitor.read.step_rows import column_values

LENGTH_COLUMNS = (("completion_len_mean", "completion length"), ("response_len_mean", "response length"))
ZERO_SHARE = 0.02
"""Zeros on a log axis are noted once they are at least 2 % of a series' values (a lone gap is not seen)."""
LENGTH_CHANGE = 1.2
"""A length counts as risen (fallen) when its mean after the collapse is ≥ 1.2× (≤ 1/1.2×) the one before."""


def log_zero_notes(table: pa.Table, panels: Sequence[Panel], log_titles: set[str]) -> list[str]:
    """``grad norm (pre-clip): 24 of 40 values are exactly 0, left as gaps on the log axis`` per series of a
    log-scale panel with exact zeros in at least ``ZERO_SHARE`` of its values."""
    notes = []
    for panel in panels:
        if panel.title not in log_titles:
            continue
        for column, label in panel.series:
            values = column_values(table, column)
            finite = values[np.isfinite(values)]
            zeros = int(np.sum(finite == 0))
            if zeros and zeros >= ZERO_SHARE * len(finite):
                name = panel.title if len(panel.series) == 1 else f"{panel.title} ({label})"
                notes.append(
                    f"{name}: {zeros} of {len(finite)} values are exactly 0, left as gaps on the log axis"
                )
    return notes


def length_note(table: pa.Table, collapse_step: int | None) -> str | None:
    """How the completion (else response) length moved across the collapse: the mean over the steps before
    it (as many as follow it, at least a quarter of the log) against the mean after it; ``None`` when it moved
    less than ``LENGTH_CHANGE``, or without a collapse, a length, or steps on both sides."""
    if collapse_step is None:
        return None
    steps = column_values(table, "step")
    for column, name in LENGTH_COLUMNS:
        values = column_values(table, column)
        known = np.isfinite(values) & np.isfinite(steps)
        after = values[known & (steps > collapse_step)]
        before_all = values[known & (steps <= collapse_step)]
        if not len(after) or not len(before_all):
            continue
        before = before_all[-max(len(after), len(before_all) // 4) :]
        was, now = float(np.mean(before)), float(np.mean(after))
        if was <= 0:
            continue
        if now >= LENGTH_CHANGE * was or now <= was / LENGTH_CHANGE:
            verb = "rose" if now > was else "fell"
            return (
                f"{name} {verb} across the collapse ({was:.0f} → {now:.0f} tokens on average, before step "
                f"{collapse_step} vs after)"
            )
        return None  # it stayed near its level: nothing to say
    return None


def flat_value(values: Sequence[np.ndarray]) -> float | None:
    """The one value every finite point of ``values`` holds, or ``None`` when they differ (or there are none)."""
    finite = np.concatenate([v[np.isfinite(v)] for v in values]) if values else np.array([])
    if not len(finite) or float(finite.min()) != float(finite.max()):
        return None
    return float(finite[0])


def flat_range(value: float) -> list[float]:
    """A y range for a panel whose every value is ``value``: 0 at the bottom for a zero (fractions, counts),
    else ±10 % around it."""
    if value == 0:
        return [-0.05, 1.0]
    spread = abs(value) * 0.1
    return [value - spread, value + spread]
