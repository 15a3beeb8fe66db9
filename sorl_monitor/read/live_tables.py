"""Runs read as they are written: each run's rows, read incrementally (the dashboard's, ``sorl watch``'s).

    tables = LiveTables("runs/")      # nothing read yet; a missing or empty folder is not an error
    tables.refresh()                  # list part files again, read only the parts not read before
    tables.steps("run-a")             # one row per logged step (``step_rows``)
    tables.turn_cells("run-a")        # turn-level IS ratio per (step, turn index), reduced as read

Reading goes through the query layer (``RunSet.read_new``): each finished part is read once, a
compaction makes the table read again, unreadable parts are left out and listed (``skipped_parts``).
``steps`` rows of every run are kept as logged (the detectors and the collapse label read them so, and
the figures their step rows, ``step_rows``); ``modules`` and ``alerts`` rows and ``turns`` cells only of
runs something asked for. ``turns`` rows, the big table, are reduced while read to one row per (step,
turn index) of mergeable pieces (count, sum, min, max of ``w̄_k``; token-ratio extremes; clipped turns).
``diagnose.live.LiveRuns`` adds the alerts, timelines and verdicts.
"""

from __future__ import annotations

import math
import os
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pyarrow as pa
import pyarrow.compute as pc

from sorl_monitor.logs import LogOptions
from sorl_monitor.read.query import (
    READ_PARTS_SQL,
    CorruptPartWarning,
    NewRows,
    PartsRead,
    QueryError,
    RunSet,
    SkippedPart,
    open_runs,
)
from sorl_monitor.read.step_rows import step_rows
from sorl_monitor.schema import SCHEMAS, conform
from sorl_monitor.storage import is_remote

T = TypeVar("T")

TURN_CELLS_SQL = """
SELECT step, turn_idx,
       count(ratio_mean) FILTER (WHERE isfinite(ratio_mean)) AS turns,
       sum(ratio_mean) FILTER (WHERE isfinite(ratio_mean)) AS ratio_sum,
       min(ratio_mean) FILTER (WHERE isfinite(ratio_mean)) AS ratio_mean_min,
       max(ratio_mean) FILTER (WHERE isfinite(ratio_mean)) AS ratio_mean_max,
       min(ratio_min) AS token_ratio_min, max(ratio_max) AS token_ratio_max,
       count(*) FILTER (WHERE turn_clipped) AS clipped
FROM read_parquet($files, union_by_name = true) GROUP BY step, turn_idx
"""
"""Per (step, turn index) of new ``turns`` parts: the mergeable pieces of the turn-ratio statistics
(``w̄_k = mean_{t∈k} r_t`` per turn; pieces of one step split over parts or ranks merge by sum, min, max)."""

TURNS_AT_SQL = """
SELECT * EXCLUDE (run_id, iteration, ppo_epoch, minibatch, policy_lag, wall_time)
FROM turns WHERE run_id = $run_id AND step = $step ORDER BY rank, sample_id, turn_idx
"""
"""The raw ``turns`` rows of one step of one run."""

KEPT_COLUMNS = {
    "modules": ("step", "rank", "module", "grad_norm", "param_norm"),
    "alerts": ("step", "kind", "detector", "severity", "value", "threshold", "message"),
}
"""The columns kept in memory of the tables not kept whole."""
READERS = {"turns": TURN_CELLS_SQL}
"""How a table's new parts are read (the others: whole rows)."""
MAX_CHUNKS = 64
"""Kept tables grow by one Arrow chunk per read; past this many they are combined into one."""


@dataclass
class _Run:
    """What has been read of one run so far."""

    path: str
    seen: dict[str, PartsRead] = field(default_factory=dict)
    tables: dict[str, pa.Table] = field(default_factory=dict)
    """Rows read per table (``turns``: cell pieces), in chunks."""
    wanted: set[str] = field(default_factory=set)
    version: int = 0
    memo: dict[str, tuple[int, Any]] = field(default_factory=dict)
    """Values computed from the rows read so far, each with the ``version`` it was computed at."""
    foreign: pa.Table | None = None
    """A foreign log's rows as the query layer holds them (they are its ``steps``)."""

    def take(self, table: str, new: NewRows) -> bool:
        """Add ``new`` rows of ``table`` (dropping what was read before after a compaction)."""
        if new.reset:
            self.tables.pop(table, None)
        if new.rows is not None:
            rows = new.rows
            if table in KEPT_COLUMNS:
                rows = rows.select([c for c in KEPT_COLUMNS[table] if c in rows.column_names])
            previous = self.tables.get(table)
            if previous is not None:
                rows = pa.concat_tables([previous, rows], promote_options="permissive")
                if rows.column(0).num_chunks > MAX_CHUNKS:
                    rows = rows.combine_chunks()
            self.tables[table] = rows
        if new.reset or new.rows is not None:
            self.version += 1
            return True
        return False


def _folder(source: str | Path) -> Path | str:
    """A log folder as a ``Path``; an object-store URI (``s3://…``) stays text (``Path`` would drop a slash)."""
    return os.fspath(source) if is_remote(source) else Path(source)


