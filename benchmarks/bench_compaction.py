"""Compaction's write amplification on a long run, measured in one run (not a test).

The writer merges part files by level (``compact_parts`` parts of one level become one part of the next).
Before, a merged part under ``compact_rows`` rows counted as one of the next ``compact_parts`` small
parts, so every compaction rewrote the whole growing merged file. Both rules run here on the same
flushes (the old one emulated by overriding ``Compactor.due_run``), each merge finishing before the next flush
as in a real run: rows rewritten per row logged, compaction time, and the part files left at the end.

    python benchmarks/bench_compaction.py [--flushes 2048] [--rows 200] [--compact-parts 32]
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from sorl_monitor.read.query import open_runs
from sorl_monitor.write.compaction import Compactor
from sorl_monitor.write.writer import ParquetStreamWriter


class MeasuredCompactor(Compactor):
    """The compactor, counting the rows and seconds its merges take; ``settle()`` waits until no merge is due
    or running, as in a real run, where a merge ends long before the next is due (flushes 2 s apart)."""

    def __init__(self, *args, **kwargs) -> None:
        self.merged_rows = 0
        self.merge_seconds = 0.0
        self.idle = threading.Event()
        self.idle.set()
        super().__init__(*args, **kwargs)

    def run(self) -> None:
        while True:
            self._due.wait()
            self.idle.clear()  # before the due flag clears, so settle() never sees neither
            self._due.clear()
            stopping = self._stopping
            if stopping and not self._at_close:
                return
            for table in list(self._parts):
                while self.compact(table, force=stopping):
                    pass
            self.idle.set()
            if stopping:
                return

    def settle(self) -> None:
        while self._due.is_set() or not self.idle.is_set():
            time.sleep(0.0005)

    def merge(self, parts, path):
        started = time.perf_counter()
        rows = super().merge(parts, path)
        self.merge_seconds += time.perf_counter() - started
        self.merged_rows += rows
        return rows


class GrowingMergeCompactor(MeasuredCompactor):
    """The previous rule: the trailing parts under ``compact_rows`` rows, whatever their level."""

    def due_run(self, parts, force=False):
        start = len(parts)
        while start > 0 and parts[start - 1].rows < self.compact_rows:
            start -= 1
        return (start, len(parts)) if len(parts) - start >= (2 if force else self.compact_parts) else None


class MeasuredWriter(ParquetStreamWriter):
    compactor_class = MeasuredCompactor


class GrowingMergeWriter(ParquetStreamWriter):
    compactor_class = GrowingMergeCompactor


def run(cls: type[ParquetStreamWriter], folder: Path, flushes: int, rows: int, compact_parts: int) -> dict:
    rng = np.random.default_rng(0)
    writer = cls(folder, compact_parts=compact_parts, flush_interval_s=3600)
    started = time.perf_counter()
    for flush in range(flushes):
        steps = np.arange(flush * rows, (flush + 1) * rows)
        columns = {"step": steps, **{f"m{i}": rng.standard_normal(rows) for i in range(40)}}
        writer.submit("steps", columns, rows)
        writer.flush()
        writer.compactor.settle()
    writer.close()
    seconds = time.perf_counter() - started
    with open_runs(folder) as runs:
        read = runs.sql("SELECT count(*), count(DISTINCT step) FROM steps").to_pylist()[0]
    files = len(list((folder / "steps" / "rank=0").glob("part-*.parquet")))
    compactor = writer.compactor
    return {"rewritten": compactor.merged_rows / (flushes * rows), "merge_s": compactor.merge_seconds,
            "total_s": seconds, "files": files, "rows_read": read}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--flushes", type=int, default=2048)
    parser.add_argument("--rows", type=int, default=200, help="rows per flush (41 columns)")
    parser.add_argument("--compact-parts", type=int, default=32)
    args = parser.parse_args()
    total = args.flushes * args.rows
    print(f"{args.flushes} flushes × {args.rows} rows = {total:,} rows, compact_parts={args.compact_parts}")
    results = {}
    for label, cls in (
        ("growing merged part (before)", GrowingMergeWriter),
        ("by level (now)", MeasuredWriter),
    ):
        with tempfile.TemporaryDirectory() as tmp:
            results[label] = r = run(cls, Path(tmp) / "run", args.flushes, args.rows, args.compact_parts)
        assert tuple(r["rows_read"].values()) == (total, total), r["rows_read"]
        print(f"{label:<29} rows rewritten per row {r['rewritten']:6.2f}   merging {r['merge_s']:6.1f} s   "
              f"end to end {r['total_s']:6.1f} s   files at the end {r['files']}")  # fmt: skip
    before, now = results.values()
    print(
        f"ratio before / now: rows rewritten {before['rewritten'] / now['rewritten']:.1f}×, "
        f"merge time {before['merge_s'] / now['merge_s']:.1f}×, end to end {before['total_s'] / now['total_s']:.2f}×"
    )


if __name__ == "__main__":
    main()
