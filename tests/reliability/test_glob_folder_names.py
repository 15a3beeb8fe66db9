"""Folder names with glob characters (``*``, ``?``, ``[]``) are names, not patterns: DuckDB reads each
part file list as glob patterns, so ``logs/a[x]`` once read the parts of a sibling ``logs/ax``."""

from __future__ import annotations

import pytest

from sorl_monitor import Monitor, WriterConfig
from sorl_monitor.read.query import PartsRead, open_runs

# each name and a sibling folder its unescaped pattern matches
GLOB_NAMES = [("a[x]", "ax"), ("s*t", "sXt"), ("q?", "qZ"), ("e[f", "e[f-other")]


@pytest.mark.parametrize(("name", "sibling"), GLOB_NAMES)
def test_a_run_under_a_glob_named_folder_reads_only_its_own_parts(tmp_path, name, sibling):
    for folder, loss in [(name, 1.0), (sibling, 2.0)]:
        with Monitor(
            tmp_path / folder, "run", writer=WriterConfig(flush_interval_s=3600, compact=False)
        ) as mon:
            mon.log_scalars(0, {"loss": loss})
    with open_runs(tmp_path / name) as runs:
        viewed = runs.sql("SELECT loss FROM steps").column("loss").to_pylist()
        sandboxed = runs.user_sql("SELECT loss FROM steps").column("loss").to_pylist()
        new = runs.read_new("run", "steps", PartsRead()).rows.column("loss").to_pylist()
    assert (viewed, sandboxed, new) == ([1.0], [1.0], [1.0])
