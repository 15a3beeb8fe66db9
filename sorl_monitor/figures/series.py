"""Arrays for drawing: columns as floats, spike-keeping downsampling, smoothing in steps, log-axis ranges.

Downsampling keeps each bucket's minimum and maximum (``minmax_indices``), so a one-step spike stays
drawn however long the run (TensorBoard's default reservoir keeps 1,000 random points per tag, where
spikes vanish).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pyarrow as pa

from sorl_monitor.read.step_rows import column_values

X_AXES = {"step": "step", "iteration": "iteration", "wall time": "wall_time"}
"""The x axes a figure can draw over: label → ``steps`` column."""


def minmax_indices(values: np.ndarray, max_points: int) -> np.ndarray:
    """Indices of the points to draw: the first and the last finite point, and the minimum and the maximum of
    each of ``(max_points - 2) // 2`` buckets.

    Buckets are consecutive runs of points; NaN points are never chosen. All indices are kept when
    ``n ≤ max_points``. Sorted, so the line visits each bucket's extremes in order: a single-point spike
    survives, and a live run's curve always reaches its latest step.
    """
    values = np.asarray(values, dtype=np.float64)
    n = len(values)
    if max_points < 4:
        raise ValueError(f"max_points must be at least 4, not {max_points}")
    if n <= max_points:
        return np.arange(n)
    buckets = (max_points - 2) // 2
    size = math.ceil(n / buckets)
    padded = np.full(buckets * size, np.nan)
    padded[:n] = values
    grid = padded.reshape(buckets, size)
    missing = np.isnan(grid)
    starts = np.arange(buckets) * size
    lows = starts + np.argmin(np.where(missing, np.inf, grid), axis=1)
    highs = starts + np.argmax(np.where(missing, -np.inf, grid), axis=1)
    finite = np.flatnonzero(~np.isnan(values))
    ends = finite[[0, -1]] if len(finite) else np.array([], np.int64)
    keep = np.unique(np.concatenate([lows, highs, ends]))
    keep = keep[keep < n]
    return keep[~np.isnan(values[keep])]


def downsample(x: np.ndarray, y: np.ndarray, max_points: int) -> tuple[np.ndarray, np.ndarray]:
    """``(x, y)`` reduced to at most ``max_points`` points by ``minmax_indices``."""
    keep = minmax_indices(y, max_points)
    return np.asarray(x)[keep], np.asarray(y, dtype=np.float64)[keep]


def smooth(steps: np.ndarray, values: np.ndarray, window_steps: int) -> np.ndarray:
    """Trailing mean over the previous ``window_steps`` steps (``(step − w, step]``, as the detectors'
    windows), NaN ignored; ``window_steps ≤ 1`` leaves the values as they are."""
    if window_steps <= 1 or len(values) == 0:
        return values
    finite = np.isfinite(values)
    sums = np.concatenate([[0.0], np.cumsum(np.where(finite, values, 0.0))])
    counts = np.concatenate([[0], np.cumsum(finite)])
    end = np.arange(1, len(values) + 1)
    start = np.searchsorted(steps, steps - window_steps, side="right")
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = (sums[end] - sums[start]) / (counts[end] - counts[start])
    return np.where(finite, mean, np.nan)


LOG_TICKS = ((1, 1.2, 1.5, 2, 3, 5, 7), (1, 2, 5), (1,))
"""Tick values of a log axis per power of ten, finest first: the finest that gives few enough ticks is used."""


def log_axis(values: list[np.ndarray], max_ticks: int = 4) -> dict[str, Any]:
    """A log y axis for ``values``: its range spans the spikes but not values near 0 (an on-policy first
    update's KL of 1e-15 would stretch it over 20 decades), with at most ``max_ticks`` labelled ticks so labels
    never overlap: round values (``LOG_TICKS`` times a power of ten) on a short range, powers of ten on a long one."""
    positive = np.concatenate([v[np.isfinite(v) & (v > 0)] for v in values] or [np.array([])])
    axis: dict[str, Any] = {"type": "log"}
    if len(positive) == 0:
        return axis
    low = max(float(np.percentile(positive, 1)), float(np.median(positive)) * 1e-4)
    high = float(positive.max())
    span = max(math.log10(high) - math.log10(low), 0.3)
    bottom, top = math.log10(low) - 0.08 * span, math.log10(high) + 0.08 * span
    ticks: list[float] = []
    for multiples in LOG_TICKS:
        ticks = [m * 10.0**k for k in range(math.floor(bottom), math.ceil(top) + 1) for m in multiples]
        ticks = [t for t in ticks if bottom <= math.log10(t) <= top]
        if len(ticks) <= max_ticks:
            break
    ticks = ticks[:: math.ceil(len(ticks) / max_ticks)] if ticks else ticks
    axis.update(range=[bottom, top], tickvals=ticks, ticktext=[tick_text(t) for t in ticks])
    return axis


def tick_text(value: float) -> str:
    """``0.02``, ``150``, ``5e-05`` → ``5e-5``, ``1e+06`` → ``1e6``: short, never ``1e+06``."""
    text = f"{value:.3g}"
    if "e" not in text:
        return text
    mantissa, exponent = text.split("e")
    return f"{mantissa}e{int(exponent)}"


def elapsed_unit(seconds: float) -> tuple[str, float]:
    """The unit to show elapsed wall time in (``s``, ``min`` or ``h``) and its length in seconds."""
    if seconds < 180:
        return "s", 1.0
    if seconds < 3 * 3600:
        return "min", 60.0
    return "h", 3600.0


class XAxis:
    """The x value of each step of each run: the step, the iteration, or the wall time since the run began
    (``X_AXES``); a run that did not log the chosen column is drawn over its steps."""

    def __init__(self, steps: dict[str, pa.Table], mode: str) -> None:
        """``steps``: each run's step rows, by run id."""
        if mode not in X_AXES:
            raise ValueError(f"unknown x axis {mode!r}: one of {', '.join(X_AXES)}")
        self.mode, self.scale, self.title = mode, 1.0, mode
        self._steps = {run_id: column_values(table, "step") for run_id, table in steps.items()}
        self._x = {run_id: column_values(table, X_AXES[mode]) for run_id, table in steps.items()}
        if mode == "wall time":
            spans = [np.nanmax(x) - np.nanmin(x) for x in self._x.values() if np.isfinite(x).any()]
            unit, self.scale = elapsed_unit(max(spans, default=0.0))
            self.title = f"time since start ({unit})"

    def values(self, run_id: str) -> np.ndarray:
        """The run's x value of each of its step rows."""
        x = self._x[run_id]
        if not np.isfinite(x).all():
            return self._steps[run_id]
        return (x - x.min()) / self.scale if self.mode == "wall time" else x

    def at(self, run_id: str, steps: Any) -> np.ndarray:
        """The x values of ``steps`` of the run (interpolated between its logged steps)."""
        logged = self._steps[run_id]
        steps = np.asarray(steps, dtype=np.float64)
        return steps if len(logged) == 0 else np.interp(steps, logged, self.values(run_id))
