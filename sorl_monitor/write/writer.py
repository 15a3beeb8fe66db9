"""Crash-safe, non-blocking Parquet streaming: a background thread behind a bounded queue.

The training thread only calls ``submit`` (a lock-free ``deque.append``). The writer thread turns what is queued
into Arrow tables and writes ``<run_dir>/<table>/rank=R/part-NNNNNN.parquet`` every
``flush_interval_s`` seconds or ``flush_rows`` rows per table: to ``part-N.parquet.tmp`` first, then
``os.replace``, so a reader never sees a half-written file and a crash (even SIGKILL) loses at most
what was queued since the last flush. A full queue or a failing disk never raises into the caller:
the rows are dropped and counted (``stats()``). One writer per run and rank: a second one is refused
(``refused``), never let to overwrite the first one's parts. Compaction runs on a thread of its own, so
merging parts never delays a flush.
"""

from __future__ import annotations

import collections
import contextlib
import fcntl
import json
import os
import socket
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from sorl_monitor.schema import conform, part_range
from sorl_monitor.settings import check_writer_settings

_STOP = object()


def write_json_atomic(path: Path, payload: dict[str, Any]) -> None:
    """Write ``payload`` as JSON to ``path`` via a temporary file and ``os.replace`` (all or nothing)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(payload, indent=2, sort_keys=True, default=str))
    os.replace(tmp, path)


_ARROW_TYPES = {
    frozenset({float}): pa.float64(),
    frozenset({int}): pa.int64(),
    frozenset({int, float}): pa.float64(),
    frozenset({bool}): pa.bool_(),
    frozenset({str}): pa.string(),
}


def _column(values: list[Any]) -> pa.Array:
    """An Arrow column from Python values (typed up front: Arrow's inference is ~100× slower).

    Mixed numbers become double; anything that is not a number, bool or string becomes a string.
    """
    kinds = frozenset(type(v) for v in values if v is not None)
    try:
        return pa.array(values, _ARROW_TYPES.get(kinds))
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):  # e.g. an int beyond int64
        try:
            return pa.array([None if v is None else float(v) for v in values], pa.float64())
        except (TypeError, ValueError):
            return pa.array([None if v is None else str(v) for v in values], pa.string())


def rows_to_table(rows: list[dict[str, Any]]) -> pa.Table:
    """Row dicts as one Arrow table over the union of their keys (missing values are null)."""
    names = list(dict.fromkeys(name for row in rows for name in row))
    return pa.table({name: _column([row.get(name) for row in rows]) for name in names})


def to_arrow(payloads: list[Any]) -> pa.Table:
    """Queued payloads (lists of row dicts, dicts of columns, Arrow data) as one Arrow table.

    All row dicts are converted together, column by column: one conversion per flush, not per row.
    """
    rows = [row for p in payloads if isinstance(p, list) for row in p]
    tables = [rows_to_table(rows)] if rows else []
    for p in payloads:
        if isinstance(p, pa.Table):
            tables.append(p)
        elif isinstance(p, pa.RecordBatch):
            tables.append(pa.Table.from_batches([p]))
        elif not isinstance(p, list):
            tables.append(pa.table(p))
    return pa.concat_tables(tables, promote_options="permissive") if len(tables) > 1 else tables[0]


@dataclass
class WriterStats:
    """Counters of one writer: rows queued, written and dropped (queue full or failed write), parts, errors."""

    rows_submitted: int = 0
    rows_written: int = 0
    rows_dropped: int = 0
    parts_written: int = 0
    write_errors: int = 0
    last_error: str = ""


COMPACT_PARTS = 32
"""Parts of one level merged into one by compaction (``ParquetStreamWriter.compact_parts``'s default)."""


@dataclass(frozen=True)
class WriterConfig:
    """How a ``Monitor`` writes its rows: ``Monitor(log_dir, writer=WriterConfig(flush_interval_s=0.5))``.

    Each field is also a keyword of ``Monitor`` (``Monitor(log_dir, flush_interval_s=0.5)``). A setting that
    cannot work (``flush_interval_s <= 0``, ``flush_rows < 1``, …) raises ``ValueError`` when it is made.
    """

    flush_interval_s: float = 2.0
    """Seconds between flushes: rows reach disk at least this often (a crash loses at most this much)."""
    flush_rows: int = 200_000
    """A table with this many queued rows is flushed at once, before ``flush_interval_s``."""
    max_pending_rows: int = 4_000_000
    """Rows queued across tables before new ones are dropped and counted (``Monitor.writer_stats``)."""
    compact: bool = True
    """Merge small part files into ``part-A-B.parquet`` as they pile up (``COMPACT_PARTS`` of one level)
    and at close; ``False`` keeps every flush's part."""
    storage_options: Mapping[str, str] | None = None
    """For a ``log_dir`` in object storage (``s3://bucket/prefix``): endpoint and credentials
    (``storage.filesystem``); ``None``: the usual AWS environment variables."""

    def __post_init__(self) -> None:
        check_writer_settings(
            self.flush_interval_s, self.flush_rows, self.max_pending_rows, self.compact_parts, 1
        )

    @property
    def compact_parts(self) -> int:
        """``ParquetStreamWriter``'s ``compact_parts``: ``COMPACT_PARTS``, or 0 (compaction off)."""
        return COMPACT_PARTS if self.compact else 0


class ParquetStreamWriter:
    """Background writer of one rank's tables under ``run_dir``.

    ``submit(table, payload, n_rows)`` never blocks and never raises: it appends to a ``deque`` (atomic
    in CPython, no lock) that the writer thread drains, and drops (and counts) rows once more than
    ``max_pending_rows`` wait. ``flush()`` waits until what was submitted before it is on disk;
    ``close()`` flushes, compacts and stops the thread. Each counter is written by one thread only (the
    compaction thread writes only ``last_error``).

    The writer holds ``<run_dir>/.writer-rank<R>.lock`` (``flock``) while it lives: a second writer of the
    same run and rank, in this process or another, writes nothing and says why in ``refused`` (its rows
    are counted as dropped) instead of overwriting the first one's parts.

    Compaction keeps a long run's file count small: once ``compact_parts`` parts of one level (a flush's
    part is level 0, a merge of level-``k`` parts is level ``k + 1``) and fewer than ``compact_rows`` rows
    each have piled up, a compaction thread rewrites them as one ``part-A-B.parquet``, reading one row
    group at a time (then the originals are deleted; readers skip parts inside a compacted range, so
    nothing is read twice). Merging by level (as a log-structured store does) writes each row about
    ``log_{compact_parts}(flushes)`` times, not once per compaction; ``close()`` compacts whatever small
    parts are left into one. ``compact_parts=0`` turns compaction off.
    """

    def __init__(
        self,
        run_dir: str | os.PathLike[str],
        rank: int = 0,
        *,
        flush_interval_s: float = 2.0,
        flush_rows: int = 200_000,
        max_pending_rows: int = 4_000_000,
        compression: str = "snappy",
        compact_parts: int = COMPACT_PARTS,
        compact_rows: int = 1_000_000,
        refused: str = "",
    ) -> None:
        check_writer_settings(flush_interval_s, flush_rows, max_pending_rows, compact_parts, compact_rows)
        self.run_dir = Path(run_dir)
        self.rank = rank
        self.flush_interval_s = flush_interval_s
        self.flush_rows = flush_rows
        self.max_pending_rows = max_pending_rows
        self.compression = compression
        self.compact_parts = compact_parts
        self.compact_rows = compact_rows
        self._written_parts: dict[str, list[_Part]] = {}
        self._parts_lock = threading.Lock()  # _written_parts: appended by the writer, merged by the compactor
        self._compact_due = threading.Event()
        self._stopping = False
        self._compact_at_close = True
        self._pending: collections.deque[Any] = collections.deque()
        self._wake = threading.Event()
        self._buffers: dict[str, list[Any]] = {}
        self._buffered_rows: dict[str, int] = {}
        self._next_part: dict[str, int] = {}
        # training-thread counters
        self._submitted = 0
        self._refused = 0
        self._refused_reason = ""
        # writer-thread counters
        self._taken = 0
        self._written = 0
        self._failed = 0
        self._parts = 0
        self._errors = 0
        self._error = ""
        self._closed = False
        self.refused = refused
        """Why this writer writes nothing ("" when it writes): another writer holds this run and rank (here,
        or an object store's lease: ``refused`` given by the caller)."""
        self._lock_fd = None if refused else self._take_lock()
        self._thread = threading.Thread(target=self._run, name=f"sorl-writer-rank{rank}", daemon=True)
        self._compactor = (
            threading.Thread(target=self._compact_loop, name=f"sorl-compactor-rank{rank}", daemon=True)
            if compact_parts and not self.refused
            else None
        )
        if not self.refused:
            self._thread.start()
        if self._compactor is not None:
            self._compactor.start()

    # ------------------------------------------------------------------ training-thread side
    def submit(self, table: str, payload: Any, n_rows: int) -> bool:
        """Queue ``n_rows`` rows for ``table``; returns False (and counts them dropped) if they cannot be."""
        self._submitted += n_rows
        waiting = self._submitted - self._refused - self._taken
        if self._closed or waiting > self.max_pending_rows or not self._thread.is_alive():
            self._refused += n_rows
            self._refused_reason = self.refused or (
                "writer is closed" if self._closed else "queue full (writer behind)"
            )
            return False
        self._pending.append((table, payload, n_rows))
        if waiting >= self.flush_rows:
            self._wake.set()
        return True

    def flush(self, timeout: float | None = 30.0) -> bool:
        """Write everything submitted so far; True if the writer caught up within ``timeout`` seconds."""
        if self._closed or not self._thread.is_alive():
            return False
        done = threading.Event()
        self._pending.append(done)
        self._wake.set()
        return done.wait(timeout)

    def close(self, timeout: float | None = 60.0, *, compact: bool = True) -> None:
        """Flush what is queued and stop the thread (idempotent); ``compact=False`` leaves small parts as
        they are and does not wait for a merge under way (a process being terminated should exit)."""
        if self._closed:
            return
        self._closed = True
        self._compact_at_close = compact
        self._pending.append(_STOP)
        self._wake.set()
        if self._thread.ident is not None:
            self._thread.join(timeout)

    @property
    def rows_dropped(self) -> int:
        """Rows dropped so far (a cheap read for every step)."""
        return self._refused + self._failed

    def stats(self) -> WriterStats:
        """A snapshot of the counters."""
        return WriterStats(
            rows_submitted=self._submitted,
            rows_written=self._written,
            rows_dropped=self.rows_dropped,
            parts_written=self._parts,
            write_errors=self._errors,
            last_error=self._error or self._refused_reason,
        )

    # ------------------------------------------------------------------ writer-thread side
    def _run(self) -> None:
        deadline = time.monotonic() + self.flush_interval_s
        while True:
            self._wake.wait(max(0.0, deadline - time.monotonic()))
            self._wake.clear()
            while True:
                try:
                    item = self._pending.popleft()
                except IndexError:
                    break
                if item is _STOP:
                    self._flush_all()
                    self._stop_compactor()
                    self._release_lock()
                    return
                if isinstance(item, threading.Event):
                    self._flush_all()
                    item.set()
                    continue
                table, payload, n_rows = item
                self._taken += n_rows
                self._buffers.setdefault(table, []).append(payload)
                self._buffered_rows[table] = self._buffered_rows.get(table, 0) + n_rows
                if self._buffered_rows[table] >= self.flush_rows:
                    self._flush(table)
            if time.monotonic() >= deadline:
                self._flush_all()
                deadline = time.monotonic() + self.flush_interval_s

    def _flush_all(self) -> None:
        """Write every table's buffer, the smallest first: a large ``turns`` write never holds back ``steps``."""
        for table in sorted(self._buffers, key=lambda name: self._buffered_rows.get(name, 0)):
            self._flush(table)

    def _part_number(self, folder: Path, table: str) -> int:
        """Next free part number in ``folder`` (continues a resumed run's numbering)."""
        if table not in self._next_part:
            existing = [r[1] for p in folder.iterdir() if (r := part_range(p.name))]
            self._next_part[table] = max(existing, default=-1) + 1
        number = self._next_part[table]
        self._next_part[table] += 1
        return number

    def _flush(self, table: str) -> None:
        payloads = self._buffers.pop(table, [])
        n_rows = self._buffered_rows.pop(table, 0)
        for data, rows in self._conformed(table, payloads, n_rows):
            self._write_part(table, data, rows)

    def _conformed(self, table: str, payloads: list[Any], n_rows: int) -> list[tuple[pa.Table, int]]:
        """The buffered payloads as conformed tables with their row counts: one table normally.

        If they cannot be conformed together (a value a known column's type cannot hold, such as text
        in ``loss``), each payload is conformed on its own, those with one schema share a part, and only
        a payload that cannot be conformed is dropped and counted: one bad value never costs the flush.
        """
        if not payloads:
            return []
        try:
            return [(conform(table, to_arrow(payloads)), n_rows)]
        except Exception:  # noqa: BLE001 - fall back to conforming each payload on its own
            pass
        groups: dict[pa.Schema, list[pa.Table]] = {}
        for payload in payloads:
            try:
                data = conform(table, to_arrow([payload]))
            except Exception as error:  # noqa: BLE001
                self._errors += 1
                self._failed += _payload_rows(payload)
                self._error = f"{table}: {type(error).__name__}: {error}"
                continue
            groups.setdefault(data.schema, []).append(data)
        return [(pa.concat_tables(group), sum(t.num_rows for t in group)) for group in groups.values()]

    def _write_part(self, table: str, data: pa.Table, n_rows: int) -> None:
        try:
            folder = self.run_dir / table / f"rank={self.rank}"
            folder.mkdir(parents=True, exist_ok=True)
            number = self._part_number(folder, table)
            path = self._write_file(data, folder / f"part-{number:06d}.parquet")
        except Exception as error:  # noqa: BLE001 - a failed write must never reach the training loop
            self._errors += 1
            self._failed += n_rows
            self._error = f"{table}: {type(error).__name__}: {error}"
            return
        self._written += n_rows
        self._parts += 1
        with self._parts_lock:
            parts = self._written_parts.setdefault(table, [])
            parts.append(_Part(number, number, n_rows, path))
            due = self.compact_parts > 0 and self._due_run(parts) is not None
        if due:
            self._compact_due.set()

    def _write_file(self, data: pa.Table, path: Path) -> Path:
        """Write ``data`` to ``path`` all or nothing: to ``path.tmp``, then ``os.replace``."""
        tmp = path.with_name(path.name + ".tmp")
        try:
            exact = _non_float_columns(data.schema)
            pq.write_table(
                data, tmp, compression=self.compression, write_statistics=exact, use_dictionary=exact
            )
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
        return path

    def _take_lock(self) -> int | None:
        """Hold this run's writer lock for ``rank``; ``None`` (and ``refused`` set) if another writer holds it.

        Where the lock file cannot be made or the file system has no locks, the writer goes on unlocked.
        """
        try:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.run_dir / f".writer-rank{self.rank}.lock", os.O_RDWR | os.O_CREAT, 0o644)
        except OSError:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "another writer"
            os.close(fd)
            self.refused = f"run {self.run_dir.name!r} rank {self.rank} is being written by {holder}"
            return None
        except OSError:
            os.close(fd)
            return None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}".encode(), 0)
        return fd

    def _release_lock(self) -> None:
        if self._lock_fd is not None:
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)  # for a forked child holding a copy too
            os.close(self._lock_fd)
            self._lock_fd = None

    # ------------------------------------------------------------------ compaction thread
    def _due_run(self, parts: list[_Part], force: bool = False) -> tuple[int, int] | None:
        """``(start, end)`` of the parts to merge next, or None (call with the lock held).

        Levels never rise from older to newer parts, so each level's parts sit in a row; a level is due
        once ``compact_parts`` of its parts (each under ``compact_rows`` rows) are there, the lowest first.
        With ``force`` (at close): the trailing parts under ``compact_rows`` rows whatever their level,
        once there are two.
        """
        end = len(parts)
        if force:
            start = end
            while start > 0 and parts[start - 1].rows < self.compact_rows:
                start -= 1
            return (start, end) if end - start >= 2 else None
        while end > 0:
            level, start = parts[end - 1].level, end
            while start > 0 and parts[start - 1].level == level and parts[start - 1].rows < self.compact_rows:
                start -= 1
            if end - start >= self.compact_parts:
                return start, end
            if start == end:  # the newest part is already large: nothing older is small
                return None
            end = start
        return None

    def _stop_compactor(self) -> None:
        """Let the compaction thread end: after merging the leftovers when compacting at close."""
        if self._compactor is None:
            return
        self._stopping = True
        self._compact_due.set()
        if self._compact_at_close:
            self._compactor.join()

    def _compact_loop(self) -> None:
        while True:
            self._compact_due.wait()
            self._compact_due.clear()
            stopping = self._stopping
            if stopping and not self._compact_at_close:
                return
            for table in list(self._written_parts):
                while self._compact(table, force=stopping):  # a merge can make the next level due
                    pass
            if stopping:
                return

    def _compact(self, table: str, force: bool = False) -> bool:
        """Rewrite the run of parts ``_due_run`` names as one ``part-A-B.parquet``, then delete them; True
        if it did. The parts of a run hold contiguous flush numbers. A failure leaves the parts as they
        were (nothing is lost) and is recorded in ``last_error``.
        """
        with self._parts_lock:
            parts = self._written_parts.get(table, [])
            run = self._due_run(parts, force)
            if run is None:
                return False
            merged_parts = parts[run[0] : run[1]]
        first, last = merged_parts[0].first, merged_parts[-1].last
        path = merged_parts[0].path.with_name(f"part-{first:06d}-{last:06d}.parquet")
        try:
            rows = self._merge(merged_parts, path)
        except Exception as error:  # noqa: BLE001 - compaction is an optimisation; the parts stay readable
            self._error = f"{table}: compaction failed: {type(error).__name__}: {error}"
            return False
        level = 1 + max(part.level for part in merged_parts)
        with self._parts_lock:  # the writer appended meanwhile; the merged ones are still in a row
            at = next(i for i, part in enumerate(parts) if part is merged_parts[0])
            parts[at : at + len(merged_parts)] = [_Part(first, last, rows, path, level)]
        for part in merged_parts:
            part.path.unlink(missing_ok=True)
        return True

    def _merge(self, parts: list[_Part], path: Path) -> int:
        """Write the rows of ``parts`` to ``path`` all or nothing, ``MERGE_ROWS`` rows in memory at a time;
        returns the row count. Each part is opened (its footer read) once and decoded on this thread alone
        (no Arrow thread pool taking the trainer's cores)."""
        tmp = path.with_name(path.name + ".tmp")
        rows, held, held_rows = 0, [], 0
        try:
            with contextlib.ExitStack() as opened:
                sources = [opened.enter_context(pq.ParquetFile(part.path)) for part in parts]
                schema = pa.unify_schemas([s.schema_arrow for s in sources], promote_options="permissive")
                exact = _non_float_columns(schema)
                with pq.ParquetWriter(
                    tmp, schema, compression=self.compression, write_statistics=exact, use_dictionary=exact
                ) as out:
                    for source in sources:
                        for batch in source.iter_batches(batch_size=MERGE_ROWS, use_threads=False):
                            held.append(batch if batch.schema == schema else _aligned(batch, schema))
                            held_rows += batch.num_rows
                            if held_rows >= MERGE_ROWS:
                                out.write_table(pa.Table.from_batches(held), row_group_size=held_rows)
                                rows, held, held_rows = rows + held_rows, [], 0
                    if held:
                        out.write_table(pa.Table.from_batches(held), row_group_size=held_rows)
                        rows += held_rows
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
        return rows


