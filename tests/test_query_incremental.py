"""``RunSet.read_new``: each part read once, compaction read again in full, corrupt parts listed with the reason."""

from __future__ import annotations

import warnings
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch

from sorl_monitor import Monitor, WriterConfig
from sorl_monitor.read.query import CorruptPartWarning, PartsRead, open_runs


def log_updates(mon: Monitor, n: int) -> None:
    """``n`` updates of random batches, each flushed to its own part."""
    g = torch.Generator().manual_seed(mon.last_step + 1)
    mask = torch.tensor([[1, 1, 1, 0, 0, 1, 1, 1, 0, 1, 1, 1]] * 4)
    for _ in range(n):
        logp = -torch.rand(4, 12, generator=g)
        mon.log_update(logp=logp, old_logp=logp + 0.2 * torch.randn(4, 12, generator=g), mask=mask)
        assert mon.flush()


def steps_read(rows) -> list[int]:
    return sorted(rows.column("step").to_pylist())


def test_each_part_is_read_once_and_new_parts_on_the_next_call(tmp_path):
    with Monitor(tmp_path, "run", writer=WriterConfig(flush_interval_s=3600, compact=False)) as mon:
        log_updates(mon, 3)
        runs = open_runs(tmp_path)
        seen = PartsRead()
        first = runs.read_new("run", "steps", seen)
        nothing = runs.read_new("run", "steps", seen)
        log_updates(mon, 2)
        runs.refresh()
        second = runs.read_new("run", "steps", seen)
    runs.close()

    assert steps_read(first.rows) == [0, 1, 2] and not first.reset
    assert nothing.rows is None
    assert steps_read(second.rows) == [3, 4] and not second.reset
    assert len(seen.files) == 5


def test_parts_compacted_after_they_were_read_are_read_again_as_a_whole(tmp_path):
    with Monitor(tmp_path, "run", writer=WriterConfig(flush_interval_s=3600)) as mon:
        log_updates(mon, 3)
        runs = open_runs(tmp_path)
        seen = PartsRead()
        runs.read_new("run", "steps", seen)
        log_updates(mon, 2)
    # closing compacted every steps part into one part-A-B file
    runs.refresh()
    again = runs.read_new("run", "steps", seen)
    runs.close()

    assert again.reset
    assert steps_read(again.rows) == [0, 1, 2, 3, 4]
    assert len(seen.files) == 1 and "-" in Path(next(iter(seen.files))).stem.removeprefix("part-")


def test_a_truncated_part_is_left_out_and_listed_with_its_reason(tmp_path):
    with Monitor(tmp_path, "run", writer=WriterConfig(flush_interval_s=3600, compact=False)) as mon:
        log_updates(mon, 4)
    victim = sorted((tmp_path / "run" / "steps" / "rank=0").glob("part-*.parquet"))[1]
    victim.write_bytes(victim.read_bytes()[:60])

    with pytest.warns(CorruptPartWarning, match=victim.name), open_runs(tmp_path) as runs:
        rows = runs.read_new("run", "steps", PartsRead()).rows
        skipped = runs.skipped_parts("run")

    assert steps_read(rows) == [0, 2, 3]
    assert [(part.path, part.table) for part in skipped] == [(str(victim.resolve()), "steps")]
    assert skipped[0].reason and "\n" not in skipped[0].reason


def test_a_part_whose_data_does_not_read_is_left_out_of_the_read_and_of_the_views(tmp_path):
    with Monitor(tmp_path, "run", writer=WriterConfig(flush_interval_s=3600, compact=False)) as mon:
        log_updates(mon, 4)
    victim = sorted((tmp_path / "run" / "turns" / "rank=0").glob("part-*.parquet"))[2]
    data = bytearray(victim.read_bytes())
    footer = pq.read_metadata(victim).serialized_size + 8
    data[4 : len(data) - footer] = b"\xab" * (len(data) - footer - 4)
    victim.write_bytes(bytes(data))

    with warnings.catch_warnings(record=True), open_runs(tmp_path) as runs:
        warnings.simplefilter("always")
        assert runs.skipped_parts() == []  # the footer reads: nothing known yet
        rows = runs.read_new("run", "turns", PartsRead()).rows
        in_view = runs.sql("SELECT DISTINCT step FROM turns ORDER BY step").column("step").to_pylist()
        skipped = runs.skipped_parts("run")

    assert sorted(set(rows.column("step").to_pylist())) == [0, 1, 3] == in_view
    assert [part.path for part in skipped] == [str(victim.resolve())]


def test_skipped_parts_are_listed_per_run(tmp_path):
    for name in ("a", "b"):
        with Monitor(tmp_path, name, writer=WriterConfig(flush_interval_s=3600, compact=False)) as mon:
            log_updates(mon, 2)
    (tmp_path / "b" / "steps" / "rank=0" / "part-999999.parquet").write_bytes(b"PAR1 not parquet")

    with warnings.catch_warnings(record=True), open_runs(tmp_path) as runs:
        warnings.simplefilter("always")
        assert runs.skipped_parts("a") == []
        assert [Path(part.path).name for part in runs.skipped_parts("b")] == ["part-999999.parquet"]
