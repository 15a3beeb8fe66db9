"""The data behind the live dashboard: incremental reads of a log dir's runs, and spike-keeping downsampling.

    live = LiveRuns("runs/")          # nothing read yet; a missing or empty folder is not an error
    live.refresh()                    # re-list part files, read only the parts not read before
    live.run_infos()                  # the run picker: name, algorithm, status (live/finished/…), last step
    live.steps("run-a")               # one row per logged step, in step order (Arrow)
    live.turn_cells("run-a")          # turn-level IS ratio per (step, turn index), aggregated on read

Finished part files never change (the writer ``os.replace``s whole parts into place), so each part is
read once: ``refresh`` asks the query layer (``RunSet.refresh``) which parts exist, and reads the new
ones with DuckDB on a private connection. ``steps``, ``modules`` and ``alerts`` rows are kept in memory
(one row per update or fewer); ``turns`` rows, the big table (updates × episodes × turns), are reduced
while they are read to one row per (step, turn index) holding the sum, count, min and max of the turn
ratios ``w̄_k``, plus each part's step range so the raw turns of one step are read from the few parts
that hold it. ``steps`` of every run are read (the run picker needs them); the other tables of a run
only from the first time something asks for them (``turn_cells``, ``modules``, ``alerts``…).

Downsampling for drawing keeps each bucket's minimum and maximum (``minmax_indices``), so a one-step
spike stays visible however long the run (TensorBoard's default reservoir keeps 1,000 random points
per tag, where spikes vanish).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import math
import os
import threading
import time
import warnings
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sorl_monitor.detectors import ALERT_COLUMNS, ArrowDetector, DetectorConfig, detect_params, with_columns
from sorl_monitor.postmortem import COLLAPSE_SQL, Verdict, postmortem
from sorl_monitor.query import READ_ATTEMPTS, STALE_AFTER_S, CorruptPartWarning, QueryError, RunSet, open_runs
from sorl_monitor.report import alert_onsets, ctn_spans
from sorl_monitor.schema import SCHEMAS, conform

TURN_CELLS_SQL = """
SELECT step, turn_idx,
       count(ratio_mean) FILTER (WHERE isfinite(ratio_mean)) AS turns,
       sum(ratio_mean) FILTER (WHERE isfinite(ratio_mean)) AS ratio_sum,
       min(ratio_mean) FILTER (WHERE isfinite(ratio_mean)) AS ratio_mean_min,
       max(ratio_mean) FILTER (WHERE isfinite(ratio_mean)) AS ratio_mean_max,
       min(ratio_min) AS token_ratio_min,
       max(ratio_max) AS token_ratio_max,
       count(*) FILTER (WHERE turn_clipped) AS clipped
FROM read_parquet($files) GROUP BY step, turn_idx
"""
"""Per (step, turn index) of new ``turns`` parts: the mergeable pieces of the turn-ratio statistics
(``w̄_k = mean_{t∈k} r_t`` per turn; cells of one step split over parts or ranks merge by sum/min/max)."""

MERGE_TURN_CELLS_SQL = """
SELECT step, turn_idx, sum(turns)::BIGINT AS turns, sum(ratio_sum) / nullif(sum(turns), 0) AS ratio_mean,
       min(ratio_mean_min) AS ratio_mean_min, max(ratio_mean_max) AS ratio_mean_max,
       min(token_ratio_min) AS token_ratio_min, max(token_ratio_max) AS token_ratio_max,
       sum(clipped) / nullif(sum(turns), 0) AS clipped_share