MERGE_ROWS = 131_072
"""Rows a compaction holds in memory at a time (and the row-group size of a merged part)."""


def _aligned(batch: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    """``batch`` with ``schema``'s columns in its order: missing ones null, others cast to its types."""
    columns = []
    for field in schema:
        index = batch.schema.get_field_index(field.name)
        column = pa.nulls(batch.num_rows, field.type) if index < 0 else batch.column(index)
        columns.append(column if column.type == field.type else column.cast(field.type))
    return pa.RecordBatch.from_arrays(columns, schema=schema)


@dataclass
class _Part:
    """A part file this writer wrote: the flush numbers it holds, its rows, its path and its merge level
    (0: written by one flush; ``k + 1``: merged from level-``k`` parts)."""

    first: int
    last: int
    rows: int
    path: Path
    level: int = 0


def _non_float_columns(schema: pa.Schema) -> list[str]:
    """Columns written with min/max statistics and dictionary encoding: all but floating-point ones.

    Statistics: Parquet's float statistics leave NaN out, and DuckDB (2.0, duckdb/duckdb#25521) trusts
    them: with ``max`` finite it folds ``isnan(x)`` to false and drops NaN rows from ``x > c``, so a run's
    NaN loss would be invisible to a query. Without float statistics DuckDB reads the values as they are.
    Dictionary: metric floats rarely repeat, so pyarrow builds each float dictionary only to abandon it;
    leaving floats plain nearly doubles the write rate (``benchmarks/bench_writer.py``) for files within
    a few percent of the size (measured on ``sample_logs``).
    """
    return [field.name for field in schema if not pa.types.is_floating(field.type)]


def _payload_rows(payload: Any) -> int:
    """Rows in one queued payload (a list of row dicts, a dict of columns, or Arrow data)."""
    if isinstance(payload, list):
        return len(payload)
    if isinstance(payload, pa.Table | pa.RecordBatch):
        return payload.num_rows
    return len(next(iter(payload.values()), []))
