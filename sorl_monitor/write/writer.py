"""Crash-safe, non-blocking Parquet streaming: a background thread behind a bounded queue.

The training thread only calls ``submit`` (a lock-free ``deque.append``). The writer thread turns what is queued
into Arrow tables (``arrow_rows``) and writes ``<run_dir>/<table>/rank=R/part-NNNNNN.parquet`` every
``flush_interval_s`` seconds or ``flush_rows`` rows per table: to ``part-N.parquet.tmp`` first, then
``os.replace`` (``part_files``), so a reader never sees a half-written file and a crash (even SIGKILL) loses at
most what was queued since the last flush. A full queue or a failing disk never raises into the caller:
the rows are dropped and counted (``stats()``). One writer per run and rank (``writer_lock``): a second one is
refused (``refused``), never let to overwrite the first one's parts. Compaction runs on a thread of its own
(``compaction``), so merging parts never delays a flush.
"""

from __future__ import annotations

import collections
import os
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from sorl_monitor.schema import conform, part_range
from sorl_monitor.settings import check_writer_settings
from sorl_monitor.write.arrow_rows import payload_rows, to_arrow
from sorl_monitor.write.compaction import COMPACT_PARTS, Compactor, Part
from sorl_monitor.write.part_files import write_part_file
from sorl_monitor.write.writer_lock import release_writer_lock, take_writer_lock

_STOP = object()


@dataclass
class WriterStats:
    """Counters of one writer: rows queued, written and dropped (queue full or failed write), parts, errors."""

    rows_submitted: int = 0
    rows_written: int = 0
    rows_dropped: int = 0
    parts_written: int = 0
    write_errors: int = 0
    last_error: str = ""


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

    Compaction keeps a long run's file count small: once ``compact_parts`` parts of one level and fewer than
    ``compact_rows`` rows each have piled up, ``compactor`` (``compaction.Compactor``, ``compactor_class``)
    merges them on its own thread; ``close()`` compacts whatever small parts are left into one.
    ``compact_parts=0`` turns compaction off.
    """

    compactor_class: type[Compactor] = Compactor

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
        self._compact_at_close = True
        self.refused = refused
        """Why this writer writes nothing ("" when it writes): another writer holds this run and rank (here,
        or an object store's lease: ``refused`` given by the caller)."""
        self._lock_fd: int | None = None
        if not refused:
            self._lock_fd, held_by = take_writer_lock(self.run_dir, rank)
            self.refused = held_by
        self._thread = threading.Thread(target=self._run, name=f"sorl-writer-rank{rank}", daemon=True)
        if not self.refused:
            self._thread.start()
        self.compactor = (
            self.compactor_class(rank, compact_parts, compact_rows, compression, self._compaction_failed)
            if compact_parts and not self.refused
            else None
        )
        """The compaction thread's owner (``None`` when compaction is off or the writer was refused)."""

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
                    if self.compactor is not None:
                        self.compactor.stop(compact=self._compact_at_close)
                    if self._lock_fd is not None:
                        release_writer_lock(self._lock_fd)
                        self._lock_fd = None
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
                self._failed += payload_rows(payload)
                self._error = f"{table}: {type(error).__name__}: {error}"
                continue
            groups.setdefault(data.schema, []).append(data)
        return [(pa.concat_tables(group), sum(t.num_rows for t in group)) for group in groups.values()]

    def _write_part(self, table: str, data: pa.Table, n_rows: int) -> None:
        try:
            folder = self.run_dir / table / f"rank={self.rank}"
            folder.mkdir(parents=True, exist_ok=True)
            number = self._part_number(folder, table)
            path = write_part_file(data, folder / f"part-{number:06d}.parquet", self.compression)
        except Exception as error:  # noqa: BLE001 - a failed write must never reach the training loop
            self._errors += 1
            self._failed += n_rows
            self._error = f"{table}: {type(error).__name__}: {error}"
            return
        self._written += n_rows
        self._parts += 1
        if self.compactor is not None:
            self.compactor.added(table, Part(number, number, n_rows, path))

    def _compaction_failed(self, message: str) -> None:
        """The compaction thread's only write to the writer's counters."""
        self._error = message