def _exists(path: str | Path) -> bool:
    """Whether a local path exists; an object-store URI is taken to (``open_runs`` says if it does not)."""
    return is_remote(path) or Path(path).exists()


class LiveTables:
    """The runs of a log dir (or of an open ``RunSet``), read incrementally; safe to share between threads.

    Args:
        source: the folder a ``Monitor`` writes runs to (or one run folder, or another tool's log:
            ``sorl_monitor.logs``), or a ``RunSet`` already open (then the caller closes it).
        fmt: force that log's format (``logs.FORMATS``); detected when ``None``.
        min_refresh_s: ``refresh`` calls closer together than this do nothing (many viewers, one read).
        log_options: what the user told the log readers (``logs.options``: ``--map``, ``--logging-steps``).
        run_paths: open only these runs (their folders or log files) of ``source``, a folder, and not every
            run in it (the dashboard over a fleet's verdict table opens the runs a viewer picked).
    """

    def __init__(
        self,
        source: str | Path | RunSet,
        *,
        fmt: str | None = None,
        min_refresh_s: float = 0.25,
        log_options: LogOptions | None = None,
        run_paths: Sequence[str] = (),
    ) -> None:
        self.run_set: RunSet | None = source if isinstance(source, RunSet) else None
        self._owns_run_set = self.run_set is None
        self.log_dir: Path | str = self.run_set.roots[0] if self.run_set is not None else _folder(source)
        self.fmt = fmt
        self.log_options = log_options
        """What the user told the log readers (``logs.options``: ``--map``, ``--logging-steps``)."""
        self.run_paths = tuple(run_paths)
        self.min_refresh_s = min_refresh_s
        self.problem: str | None = None
        """Why there is nothing to show (missing folder, no runs yet), or ``None``."""
        self._runs: dict[str, _Run] = {}
        self._infos: pa.Table | None = None
        self._lock = threading.RLock()
        self._last_refresh = -math.inf
        self._closed = False

    # ------------------------------------------------------------------ reading
    def refresh(self, force: bool = False) -> bool:
        """Pick up new runs and part files (at most every ``min_refresh_s``). True if anything new was read."""
        with self._lock:
            now = time.monotonic()
            if self._closed or (not force and now - self._last_refresh < self.min_refresh_s):
                return False
            self._last_refresh = now
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", CorruptPartWarning)  # listed by skipped_parts instead
                return self._refresh()

    def _refresh(self) -> bool:
        if self.run_set is None:
            if not self._open():
                return False
        else:
            self.run_set.refresh()
        assert self.run_set is not None
        self._infos = self.run_set.sql("SELECT * FROM runs")
        changed = False
        for row in self._infos.select(["run_id", "path"]).to_pylist():
            run = self._runs.setdefault(row["run_id"], _Run(row["path"]))
            foreign = self.run_set.foreign.get(row["run_id"])
            if foreign is not None:
                changed |= self._take_foreign_steps(run, foreign.steps)
                continue
            for table in ("steps", *sorted(run.wanted)):
                changed |= self._read_new(row["run_id"], run, table)
        return changed

    def _open(self) -> bool:
        if not _exists(self.log_dir):
            self.problem = (
                f"The folder {self.log_dir} does not exist (yet). "
                "Point the dashboard at the log_dir your Monitor writes to."
            )
            return False
        paths = [p for p in self.run_paths if _exists(p)]
        if self.run_paths and not paths:
            self.problem = f"The runs picked are not in {self.log_dir} any more: {', '.join(self.run_paths)}."
            return False
        try:
            self.run_set = open_runs(paths or self.log_dir, self.fmt, log_options=self.log_options)
        except QueryError as error:
            if isinstance(self.log_dir, Path) and not self.log_dir.is_dir():
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
    def _take_foreign_steps(run: _Run, steps: pa.Table) -> bool:
        """Keep a foreign log's rows as the run's ``steps`` (the query layer reads the log again when it changes)."""
        if run.foreign is steps:
            return False
        run.foreign = steps
        run.tables["steps"] = conform("steps", steps)
        run.version += 1
        run.memo.clear()
        return True

    def _read_new(self, run_id: str, run: _Run, table: str) -> bool:
        assert self.run_set is not None
        seen = run.seen.setdefault(table, PartsRead())
        return run.take(table, self.run_set.read_new(run_id, table, seen, READERS.get(table, READ_PARTS_SQL)))

    def _wanted(self, run_id: str, table: str) -> _Run:
        """The run, with ``table`` read (now, and on every refresh from now on)."""
        with self._lock:
            run = self._run(run_id)
            if table not in run.wanted:
                run.wanted.add(table)
                if run.foreign is None:
                    self._read_new(run_id, run, table)
            return run

    def skipped_parts(self, run_id: str) -> list[SkippedPart]:
        """The run's part files left out because they do not read, with the reason."""
        return [] if self.run_set is None else self.run_set.skipped_parts(run_id)

    def version(self, run_id: str) -> int:
        """A number that changes whenever new rows of ``run_id`` were read (for caching what is drawn)."""
        with self._lock:
            return self._run(run_id).version

    # ------------------------------------------------------------------ tables
    def logged_steps(self, run_id: str) -> pa.Table:
        """The run's ``steps`` rows as logged (every rank, every row), in reading order."""
        with self._lock:
            return self._run(run_id).tables.get("steps", SCHEMAS["steps"].empty_table())

    def steps(self, run_id: str) -> pa.Table:
        """One row per logged step, in step order (``step_rows``)."""
        return self._memo(run_id, "steps", lambda run: step_rows(self.logged_steps(run_id), run_id))

    def turn_cells(self, run_id: str) -> pa.Table:
        """Per (step, turn index): ``turns, ratio_mean, ratio_mean_min, ratio_mean_max, token_ratio_min,
        token_ratio_max, clipped_share``; empty when the run logged no turns."""
        self._wanted(run_id, "turns")
        return self._memo(run_id, "turn_cells", lambda run: merge_turn_cells(run.tables.get("turns")))

    def turns_at(self, run_id: str, step: int) -> pa.Table:
        """The raw ``turns`` rows of one step."""
        assert self.run_set is not None
        return self.run_set.sql(TURNS_AT_SQL, {"run_id": run_id, "step": step})

    def modules(self, run_id: str) -> pa.Table:
        """``step, rank, module, grad_norm, param_norm`` rows (empty when ``Monitor.watch`` was not used)."""
        run = self._wanted(run_id, "modules")
        with self._lock:
            rows = run.tables.get("modules")
        return (
            SCHEMAS["modules"].empty_table().select(list(KEPT_COLUMNS["modules"])) if rows is None else rows
        )

    def alerts(self, run_id: str) -> pa.Table:
        """Rows the trainer logged in ``alerts`` (``kind`` alert or action: ``ctn_on``/``ctn_off``), by step."""
        run = self._wanted(run_id, "alerts")
        with self._lock:
            rows = run.tables.get("alerts")
        if rows is None:
            return SCHEMAS["alerts"].empty_table().select(list(KEPT_COLUMNS["alerts"]))
        return rows.sort_by([("step", "ascending")])

    # ------------------------------------------------------------------ plumbing
    def _run(self, run_id: str) -> _Run:
        run = self._runs.get(run_id)
        if run is None:
            raise QueryError(f"no run {run_id!r} in {self.log_dir}")
        return run

    def _memo(self, run_id: str, name: str, compute: Callable[[_Run], T]) -> T:
        """``compute(run)``, remembered until new rows of ``run_id`` are read."""
        with self._lock:
            run = self._run(run_id)
            stored = run.memo.get(name)
            if stored is not None and stored[0] == run.version:
                return stored[1]
            value = compute(run)
            run.memo[name] = (run.version, value)
            return value

    def close(self) -> None:
        """Close the ``RunSet`` this opened (idempotent)."""
        if self._closed:
            return
        self._closed = True
        with self._lock:
            self._close_run_set()

    def _close_run_set(self) -> None:
        if self._owns_run_set and self.run_set is not None:
            self.run_set.close()


