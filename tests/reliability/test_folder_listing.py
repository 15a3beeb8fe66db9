"""A folder of logs is listed and read once per log on open, symbolic links included (issue 27, item 7):
``latest -> run-1`` listed the run twice, a link back to a parent folder once per search level. Synthetic
logs (ten lines of ``loss``)."""

from __future__ import annotations

import json
import os

import sorl_monitor.logs as logs
import sorl_monitor.logs.formats as formats
from sorl_monitor.read.query import open_runs
from tests.helpers.runs import write_run


def ten_line_log(path):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"step": step, "loss": 0.5}) + "\n" for step in range(10)))


def test_links_inside_the_folder_do_not_list_a_log_again(tmp_path):
    ten_line_log(tmp_path / "run-1" / "log.jsonl")
    os.symlink("run-1", tmp_path / "latest")
    os.symlink("..", tmp_path / "run-1" / "up")  # a link back to its own parent
    with open_runs(tmp_path) as runs:
        run_ids = runs.sql("SELECT run_id FROM runs").column("run_id").to_pylist()
    assert run_ids == ["log"]  # guards against one log listed once per folder level


def test_a_parquet_run_behind_a_link_is_listed_once(tmp_path):
    write_run(tmp_path, "run-1", updates=2)
    os.symlink("run-1", tmp_path / "latest")
    with open_runs(tmp_path) as runs:
        assert runs.sql("SELECT run_id FROM runs").column("run_id").to_pylist() == ["run-1"]


def test_each_log_is_detected_and_read_once_on_open(tmp_path, monkeypatch):
    for k in range(20):
        ten_line_log(tmp_path / f"log{k}.jsonl")
    calls = {"detect": 0, "read": 0}
    detect_file, read_source = logs.detect_file, logs.read_source

    def counted_detect(path):
        calls["detect"] += 1
        return detect_file(path)

    def counted_read(source, *options):
        calls["read"] += 1
        return read_source(source, *options)

    monkeypatch.setattr(logs, "detect_file", counted_detect)
    monkeypatch.setattr("sorl_monitor.read.catalog.read_source", counted_read)
    assert formats.detect_file is detect_file
    with open_runs(tmp_path) as runs:
        assert runs.sql("SELECT count(*) AS n FROM runs").column("n")[0].as_py() == 20
    assert calls == {"detect": 20, "read": 20}  # guards against finding and detecting every log twice
