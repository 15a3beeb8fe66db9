"""Smaller refusals of good input (issue 27, item 8): a JSON-lines log whose first line is longer than the
64 KiB detection reads, a CSV with a 20 MB cell. Synthetic values."""

from __future__ import annotations

import json

from sorl_monitor.logs import detect_format
from sorl_monitor.read.query import open_runs


def test_a_first_line_of_80_kb_is_still_json_lines(tmp_path):
    log = tmp_path / "wide.jsonl"
    first = {"step": 1, "loss": 0.5, **{f"metric_{i:05d}": 0.1 for i in range(4000)}}
    log.write_text(json.dumps(first) + "\n" + json.dumps({"step": 2, "loss": 0.4}) + "\n")
    assert log.stat().st_size > 80_000
    assert detect_format(log) == "jsonl"  # guards against an 80 kB first line hiding the format
    with open_runs(log) as runs:
        assert runs.sql("SELECT loss FROM steps ORDER BY step").column("loss").to_pylist() == [0.5, 0.4]


def test_a_csv_with_a_20_mb_cell_reads(tmp_path):
    log = tmp_path / "notes.csv"
    log.write_text("step,loss,note\n1,0.5," + "x" * (20 << 20) + "\n2,0.4,ok\n")
    with open_runs(log) as runs:  # guards against pyarrow's block-boundary error on a long CSV row
        assert runs.sql("SELECT loss FROM steps ORDER BY step").column("loss").to_pylist() == [0.5, 0.4]