def merge_turn_cells(pieces: pa.Table | None) -> pa.Table:
    """One row per (step, turn index) from ``TURN_CELLS_SQL`` pieces: ``turns``, mean turn ratio
    ``ratio_mean``, its min and max over the step's episodes, the token-ratio extremes inside those turns,
    and ``clipped_share`` (turns outside the trust region), in (step, turn) order."""
    if pieces is None or pieces.num_rows == 0:
        return pa.table(
            {"step": pa.array([], pa.int64()), "turn_idx": pa.array([], pa.int32()),
             "turns": pa.array([], pa.int64()), "ratio_mean": pa.array([], pa.float64())}
        )  # fmt: skip
    merged = pieces.group_by(["step", "turn_idx"], use_threads=False).aggregate(
        [("turns", "sum"), ("ratio_sum", "sum"), ("ratio_mean_min", "min"), ("ratio_mean_max", "max"),
         ("token_ratio_min", "min"), ("token_ratio_max", "max"), ("clipped", "sum")]
    )  # fmt: skip
    turns = merged.column("turns_sum")
    counted = pc.if_else(pc.greater(turns, 0), turns, None).cast(pa.float64())
    return pa.table(
        {
            "step": merged.column("step"),
            "turn_idx": merged.column("turn_idx"),
            "turns": turns,
            "ratio_mean": pc.divide(merged.column("ratio_sum_sum"), counted),
            "ratio_mean_min": merged.column("ratio_mean_min_min"),
            "ratio_mean_max": merged.column("ratio_mean_max_max"),
            "token_ratio_min": merged.column("token_ratio_min_min"),
            "token_ratio_max": merged.column("token_ratio_max_max"),
            "clipped_share": pc.divide(merged.column("clipped_sum").cast(pa.float64()), counted),
        }
    ).sort_by([("step", "ascending"), ("turn_idx", "ascending")])


def latest_reused_step(steps: pa.Table, candidates: Iterable[int]) -> int | None:
    """The latest of ``candidates`` whose ``policy_lag`` is above 0, else the latest of them.

    The first update on a fresh rollout has every ratio ``π_θ/π_old`` equal to 1; the turn view opens at
    the latest update that reused a rollout, where the ratios say something.
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