FROM cells GROUP BY step, turn_idx ORDER BY step, turn_idx
"""
"""One row per (step, turn index): turns, mean turn ratio ``w̄``, its min and max over the step's
episodes, the token-ratio extremes inside those turns, and the share of turns outside the trust region."""

PART_STEPS_SQL = """
SELECT filename, min(step) AS step_min, max(step) AS step_max
FROM read_parquet($files, filename = true) GROUP BY filename
"""
"""The step range each part holds."""

TURNS_AT_SQL = """
SELECT * EXCLUDE (run_id, iteration, ppo_epoch, minibatch, policy_lag, wall_time)
FROM read_parquet($files, union_by_name = true) WHERE step = $step ORDER BY rank, sample_id, turn_idx
"""
"""The raw ``turns`` rows of one step."""

READ_PARTS_SQL = "SELECT * FROM read_parquet($files, union_by_name = true)"
"""Whole rows of new ``steps``, ``modules`` or ``alerts`` parts."""

KEPT_COLUMNS = {
    "modules": ("step", "rank", "module", "grad_norm", "param_norm"),
    "alerts": ("step", "kind", "detector", "severity", "value", "threshold", "message"),
}
"""The columns kept in memory for the tables not kept whole."""
MAX_CHUNKS = 64
"""Kept tables grow by one Arrow chunk per read; past this many they are combined into one."""

STATUS_LABELS = {"running": "live", "finished": "finished", "failed": "failed", "stale": "stale"}
"""How a run's ``run.json`` status shows in the picker (``stale``: marked running but silent for long)."""


def minmax_indices(values: np.ndarray, max_points: int) -> np.ndarray:
    """Indices of the points to draw: the minimum and the maximum of each of ``max_points // 2`` buckets.

    Buckets are consecutive runs of ``ceil(n / (max_points // 2))`` points; NaN points are never chosen
    (a bucket of only NaN keeps none). All indices are kept when ``n ≤ max_points``. The result is sorted,
    so the drawn line visits each bucket's extremes in step order: a single-point spike survives.
    """
    values = np.asarray(values, dtype=np.float64)
    n = len(values)
    if max_points < 2:
        raise ValueError(f"max_points must be at least 2, not {max_points}")
    if n <= max_points:
        return np.arange(n)
    buckets = max_points // 2
    size = math.ceil(n / buckets)
    padded = np.full(buckets * size, np.nan)
    padded[:n] = values
    grid = padded.reshape(buckets, size)
    missing = np.isnan(grid)
    starts = np.arange(buckets) * size
    lows = starts + np.argmin(np.where(missing, np.inf, grid), axis=1)
    highs = starts + np.argmax(np.where(missing, -np.inf, grid), axis=1)
    keep = np.unique(np.concatenate([lows, highs]))
    keep = keep[keep < n]
    return keep[~np.isnan(values[keep])]


def downsample(x: np.ndarray, y: np.ndarray, max_points: int) -> tuple[np.ndarray, np.ndarray]:
    """``(x, y)`` reduced to at most ``max_points`` points by ``minmax_indices`` (``x`` in drawing order)."""
    keep = minmax_indices(y, max_points)
    return np.asarray(x)[keep], np.asarray(y, dtype=np.float64)[keep]


def column_values(table: pa.Table, name: str) -> np.ndarray:
    """A numeric column as float64 with nulls as NaN (NaN everywhere when the table lacks it)."""
    if name not in table.column_names:
        return np.full(table.num_rows, np.nan)
    column = table.column(name)
    if not (pa.types.is_floating(column.type) or pa.types.is_integer(column.type)):
        column = column.cast(pa.float64())
    return column.to_numpy(zero_copy_only=False).astype(np.float64)


