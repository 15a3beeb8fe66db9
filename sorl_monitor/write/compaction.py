"""Compaction: a writer's small part files merged by level, on a thread of its own, so merging never delays a flush.

Once ``compact_parts`` parts of one level (a flush's part is level 0, a merge of level-``k`` parts is level
``k + 1``) and fewer than ``compact_rows`` rows each have piled up, the compaction thread rewrites them as one
``part-A-B.parquet``, reading one row group at a time (then the originals are deleted; readers skip parts inside
a compacted range, so nothing is read twice). Merging by level (as a log-structured store does) writes each row
about ``log_{compact_parts}(flushes)`` times, not once per compaction; at close, whatever small parts are left
are merged into one.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from sorl_monitor.write.part_files import exact_columns

COMPACT_PARTS = 32
"""Parts of one level merged into one by compaction (``ParquetStreamWriter.compact_parts``'s default)."""
MERGE_ROWS = 131_072
"""Rows a compaction holds in memory at a time (and the row-group size of a merged part)."""


@dataclass
class Part:
    """A part file this writer wrote: the flush numbers it holds, its rows, its path and its merge level
    (0: written by one flush; ``k + 1``: merged from level-``k`` parts)."""

    first: int
    last: int
    rows: int
    path: Path
    level: int = 0


class Compactor:
    """Merges the parts one writer wrote (``added``), on a thread of its own; ``stop`` at the writer's close.

    The parts list is shared with the writer thread under a lock: the writer appends, the compactor replaces a
    run of parts by their merge. A failed merge leaves the parts as they were and calls ``report`` with why.
    """

    def __init__(
        self,
        rank: int,
        compact_parts: int,
        compact_rows: int,
        compression: str,
        report: Callable[[str], None],
    ) -> None:
        self.compact_parts = compact_parts
        self.compact_rows = compact_rows
        self.compression = compression
        self._report = report
        self._parts: dict[str, list[Part]] = {}
        self._lock = threading.Lock()
        self._due = threading.Event()
        self._stopping = False
        self._at_close = True
        self._thread = threading.Thread(target=self.run, name=f"sorl-compactor-rank{rank}", daemon=True)
        self._thread.start()

    def added(self, table: str, part: Part) -> None:
        """The writer wrote ``part`` of ``table``: wake the thread if a merge is due."""
        with self._lock:
            parts = self._parts.setdefault(table, [])
            parts.append(part)
            due = self.due_run(parts) is not None
        if due:
            self._due.set()

    def stop(self, compact: bool) -> None:
        """Let the thread end: after merging the leftovers (waited for) when ``compact``, else at once."""
        self._at_close = compact
        self._stopping = True
        self._due.set()
        if compact:
            self._thread.join()

    def run(self) -> None:
        while True:
            self._due.wait()
            self._due.clear()
            stopping = self._stopping
            if stopping and not self._at_close:
                return
            for table in list(self._parts):
                while self.compact(table, force=stopping):  # a merge can make the next level due
                    pass
            if stopping:
                return

    def due_run(self, parts: list[Part], force: bool = False) -> tuple[int, int] | None:
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

    def compact(self, table: str, force: bool = False) -> bool:
        """Rewrite the run of parts ``due_run`` names as one ``part-A-B.parquet``, then delete them; True
        if it did. The parts of a run hold contiguous flush numbers. A failure leaves the parts as they
        were (nothing is lost) and is reported (the writer's ``last_error``).
        """
        with self._lock:
            parts = self._parts.get(table, [])
            run = self.due_run(parts, force)
            if run is None:
                return False
            merged_parts = parts[run[0] : run[1]]
        first, last = merged_parts[0].first, merged_parts[-1].last
        path = merged_parts[0].path.with_name(f"part-{first:06d}-{last:06d}.parquet")
        try:
            rows = self.merge(merged_parts, path)
        except Exception as error:  # noqa: BLE001 - compaction is an optimisation; the parts stay readable
            self._report(f"{table}: compaction failed: {type(error).__name__}: {error}")
            return False
        level = 1 + max(part.level for part in merged_parts)
        with self._lock:  # the writer appended meanwhile; the merged ones are still in a row
            at = next(i for i, part in enumerate(parts) if part is merged_parts[0])
            parts[at : at + len(merged_parts)] = [Part(first, last, rows, path, level)]
        for part in merged_parts:
            part.path.unlink(missing_ok=True)
        return True

    def merge(self, parts: list[Part], path: Path) -> int:
        """Write the rows of ``parts`` to ``path`` all or nothing, ``MERGE_ROWS`` rows in memory at a time;
        returns the row count. Each part is opened (its footer read) once and decoded on this thread alone
        (no Arrow thread pool taking the trainer's cores)."""
        tmp = path.with_name(path.name + ".tmp")
        rows, held, held_rows = 0, [], 0
        try:
            with contextlib.ExitStack() as opened:
                sources = [opened.enter_context(pq.ParquetFile(part.path)) for part in parts]
                schema = pa.unify_schemas([s.schema_arrow for s in sources], promote_options="permissive")
                exact = exact_columns(schema)
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


def _aligned(batch: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    """``batch`` with ``schema``'s columns in its order: missing ones null, others cast to its types."""
    columns = []
    for field in schema:
        index = batch.schema.get_field_index(field.name)
        column = pa.nulls(batch.num_rows, field.type) if index < 0 else batch.column(index)
        columns.append(column if column.type == field.type else column.cast(field.type))
    return pa.RecordBatch.from_arrays(columns, schema=schema)
