"""Damaged part files: each is skipped with a warning naming it, and everything else stays readable."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings

import pyarrow.parquet as pq
import pytest

from sorl_monitor.read.query import CorruptPartWarning, open_runs
from tests.helpers.paths import ROOT
from tests.helpers.runs import run_with_parts

UPDATES = 6


def step_parts(run):
    return sorted((run / "steps" / "rank=0").glob("part-*.parquet"))


def read_steps(log_dir) -> tuple[list[int], list[str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with open_runs(log_dir) as runs:
            steps = runs.sql("SELECT step FROM steps ORDER BY step").column(0).to_pylist()
            runs.sql("SELECT count(*) FROM turns")
    return steps, [str(w.message) for w in caught if issubclass(w.category, CorruptPartWarning)]


def test_a_truncated_part_is_skipped_and_named(tmp_path):
    run = run_with_parts(tmp_path)
    victim = step_parts(run)[2]
    data = victim.read_bytes()
    victim.write_bytes(data[: len(data) // 2])
    steps, warned = read_steps(tmp_path)
    assert steps == [s for s in range(UPDATES) if s != 2]
    assert len(warned) == 1 and str(victim) in warned[0]


def test_a_part_with_an_intact_footer_but_corrupt_data_is_skipped_and_named(tmp_path):
    run = run_with_parts(tmp_path)
    victim = step_parts(run)[3]
    data = bytearray(victim.read_bytes())
    footer = pq.read_metadata(victim).serialized_size + 8
    data[4 : len(data) - footer] = b"\xab" * (len(data) - footer - 4)  # every data page, not the footer
    victim.write_bytes(bytes(data))
    assert pq.read_metadata(victim).num_rows == 1  # the footer still reads
    steps, warned = read_steps(tmp_path)
    assert steps == [s for s in range(UPDATES) if s != 3]
    assert len(warned) == 1 and str(victim) in warned[0]


@pytest.mark.parametrize("content", [b"", b"PAR1 this is not parquet PAR1", b"\x00" * 4096])
def test_empty_and_garbage_files_named_like_parts_are_skipped(tmp_path, content):
    run = run_with_parts(tmp_path)
    (run / "steps" / "rank=0" / "part-999999.parquet").write_bytes(content)
    steps, warned = read_steps(tmp_path)
    assert steps == list(range(UPDATES))
    assert len(warned) == 1 and "part-999999.parquet" in warned[0]


def test_a_half_written_tmp_file_left_by_a_crash_is_ignored_silently(tmp_path):
    run = run_with_parts(tmp_path)
    data = step_parts(run)[0].read_bytes()
    (run / "steps" / "rank=0" / "part-000099.parquet.tmp").write_bytes(data[: len(data) // 3])
    assert read_steps(tmp_path) == (list(range(UPDATES)), [])


def test_the_cli_answers_from_the_readable_parts_and_warns_on_stderr(tmp_path):
    run = run_with_parts(tmp_path)
    victim = step_parts(run)[1]
    victim.write_bytes(victim.read_bytes()[:100])
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "sorl_monitor.cli.main",
            "query",
            str(tmp_path),
            "SELECT count(*) AS n FROM steps",
            "--json",
        ],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0
    assert json.loads(result.stdout) == [{"n": UPDATES - 1}]
    assert str(victim) in result.stderr and "Traceback" not in result.stderr
