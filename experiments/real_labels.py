"""Label a real run from its curve (experiments/real_logs/LABEL_RULE.md, step 2 and 3), independent of the
project's own verdicts: a trailing moving average over ``max(3, round(n/20))`` rows, shifted by the metric's
lower bound (or its lowest moving-average value), is *collapsed* when after the first 10 % of rows it falls
below 0.5 × its running peak and never comes back to 0.7 ×.

    label_curve(steps, values, lo=None)  → CurveLabel(label, fall_start, alarm_by, crossed_at)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

FALL = 0.5
BACK = 0.7
AT_PEAK = 0.9
BURN_IN = 0.1
MIN_ROWS = 10


@dataclass(frozen=True)
class CurveLabel:
    label: str
    """``collapsed`` | ``healthy`` | ``unlabelled`` (fewer than ``MIN_ROWS`` finite rows)."""
    fall_start: int | None = None
    alarm_by: int | None = None
    crossed_at: int | None = None
    """The step where the shifted moving average first fell below ``FALL`` × its running peak for good."""


def moving_average(values: Sequence[float]) -> list[float]:
    window = max(3, round(len(values) / 20))
    out, total = [], 0.0
    for i, value in enumerate(values):
        total += value
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def label_curve(steps: Sequence[int], values: Sequence[float | None], lo: float | None = None) -> CurveLabel:
    """Step 2 and 3 of the rule on one segment's (step, value) rows; ``lo``: the metric's known lower bound."""
    rows = [(s, v) for s, v in zip(steps, values, strict=True) if v is not None and math.isfinite(v)]
    if len(rows) < MIN_ROWS:
        return CurveLabel("unlabelled")
    at = [s for s, _ in rows]
    ma = moving_average([v for _, v in rows])
    base = min(ma) if lo is None else lo
    shifted = [v - base for v in ma]
    burn_in = max(1, math.ceil(BURN_IN * len(rows)))
    peak, crossed, last_at_peak, fall_start = -math.inf, None, None, None
    for i, value in enumerate(shifted):
        peak = max(peak, value)
        if value >= AT_PEAK * peak:
            last_at_peak = i
        if i < burn_in or peak <= 0:
            continue
        if crossed is None and value < FALL * peak:
            crossed, fall_start = i, last_at_peak
        elif crossed is not None and value >= BACK * peak:
            crossed, fall_start = None, None  # came back: the fall did not hold
    if crossed is None:
        return CurveLabel("healthy")
    start = fall_start if fall_start is not None else crossed
    alarm = min(start + 2, len(rows) - 1)
    return CurveLabel("collapsed", fall_start=at[start], alarm_by=at[alarm], crossed_at=at[crossed])