def turn_ratio_grid(cells: pa.Table, max_columns: int = 400) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(steps, turn indices, grid)`` of the mean turn ratio ``w̄`` per (turn, step) from ``turn_cells``.

    With more than ``max_columns`` steps, consecutive steps are bucketed and each (turn, bucket) keeps
    the cell furthest from 1 (largest ``|log w̄|``), labelled with the bucket's first step.
    """
    if cells.num_rows == 0:
        return np.array([], np.int64), np.array([], np.int64), np.empty((0, 0))
    steps, step_at = np.unique(column_values(cells, "step").astype(np.int64), return_inverse=True)
    turns, turn_at = np.unique(column_values(cells, "turn_idx").astype(np.int64), return_inverse=True)
    grid = np.full((len(turns), len(steps)), np.nan)
    grid[turn_at, step_at] = column_values(cells, "ratio_mean")
    if len(steps) <= max_columns:
        return steps, turns, grid
    size = math.ceil(len(steps) / max_columns)
    buckets = math.ceil(len(steps) / size)
    padded = np.full((len(turns), buckets * size), np.nan)
    padded[:, : len(steps)] = grid
    blocks = padded.reshape(len(turns), buckets, size)
    with np.errstate(divide="ignore", invalid="ignore"):
        distance = np.abs(np.log(blocks))
    chosen = np.argmax(np.where(np.isfinite(distance), distance, -np.inf), axis=2)
    return steps[::size], turns, np.take_along_axis(blocks, chosen[..., None], axis=2)[..., 0]


def off_policy_step(steps: pa.Table, candidates: Iterable[int]) -> int | None:
    """The latest of ``candidates`` whose ``policy_lag`` is above 0, else the latest of them.

    The first update on a fresh rollout has every ratio ``π_θ/π_old`` equal to 1; the turn view opens
    at the latest update that reused a rollout, where the ratios say something.
    """
    chosen = sorted(set(candidates))
    if not chosen:
        return None
    if "policy_lag" in steps.column_names:
        lags = dict(
            zip(steps.column("step").to_pylist(), steps.column("policy_lag").to_pylist(), strict=True)
        )
        reused = [step for step in chosen if (lags.get(step) or 0) > 0]
        if reused:
            return reused[-1]
    return chosen[-1]


@dataclass
class RunCurves:
    """What the overview draws for one run."""

    run_id: str
    steps: pa.Table
    """One row per step (``LiveRuns.steps``)."""
    markers: list[dict[str, Any]] = field(default_factory=list)
    """Alert onsets (``report.alert_onsets``): ``step, detector, severity, message``."""
    ctn_spans: list[tuple[int, int]] = field(default_factory=list)
    """Step ranges with CTN on."""
    collapse_step: int | None = None


@dataclass
class RunInfo:
    """One run as the picker shows it."""

    run_id: str
    path: str
    algorithm: str | None
    status: str
    """``live`` (still written), ``finished``, ``failed`` or ``stale`` (marked running, silent for long)."""
    updates: int
    last_step: int | None
    last_reward: float | None
    collapse_step: int | None
    idle_s: float | None

    @property
    def label(self) -> str:
        """``name · algorithm · status · step N`` (``collapsed at S`` when the collapse label fired)."""
        parts = [self.run_id, self.algorithm or "?", self.status]
        if self.collapse_step is not None:
            parts.append(f"collapsed at {self.collapse_step}")
        parts.append("no updates yet" if self.last_step is None else f"step {self.last_step}")
        return " · ".join(parts)


@dataclass
class _TurnPart:
    path: str
    step_min: int
    step_max: int


@dataclass
class _RunCache:
    """What has been read of one run so far."""

    path: Path
    read: set[str] = field(default_factory=set)
    steps: pa.Table | None = None
    turn_cells: list[pa.Table] = field(default_factory=list)
    turn_parts: list[_TurnPart] = field(default_factory=list)
    modules: pa.Table | None = None
    alerts: pa.Table | None = None
    wanted: set[str] = field(default_factory=set)
    version: int = 0
    memo: dict[str, tuple[Any, Any]] = field(default_factory=dict)
    pending_verdict: concurrent.futures.Future | None = None
    foreign: pa.Table | None = None
    """A foreign log's rows as the query layer read them (``steps`` holds them conformed)."""


