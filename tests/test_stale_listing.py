"""A reader's listing of a table can be stale by the time it checks the files: a compaction between the
directory scan and the check writes ``part-A-B`` and deletes ``A…B``. The catalog lists again rather than
show fewer rows for one refresh. The race is made deterministic here by handing the catalog a stale listing."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from sorl_monitor.read import catalog
from sorl_monitor.read.query import open_runs
from sorl_monitor.schema import has_flush_gaps
from sorl_monitor.write.writer import ParquetStreamWriter


def written(run: Path, flushes: int) -> list[Path]:
    """``flushes`` single-row parts of ``steps`` written by the real writer, compaction off."""
    writer = ParquetStreamWriter(run, compact_parts=0)
    for step in range(flushes):
        writer.submit("steps", [{"run_id": "run", "step": step}], 1)
        assert writer.flush()
    writer.close()
    return sorted((run / "steps" / "rank=0").glob("part-*.parquet"))


def compact_by_hand(sources: list[Path], first: int, last: int) -> Path:
    """What the writer's compaction does: write ``part-first-last``, then delete the parts it holds."""
    merged = sources[0].with_name(f"part-{first:06d}-{last:06d}.parquet")
    pq.write_table(pa.concat_tables([pq.read_table(p) for p in sources]), merged)
    for path in sources:
        path.unlink()
    return merged


def stale_once(monkeypatch, listing: list[str]) -> list[Path]:
    """Make the catalog's next scan of a ``steps`` folder return ``listing``; returns those scans' folders."""
    calls, real = [], catalog.list_parts

    def scan(folder: Path) -> list[str]:
        if folder.name != "steps":
            return real(folder)
        calls.append(folder)
        return listing if len(calls) == 1 else real(folder)

    monkeypatch.setattr(catalog, "list_parts", scan)
    return calls


def steps(runs) -> list[int]:
    return runs.sql("SELECT step FROM steps ORDER BY step").column(0).to_pylist()


def test_a_listing_naming_parts_compacted_away_is_taken_again_and_no_row_is_hidden(tmp_path, monkeypatch):
    sources = written(tmp_path / "run", 4)
    with open_runs(tmp_path) as runs:
        assert steps(runs) == [0, 1, 2, 3]
        compact_by_hand(sources, 0, 3)
        calls = stale_once(monkeypatch, [str(p) for p in sources])  # scanned just before the compaction
        runs.refresh()
        assert steps(runs) == [0, 1, 2, 3]
        assert len(calls) == 2


def test_a_listing_with_a_hole_in_the_flush_numbers_is_taken_again(tmp_path, monkeypatch):
    sources = written(tmp_path / "run", 3)
    with open_runs(tmp_path) as runs:
        calls = stale_once(monkeypatch, [str(sources[0]), str(sources[2])])  # the scan missed part 1
        runs.refresh()
        assert steps(runs) == [0, 1, 2]
        assert len(calls) == 2


def test_a_hole_the_next_listing_repeats_is_read_as_it_is(tmp_path, monkeypatch):
    sources = written(tmp_path / "run", 3)
    sources[1].unlink()  # lost for good (a crash): two listings agree, and the reader goes on without it
    with open_runs(tmp_path) as runs:
        calls = stale_once(monkeypatch, [str(sources[0]), str(sources[2])])
        runs.refresh()
        assert steps(runs) == [0, 2]
        assert len(calls) == 2


def test_flush_gaps_are_counted_per_rank_folder_between_the_first_and_last_part():
    folder0, folder1 = "run/steps/rank=0", "run/steps/rank=1"
    assert not has_flush_gaps([f"{folder0}/part-000000-000003.parquet", f"{folder0}/part-000004.parquet"])
    assert not has_flush_gaps([f"{folder0}/part-000002.parquet", f"{folder1}/part-000000.parquet"])
    assert has_flush_gaps([f"{folder0}/part-000000-000001.parquet", f"{folder0}/part-000003.parquet"])
    assert not has_flush_gaps([])
