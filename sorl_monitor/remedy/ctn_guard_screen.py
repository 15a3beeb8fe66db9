"""The CTN guard's screen: rules out, in numpy, a call where no trip detector can fire, before any SQL runs.

    screen = GuardScreen(config, ("clip_rise", "turn_clip_rise", "kl_rise", "ratio_tail_rise"))
    if screen.quiet(window, after_step):      # every new block clearly below its warning level
        ...                                   # nothing fired: the detector SQL is not run
    else:
        fired = ArrowDetector(...)(window, after_step=after_step)   # the definition decides

The SQL in ``detectors`` stays the one definition of every alert: the screen only answers "quiet" when each of
its detectors' values on the blocks after ``after_step`` is below ``(1 − MARGIN) ×`` its warning level, and
hands every other call (a value near or above it, a non-finite value, several runs or ranks in the window,
negative steps, a detector it does not know) to the SQL. It evaluates the fold detectors as ``detectors``
writes them: per block (``DetectorConfig.block_start``), the mean of the signal over the block's rows; its
quiet level, the lowest block mean over the ``history_steps`` steps before (the block itself excluded); and

    value = mean ÷ max(quiet level, floor)     (before the history is known: ÷ floor, or none)

``SQL_CHECKED`` fingerprints the SQL this was checked against (tests/detectors/test_guard_screen.py compares the
two on real runs); when the detectors' SQL changes, the screen turns itself off until it is checked again.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from sorl_monitor.diagnose.detectors.assembly import DETECT_SQL
from sorl_monitor.diagnose.detectors.blocks import (
    HISTORY_BLOCKS,
    HISTORY_WINDOW,
    KNOWN,
    REUSE_COLUMNS,
    REUSED,
    block_start_sql,
)
from sorl_monitor.diagnose.detectors.catalogue import get_detectors
from sorl_monitor.diagnose.detectors.config import DetectorConfig
from sorl_monitor.diagnose.detectors.signals import SIGNALS

MARGIN = 1e-9
"""Relative distance below a warning level within which the screen leaves the call to the SQL (the two
compute a block mean in a different order: they agree to about 1e-15)."""


@dataclass(frozen=True)
class FoldSpec:
    """A fold detector as the screen evaluates it: its signal, its floor (a setting's name or a number), and
    whether a run too young for a quiet level is judged against the floor alone."""

    signal: str
    floor: str | float
    before_history: bool


FOLDS = {
    "clip_rise": FoldSpec("clip", "clip_floor", True),
    "turn_clip_rise": FoldSpec("turn_clip", "clip_floor", True),
    "kl_rise": FoldSpec("kl_to_old", "kl_floor", True),
    "ratio_tail_rise": FoldSpec("ratio_tail", 0.1823, False),
}
"""The detectors the screen knows (the CTN guard's default trip detectors)."""


def sql_fingerprint(names: Sequence[str]) -> str:
    """A hash of the SQL that defines ``names`` (their values, signals, blocks, history, the query template)."""
    detectors = get_detectors(names)
    parts = [DETECT_SQL, HISTORY_BLOCKS, HISTORY_WINDOW, KNOWN, REUSED, block_start_sql("step")]
    parts += [f"{d.name}:{d.value}" for d in detectors]
    parts += [f"{s}:{SIGNALS[s].expression}" for d in detectors for s in d.signals]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


SQL_CHECKED = "c913918819487725"
"""``sql_fingerprint(FOLDS)`` of the SQL the screen was last checked against."""


def _column(table: pa.Table, name: str) -> tuple[np.ndarray, np.ndarray]:
    """A column as float64 values and a mask of the non-null ones (a missing column: all null)."""
    if name not in table.column_names:
        return np.full(table.num_rows, np.nan), np.zeros(table.num_rows, bool)
    column = table.column(name).combine_chunks()
    if column.null_count == column.__len__():
        return np.full(table.num_rows, np.nan), np.zeros(table.num_rows, bool)
    values = np.asarray(column.to_numpy(zero_copy_only=False), float)  # a null reads as NaN
    if column.null_count == 0:
        return values, np.ones(table.num_rows, bool)
    return values, np.asarray(column.is_valid().to_numpy(zero_copy_only=False), bool)


class _Columns:
    """A window's columns as numpy arrays, each converted once, cut to the rows ``keep`` selects."""

    def __init__(self, table: pa.Table, keep: np.ndarray | None = None) -> None:
        self.table, self.keep, self._read = table, keep, {}

    def __call__(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        if name not in self._read:
            values, valid = _column(self.table, name)
            self._read[name] = (values, valid) if self.keep is None else (values[self.keep], valid[self.keep])
        return self._read[name]


def _coalesce(*columns: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    values, valid = columns[0][0].copy(), columns[0][1].copy()
    for other, other_valid in columns[1:]:
        take = ~valid & other_valid
        values[take], valid[take] = other[take], True
    return values, valid


def _signal(columns: _Columns, name: str) -> tuple[np.ndarray, np.ndarray]:
    """``SIGNALS[name]`` per row: values and a mask of the non-null ones."""
    if name == "clip":
        values, valid = _coalesce(columns("clip_frac"), columns("clip_frac_active"))
    elif name == "turn_clip":
        values, valid = columns("clip_frac_turn")
    elif name == "kl_to_old":
        k1, k1_valid = columns("kl_old_k1")
        values, valid = _coalesce(
            columns("kl_old_k3"),
            columns("kl_old_k2"),
            columns("kl_old"),
            (np.abs(k1), k1_valid),
        )
        valid &= values != 0
    elif name == "ratio_tail":  # ln(greatest(ratio_p99, 1)): greatest skips a null, and NaN is the largest
        p99, p99_valid = columns("ratio_p99")
        highest = np.where(p99_valid, np.where(np.isnan(p99), np.nan, np.maximum(p99, 1.0)), 1.0)
        values, valid = (
            np.array([math.log(x) if x == x else x for x in highest.tolist()]),
            np.ones(len(p99), bool),
        )
    else:
        raise KeyError(name)
    return values, valid & np.isfinite(values)


class GuardScreen:
    """Whether a guard call is clearly quiet (see module docstring)."""

    def __init__(self, config: DetectorConfig, names: Sequence[str]) -> None:
        self.config = config
        self.names = tuple(names)
        known = set(self.names) <= set(FOLDS)
        self.active = known and sql_fingerprint(self.names) == SQL_CHECKED
        """False: every call goes to the SQL (a detector the screen does not know, or changed SQL)."""

    def values(
        self, window: pa.Table, after_step: int | None
    ) -> dict[str, list[tuple[int, float | None]]] | None:
        """Per detector, ``(step, value)`` of each block whose last step is after ``after_step``, as the SQL
        computes them; ``None`` where the screen leaves the window to the SQL (several runs or ranks, a step
        below 0)."""
        if window.num_rows == 0 or "step" not in window.column_names:
            return {name: [] for name in self.names}
        for key in ("run_id", "rank"):
            if key in window.column_names and len(window.column(key).unique()) > 1:
                return None
        steps = np.asarray(window.column("step").cast(pa.int64()).to_numpy(zero_copy_only=False))
        if steps.min() < 0:
            return None
        config = self.config
        reused = self._reused(_Columns(window))
        blocks = self._blocks(steps, reused)
        keep = None
        if after_step is not None:
            keep = blocks > self._blocks(np.array([after_step - config.lookback_steps]), reused)[0]
            steps, blocks = steps[keep], blocks[keep]
        columns = _Columns(window, keep)
        order = np.argsort(blocks, kind="stable")
        starts, first_row = np.unique(blocks[order], return_index=True)
        last_step = np.maximum.reduceat(steps[order], first_row) if len(order) else steps[:0]
        judged = np.flatnonzero(last_step > (after_step if after_step is not None else -(2**62)))
        found: dict[str, list[tuple[int, float | None]]] = {}
        for name in self.names:
            spec = FOLDS[name]
            values, valid = _signal(columns, spec.signal)
            values, valid = values[order], valid[order]
            if len(order):
                sums = np.add.reduceat(np.where(valid, values, 0.0), first_row)
                counts = np.add.reduceat(valid.astype(np.int64), first_row)
            else:
                sums, counts = values[:0], valid[:0].astype(np.int64)
            means = np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)
            floor = float(spec.floor if isinstance(spec.floor, float) else getattr(config, spec.floor))
            found[name] = [
                (int(last_step[i]), self._fold(i, starts, last_step, means, floor, spec.before_history))
                for i in judged
            ]
        return found

    def _fold(
        self, i: int, starts: np.ndarray, last_step: np.ndarray, means: np.ndarray, floor: float, before: bool
    ) -> float | None:
        """``detectors._fold`` at block ``i``: the mean over max(its quiet level, floor), ``None`` for NULL."""
        config = self.config
        mean = means[i]
        lo = int(np.searchsorted(starts, starts[i] - config.history_steps, "left"))
        history = means[lo:i]
        known = (
            i > lo
            and i - lo >= config.min_history_blocks
            and last_step[i] - last_step[lo] >= config.min_history_steps
        )
        if math.isnan(mean) or (not known and not before):
            return None
        quiet = np.nanmin(history) if known and not np.isnan(history).all() else None
        return float(mean / (max(quiet, floor) if quiet is not None else floor))

    def _reused(self, columns: _Columns) -> bool:
        """``REUSED``: a PPO epoch or a policy lag above 0 in any row (NaN counts as above, as DuckDB orders it)."""
        for name in REUSE_COLUMNS:
            values, valid = columns(name)
            if (valid & (np.isnan(values) | (values > 0))).any():
                return True
        return False

    def _blocks(self, steps: np.ndarray, reused: bool) -> np.ndarray:
        """``DetectorConfig.block_start`` of each step (steps ≥ 0)."""
        config = self.config
        size = config.smooth_steps
        if reused:
            return size * (steps // size)
        full = config.smooth_full_step
        growing = np.maximum(steps // config.smooth_growth_steps, 1)
        grow_size = 1 << (np.floor(np.log2(growing)).astype(np.int64))
        return np.where(
            steps >= full, np.maximum(full, size * (steps // size)), grow_size * (steps // grow_size)
        )

    def quiet(self, window: pa.Table, after_step: int | None) -> bool:
        """True when no detector can fire on the blocks after ``after_step``: every value is NULL or below
        ``(1 − MARGIN) ×`` its warning level."""
        if not self.active:
            return False
        found = self.values(window, after_step)
        if found is None:
            return False
        for name, rows in found.items():
            warning = getattr(self.config, f"{name}_warning")
            for _, value in rows:
                if value is not None and not (math.isfinite(value) and value < (1 - MARGIN) * warning):
                    return False
        return True