class LiveRuns:
    """Incrementally read runs of one log dir (see module docstring); safe to share between sessions.

    Args:
        log_dir: the folder a ``Monitor`` writes runs to (or a single run folder), or another tool's log
            (its runs' ``steps`` only; ``sorl_monitor.logs``).
        fmt: force that log's format (``logs.FORMATS``); detected when ``None``.
        min_refresh_s: ``refresh`` calls closer together than this do nothing (many viewers, one read).
        detector_config: thresholds for the detector markers, the collapse label and the verdict.
        verdict_every_s: while a run is live its post-mortem is recomputed at most this often.
    """

    def __init__(
        self,
        log_dir: str | Path,
        *,
        min_refresh_s: float = 1.0,
        detector_config: DetectorConfig | None = None,
        verdict_every_s: float = 30.0,
        fmt: str | None = None,
    ) -> None:
        self.log_dir = Path(log_dir)
        self.fmt = fmt
        self.min_refresh_s = min_refresh_s
        self.detector_config = detector_config or DetectorConfig()
        self.verdict_every_s = verdict_every_s
        self.run_set: RunSet | None = None
        self.problem: str | None = None
        """Why there is nothing to show (missing folder, no runs yet), or ``None``."""
        self.skipped_parts: list[str] = []
        """Messages about part files that could not be read (skipped)."""
        self._runs: dict[str, _RunCache] = {}
        self._single_run_sets: dict[str, RunSet] = {}
        self._infos: pa.Table | None = None
        self._lock = threading.RLock()
        self._last_refresh = -math.inf
        self._closed = False
        self._con = duckdb.connect(config={"threads": 2})
        self._detector = ArrowDetector(self.detector_config)
        self._background = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="sorl-verdict"
        )

    # ------------------------------------------------------------------ reading
    def refresh(self, force: bool = False) -> bool:
        """Pick up new runs and part files (throttled to ``min_refresh_s``). True if anything new was read."""
        with self._lock:
            now = time.monotonic()
            if not force and now - self._last_refresh < self.min_refresh_s:
                return False
            self._last_refresh = now
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always", CorruptPartWarning)
                changed = self._refresh()
            for warning in caught:
                if issubclass(warning.category, CorruptPartWarning) and str(warning.message) not in (
                    self.skipped_parts
                ):
                    self.skipped_parts.append(str(warning.message))
            return changed

    def _refresh(self) -> bool:
        if self.run_set is None:
            if not self._open():
                return False
        else:
            self.run_set.refresh()
        self._infos = self.run_set.sql("SELECT * FROM runs")
        changed = False
        for row in self._infos.select(["run_id", "path"]).to_pylist():
            cache = self._runs.setdefault(row["run_id"], _RunCache(Path(row["path"])))
            foreign = self.run_set.foreign.get(row["run_id"])
            if foreign is not None:
                changed |= self._take_foreign_steps(cache, foreign.steps)
                continue
            for table in ("steps", *sorted(cache.wanted)):
                changed |= self._read_new_parts(cache, table)
        return changed

    def _open(self) -> bool:
        if not self.log_dir.exists():
            self.problem = f"The folder {self.log_dir} does not exist (yet). Point the dashboard at the log_dir your Monitor writes to."
            return False
        try:
            self.run_set = open_runs(self.log_dir, self.fmt)
        except QueryError as error:
            if not self.log_dir.is_dir():
                self.problem = f"{self.log_dir} is a file that cannot be read as a log: {error}"
                return False
            self.problem = (
                f"No runs in {self.log_dir} yet. Start training with Monitor(log_dir={str(self.log_dir)!r}); "
                "this page picks the run up by itself."
            )
            return False
        except OSError as error:
            self.problem = f"Cannot read {self.log_dir}: {error.strerror or error}."
            return False
        self.problem = None
        return True

    @staticmethod
    def _take_foreign_steps(cache: _RunCache, steps: pa.Table) -> bool:
        """Keep a foreign log's ``steps`` rows (the query layer re-reads the log when it changes)."""
        if cache.foreign is steps:
            return False
        cache.foreign = steps
        cache.steps = conform("steps", steps)
        cache.version += 1
        cache.memo.clear()
        return True

    def _new_parts(self, cache: _RunCache, table: str) -> list[str]:
        """Parts of ``table`` not read yet; all of them again if the writer compacted parts already read."""
        assert self.run_set is not None
        prefix = str(cache.path / table) + "/"
        listed = [f for f in self.run_set.files(table) if f.startswith(prefix)]
        read = {f for f in cache.read if f.startswith(prefix)}
        if read - set(listed):
            cache.read -= read
            self._forget(cache, table)
        return [f for f in listed if f not in cache.read]

    @staticmethod
    def _forget(cache: _RunCache, table: str) -> None:
        """Drop what was read of ``table`` (its parts were rewritten as a compacted part)."""
        if table == "turns":
            cache.turn_cells.clear()
            cache.turn_parts.clear()
        else:
            setattr(cache, table, None)
        cache.version += 1
        cache.memo.clear()

    def _read_new_parts(self, cache: _RunCache, table: str) -> bool:
        """Read the parts of ``table`` not read before; a part that does not read is skipped, loudly."""
        files = self._new_parts(cache, table)
        if not files:
            return False
        if self._ingest(cache, table, files):
            return True
        changed = False
        for path in files:
            if self._ingest(cache, table, [path]):
                changed = True
            elif not os.path.exists(path):
                continue  # compacted away since it was listed: the next listing holds the merged part
            else:
                warnings.warn(f"skipping unreadable part {path}", CorruptPartWarning, stacklevel=2)
                cache.read.add(path)
        return changed

    def _ingest(self, cache: _RunCache, table: str, files: list[str]) -> bool:
        """Add ``files`` of ``table`` to ``cache``; False (and nothing added) if one of them fails to read."""
        try:
            if table == "turns":
                cells = self._arrow(TURN_CELLS_SQL, {"files": files})
                ranges = self._arrow(PART_STEPS_SQL, {"files": files})
                cache.turn_cells.append(cells)
                cache.turn_parts.extend(
                    _TurnPart(r["filename"], r["step_min"], r["step_max"]) for r in ranges.to_pylist()
                )
            else:
                data = self._arrow(READ_PARTS_SQL, {"files": files})
                if table in KEPT_COLUMNS:
                    data = data.select(list(KEPT_COLUMNS[table]))
                previous = getattr(cache, table)
                if previous is not None:
                    data = pa.concat_tables([previous, data], promote_options="permissive")
                    if data.column(0).num_chunks > MAX_CHUNKS:
                        data = data.combine_chunks()
                setattr(cache, table, data)
        except duckdb.Error:
            return False
        cache.read.update(files)
        cache.version += 1
        return True

    def _arrow(self, sql: str, params: dict[str, Any] | None = None) -> pa.Table:
        """``sql`` on the private connection, as an Arrow table."""
        return self._con.sql(sql, params=params).to_arrow_table()

    def _wanted(self, run_id: str, table: str) -> _RunCache:
        """The run's cache, with ``table`` read (now, and on every refresh from now on)."""
        with self._lock:
            cache = self._cache(run_id)
            if table not in cache.wanted:
                cache.wanted.add(table)
                self._read_new_parts(cache, table)
            return cache

    # ------------------------------------------------------------------ runs
    def run_ids(self) -> list[str]:
        """Every run found, in the order they were created."""
        return [info.run_id for info in self.run_infos()]

    def run_infos(self) -> list[RunInfo]:
        """The picker's rows: each run's algorithm, status, updates, last step and reward, collapse step."""
        with self._lock:
            if self._infos is None:
                return []
            infos = []
            now = time.time()
            for row in self._infos.sort_by(
                [("created_at", "ascending"), ("run_id", "ascending")]
            ).to_pylist():
                steps = self.steps(row["run_id"])
                last_write = row["last_write"]
                idle = None if last_write is None else max(0.0, now - last_write)
                status = row["status"] or "unknown"
                if status == "running" and idle is not None and idle > STALE_AFTER_S:
                    status = "stale"
                rewards = column_values(steps, "reward_mean")
                finite = rewards[np.isfinite(rewards)]
                infos.append(
                    RunInfo(
                        run_id=row["run_id"],
                        path=row["path"],
                        algorithm=row["algorithm"],
                        status=STATUS_LABELS.get(status, status),
                        updates=steps.num_rows,
                        last_step=pc.max(steps.column("step")).as_py() if steps.num_rows else None,
                        last_reward=float(finite[-1]) if len(finite) else None,
                        collapse_step=self.collapse_step(row["run_id"]),
                        idle_s=idle,
                    )
                )
            return infos

    def run_info(self, run_id: str) -> RunInfo | None:
        return next((info for info in self.run_infos() if info.run_id == run_id), None)

    # ------------------------------------------------------------------ tables
    def steps(self, run_id: str) -> pa.Table:
        """One row per logged step in step order; rows of one step (ranks, extra scalars) are averaged."""
        return self._memo(run_id, "steps", lambda cache: merge_steps(cache.steps, run_id))

    def turn_cells(self, run_id: str) -> pa.Table:
        """Per (step, turn index): ``turns, ratio_mean, ratio_mean_min, ratio_mean_max, token_ratio_min,
        token_ratio_max, clipped_share`` (see ``MERGE_TURN_CELLS_SQL``); empty when no turns were logged."""
        self._wanted(run_id, "turns")
        return self._memo(run_id, "turn_cells", self._merged_turn_cells)

    def _merged_turn_cells(self, cache: _RunCache) -> pa.Table:
        if not cache.turn_cells:
            return pa.table(
                {"step": pa.array([], pa.int64()), "turn_idx": pa.array([], pa.int32()),
                 "turns": pa.array([], pa.int64()), "ratio_mean": pa.array([], pa.float64())}
            )  # fmt: skip
        if len(cache.turn_cells) > 1:
            cache.turn_cells = [pa.concat_tables(cache.turn_cells).combine_chunks()]
        self._con.register("cells", cache.turn_cells[0])
        try:
            return self._arrow(MERGE_TURN_CELLS_SQL)
        finally:
            self._con.unregister("cells")

    def turns_at(self, run_id: str, step: int) -> pa.Table:
        """The raw ``turns`` rows of one step, read from the parts whose step range holds it.

        A live writer may have compacted those parts since they were listed: then the parts are listed
        again (the compacted part replaces them) and the read is retried.
        """
        with self._lock:
            cache = self._wanted(run_id, "turns")
            for attempt in range(READ_ATTEMPTS):
                files = [p.path for p in cache.turn_parts if p.step_min <= step <= p.step_max]
                if not files:
                    return SCHEMAS["turns"].empty_table()
                try:
                    return self._arrow(TURNS_AT_SQL, {"files": files, "step": step})
                except duckdb.IOException:
                    if attempt == READ_ATTEMPTS - 1 or all(os.path.exists(f) for f in files):
                        raise
                    self._relist(cache, "turns")
            raise AssertionError("unreachable")

    def _relist(self, cache: _RunCache, table: str) -> None:
        """List the run's parts again now (not throttled) and read what changed in ``table``."""
        assert self.run_set is not None
        self.run_set.refresh()
        self._read_new_parts(cache, table)

    def modules(self, run_id: str) -> pa.Table:
        """``step, rank, module, grad_norm, param_norm`` rows (empty when ``Monitor.watch`` was not used)."""
        cache = self._wanted(run_id, "modules")
        if cache.modules is None:
            return SCHEMAS["modules"].empty_table().select(list(KEPT_COLUMNS["modules"]))
        return cache.modules

    def alerts(self, run_id: str) -> pa.Table:
        """Rows the trainer logged in ``alerts`` (``kind`` alert or action: ``ctn_on``/``ctn_off``), by step."""
        cache = self._wanted(run_id, "alerts")
        if cache.alerts is None:
            return SCHEMAS["alerts"].empty_table().select(list(KEPT_COLUMNS["alerts"]))
        return cache.alerts.sort_by([("step", "ascending")])

    # ------------------------------------------------------------------ detectors
    def detector_alerts(self, run_id: str) -> pa.Table:
        """The detectors' firings over the run's steps (``detect``'s columns: run_id, step, detector, …).

        Incremental: each call runs the detectors over the blocks from the one that held the last step
        checked on (their windows look back, never forward, so earlier blocks' firings stay as they were; a
        block still being written when last checked is judged again, now on all its rows).
        """
        with self._lock:
            cache = self._cache(run_id)
            stored = cache.memo.get("detect")
            if stored is not None and stored[0] == cache.version:
                return stored[1][1]
            checked, found = stored[1] if stored is not None else (None, ALERT_COLUMNS.empty_table())
            steps = self.steps(run_id)
            if steps.num_rows:
                block = self.detector_config.smooth_steps
                after = None if checked is None else (checked // block) * block - 1
                if after is not None:
                    found = found.filter(pc.less_equal(found.column("step"), after))
                found = pa.concat_tables([found, self._detector(steps, run_id, after_step=after)])
                checked = pc.max(steps.column("step")).as_py()
            cache.memo["detect"] = (cache.version, (checked, found))
            return found

    def collapse_step(self, run_id: str) -> int | None:
        """The step the collapse label fires at (reward below half its peak for good, or a non-finite loss)."""
        return self._memo(run_id, "collapse", lambda cache: self._collapse_step(run_id))

    def _collapse_step(self, run_id: str) -> int | None:
        steps = self.steps(run_id)
        if steps.num_rows == 0:
            return None
        self._con.register("steps", with_columns(steps, ["reward_mean", "loss", "pg_loss"], run_id))
        try:
            params = detect_params(COLLAPSE_SQL, self.detector_config, run_id)
            cursor = self._con.execute(COLLAPSE_SQL, params)
            names = [column[0] for column in cursor.description]
            rows = cursor.fetchall()
        finally:
            self._con.unregister("steps")
        return rows[0][names.index("collapse_step")] if rows else None

    def curves(self, run_id: str) -> RunCurves:
        """The overview's data for one run: steps, alert onsets (logged alerts and detector firings),
        CTN-on spans (the ``ctn_active`` column, else the ``ctn_on``/``ctn_off`` actions), collapse step."""
        self._wanted(run_id, "alerts")
        return self._memo(run_id, "curves", lambda cache: self._curves(run_id))

    def _curves(self, run_id: str) -> RunCurves:
        steps = self.steps(run_id)
        logged = self.alerts(run_id)
        actions = logged.filter(pc.equal(logged.column("kind"), "action"))
        fired = [
            *logged.filter(pc.not_equal(logged.column("kind"), "action")).to_pylist(),
            *self.detector_alerts(run_id).to_pylist(),
        ]
        unique = list({(row["step"], row["detector"]): row for row in fired}.values())
        step_list = steps.column("step").to_pylist()
        active = steps.column("ctn_active").to_pylist() if "ctn_active" in steps.column_names else []
        spans = ctn_spans(
            step_list,
            active if len(active) == len(step_list) else [None] * len(step_list),
            [(row["step"], row["detector"]) for row in actions.to_pylist()],
        )
        onsets = alert_onsets(unique, step_list, self.detector_config.smooth_steps)
        return RunCurves(run_id, steps, onsets, spans, self.collapse_step(run_id))

    def clip_eps(self, run_id: str) -> float:
        """The run's PPO clip ε (``clip_eps`` in its config), else the detectors' turn-ratio ε."""
        with self._lock:
            rows = (
                []
                if self._infos is None
                else self._infos.filter(pc.equal(self._infos.column("run_id"), run_id))
            )
            config = json.loads(rows.column("config")[0].as_py() or "{}") if rows and rows.num_rows else {}
        value = config.get("clip_eps") if isinstance(config, dict) else None
        return float(value) if isinstance(value, int | float) else self.detector_config.turn_ratio_eps

    def verdict(self, run_id: str, wait_s: float | None = None) -> Verdict | None:
        """The newest post-mortem of ``run_id`` so far (``None`` before one is ready).

        The post-mortem (``sorl_monitor.postmortem``, over views of the run's own folder) runs in a
        background thread: started when none exists yet, and again when new rows arrived and the last
        one is ``verdict_every_s`` old. The call waits for a running one up to ``wait_s`` seconds
        (``None``: until it is done), then returns the newest finished verdict; the other views keep
        refreshing meanwhile. A post-mortem's error (e.g. a ``QueryError``) is raised here.
        """
        with self._lock:
            cache = self._cache(run_id)
            if self.steps(run_id).num_rows == 0:
                return None
            pending = self._collect_verdict(cache)
            done = cache.memo.get("verdict")
            due = done is None or (
                done[0][0] != cache.version and time.monotonic() - done[0][1] >= self.verdict_every_s
            )
            if due and pending is None:
                pending = cache.pending_verdict = self._background.submit(
                    self._postmortem, run_id, cache.path, cache.version
                )
        if pending is not None:
            with contextlib.suppress(concurrent.futures.TimeoutError):
                pending.result(timeout=wait_s)
        with self._lock:
            self._collect_verdict(cache)
            done = cache.memo.get("verdict")
            return None if done is None else done[1]

    def verdict_pending(self, run_id: str) -> bool:
        """Whether a post-mortem of ``run_id`` is running in the background."""
        with self._lock:
            return self._collect_verdict(self._cache(run_id)) is not None

    def _collect_verdict(self, cache: _RunCache) -> concurrent.futures.Future | None:
        """Store a finished background post-mortem (raising its error); the one still running, if any."""
        pending = cache.pending_verdict
        if pending is None or not pending.done():
            return pending
        cache.pending_verdict = None
        version, verdict = pending.result()
        cache.memo["verdict"] = ((version, time.monotonic()), verdict)
        return None

    def _postmortem(self, run_id: str, path: Path, version: int) -> tuple[int, Verdict]:
        run_set = self._single_run_sets.get(run_id)
        if self.run_set is not None and run_id in self.run_set.foreign:
            run_set = self.run_set  # held in memory: no second read of the log
        elif run_set is None:
            run_set = self._single_run_sets[run_id] = open_runs(path)
        else:
            run_set.refresh()
        return version, postmortem(run_set, run_id, self.detector_config)

    def _cache(self, run_id: str) -> _RunCache:
        cache = self._runs.get(run_id)
        if cache is None:
            raise QueryError(f"no run {run_id!r} in {self.log_dir}")
        return cache

    def _memo(self, run_id: str, name: str, compute: Any) -> Any:
        """``compute(cache)``, remembered until new rows of ``run_id`` are read."""
        with self._lock:
            cache = self._cache(run_id)
            stored = cache.memo.get(name)
            if stored is not None and stored[0] == cache.version:
                return stored[1]
            value = compute(cache)
            cache.memo[name] = (cache.version, value)
            return value

    def close(self) -> None:
        """Stop the background post-mortems and close the DuckDB connections (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self._background.shutdown(wait=True, cancel_futures=True)
        with self._lock:
            self._con.close()
            self._detector.close()
            for run_set in [self.run_set, *self._single_run_sets.values()]:
                if run_set is not None:
                    run_set.close()


def merge_steps(steps: pa.Table | None, run_id: str) -> pa.Table:
    """``steps`` rows of one run as one row per step, sorted by step, with ``run_id`` set.

    A step logged in several rows (one per rank, or extra scalars in a second row) becomes their mean
    (booleans: any).
    """
    if steps is None or steps.num_rows == 0:
        return SCHEMAS["steps"].empty_table()
    if pc.count_distinct(steps.column("step")).as_py() < steps.num_rows:
        numeric = [
            (f.name, "mean")
            for f in steps.schema
            if f.name != "step" and (pa.types.is_floating(f.type) or pa.types.is_integer(f.type))
        ]
        flags = [(f.name, "any") for f in steps.schema if pa.types.is_boolean(f.type)]
        steps = steps.group_by("step").aggregate(numeric + flags)
        steps = steps.rename_columns([_aggregate_name(name) for name in steps.column_names])
    run_ids = pa.repeat(pa.scalar(run_id), steps.num_rows)
    if "run_id" in steps.column_names:
        steps = steps.set_column(steps.schema.get_field_index("run_id"), "run_id", run_ids)
    else:
        steps = steps.append_column("run_id", run_ids)
    return steps.sort_by("step")


def _aggregate_name(name: str) -> str:
    """``clip_frac_mean`` → ``clip_frac`` (pyarrow names an aggregate ``<column>_<function>``)."""
    for suffix in ("_mean", "_any"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name
