"""Input that crashed a reader (issue 27, item 1) is an error of that value, or one line and exit 2: JSON
nested 30,000 levels deep (a segmentation fault in pyarrow's reader, ``RecursionError`` in Python's), an
MLflow step beyond 64 bits (``OverflowError``), a path component over 255 bytes (``OSError`` errno 36)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from sorl_monitor import Monitor
from sorl_monitor.cli.main import app
from sorl_monitor.integrations.verl import ingest_verl_jsonl
from sorl_monitor.logs import LogWarning
from sorl_monitor.logs.input_limits import MAX_JSON_DEPTH, check_path, json_depth, json_loads
from sorl_monitor.read.query import QueryError, open_runs
from tests.helpers.paths import ROOT
from tests.helpers.runs import write_run

runner = CliRunner()
DEEP = "[" * 30_000 + "]" * 30_000
"""Read fine by pyarrow at 10,000 levels; 30,000 crashed the process (exit 139)."""
FLAT = [json.dumps({"step": step, "loss": 0.5, "reward": 0.1 * step}) for step in range(5)]
VERL = [json.dumps({"step": step, "data": {"actor/pg_loss": 0.1}}) for step in range(5)]


def test_a_jsonl_line_nested_30000_levels_is_skipped_with_a_warning_not_a_segfault(tmp_path):
    log = tmp_path / "deep.jsonl"
    log.write_text("\n".join([*FLAT[:2], DEEP, *FLAT[2:]]) + "\n")
    command = [sys.executable, "-m", "sorl_monitor.cli.main", "summary", str(log)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]  # guards against pyarrow's segmentation fault
    assert f"warning: {log}: skipped 1 lines that are not JSON objects (first: line 3)" in result.stderr
    assert "loss" in result.stdout


def test_a_verl_record_nested_30000_levels_is_one_skipped_line_in_place_and_in_ingest(tmp_path):
    log = tmp_path / "verl.jsonl"
    deep_record = '{"step": 3, "data": ' + '{"a":' * 30_000 + "1" + "}" * 30_000 + "}"
    log.write_text("\n".join([*VERL[:2], deep_record, *VERL[2:]]) + "\n")
    with pytest.warns(LogWarning, match="first: line 3"), open_runs(log, "verl") as runs:
        assert runs.sql("SELECT count(*) AS n FROM steps").column("n")[0].as_py() == 5
    with Monitor(tmp_path / "runs", "verl") as monitor:
        report = ingest_verl_jsonl(log, monitor)
    assert report.rows == 5
    assert report.bad_lines == [3]
    assert "nested 30001 levels deep" in report.first_error


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("trainer_state.json", '{"log_history": ' + DEEP + "}"),
        ("history.json", DEEP),
        ("first.jsonl", "\n".join(['{"a": ' + DEEP + "}", *FLAT]) + "\n"),
    ],
    ids=["trainer_state", "json_document", "first_line"],
)
@pytest.mark.parametrize("command", ["summary", "ingest"])
def test_a_deep_json_document_or_first_line_is_one_error_line_naming_the_file(tmp_path, name, text, command):
    log = tmp_path / name
    log.write_text(text)
    args = [command, str(log)] + (["--log-dir", str(tmp_path / "runs")] if command == "ingest" else [])
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output  # guards against a RecursionError traceback
    assert result.output.startswith("error: ") and str(log) in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_an_mlflow_step_beyond_64_bits_is_an_error_of_that_line(tmp_path):
    run = tmp_path / "mlruns" / "0" / "r1"
    (run / "metrics").mkdir(parents=True)
    (run.parent / "meta.yaml").write_text("name: exp\n")
    (run / "meta.yaml").write_text("run_id: r1\n")
    metric = run / "metrics" / "loss"
    metric.write_text("1700000000000 0.5 1\n1700000000000 0.5 99999999999999999999\n1700000001000 0.7 2\n")
    with pytest.warns(
        LogWarning, match=r"loss: skipped 1 unreadable lines \(first: line 2: step 9+ does not"
    ):
        with open_runs(tmp_path / "mlruns") as runs:
            rows = runs.sql("SELECT step, loss FROM steps ORDER BY step").to_pylist()
    assert rows == [
        {"step": 1, "loss": 0.5},
        {"step": 2, "loss": 0.7},
    ]  # guards against an OverflowError traceback


LONG = "a" * 300


@pytest.mark.parametrize(
    "args",
    [
        ["summary", "{tmp}/" + LONG],
        ["query", "{tmp}/" + LONG, "SELECT 1"],
        ["postmortem", "{tmp}/x/" + LONG + "/y"],
        ["runs", "{tmp}/" + LONG],
        ["report", "{run}", "--html", "{tmp}/" + LONG + "/report.html"],
        ["ingest", "{log}", "--log-dir", "{tmp}/" + LONG],
        ["dashboard", "{tmp}/" + LONG],
    ],
    ids=lambda args: args[0],
)
def test_a_path_component_over_255_bytes_is_one_error_line(tmp_path, args):
    log = tmp_path / "log.jsonl"
    log.write_text("\n".join(FLAT) + "\n")
    run = write_run(tmp_path / "logs", "run", updates=1)
    result = runner.invoke(app, [a.format(tmp=tmp_path, run=run, log=log) for a in args])
    assert result.exit_code == 2, result.output  # guards against OSError: [Errno 36] File name too long
    assert result.output.startswith("error: file name too long: 300 bytes (at most 255): ")
    assert len(result.output.strip().splitlines()) == 1


def test_open_runs_refuses_a_path_component_over_255_bytes_in_one_line(tmp_path):
    with pytest.raises(QueryError, match=r"^file name too long: 300 bytes \(at most 255\)"):
        open_runs(tmp_path / LONG)


def test_the_depth_guard_counts_brackets_outside_strings_only():
    """Synthetic texts: brackets in strings are not nesting; a text at the limit reads."""
    in_strings = json.dumps({"text": "[" * 1000, "list": [[1]]})
    assert json_depth(in_strings) == 3
    at_limit = "[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH
    assert json_loads(at_limit) is not None
    with pytest.raises(json.JSONDecodeError, match=f"nested {MAX_JSON_DEPTH + 1} levels deep"):
        json_loads("[" + at_limit + "]")
    with pytest.raises(ValueError, match="NUL"):
        check_path("a\0b")
