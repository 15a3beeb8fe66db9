"""The ``sorl`` CLI with hostile or mistaken input: one ``error:`` line, exit status 2, no traceback."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from sorl_monitor.cli.main import app
from tests.helpers.runs import write_run

runner = CliRunner()
RECORD = '{"step": 1, "data": {"actor/pg_loss": 0.5}}\n'


@pytest.fixture
def paths(tmp_path):
    good = tmp_path / "exp.jsonl"
    good.write_text(RECORD)
    binary = tmp_path / "model.bin"
    binary.write_bytes(bytes(range(256)) * 64)
    wrong = tmp_path / "metrics.csv"
    wrong.write_text("step,loss\n1,0.5\n")
    long_line = tmp_path / "long.jsonl"
    long_line.write_text('{"step": 1, "data": {"x": "' + "a" * (2 << 20) + '"}}\n')
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    run = write_run(tmp_path / "logs", "run", updates=1)
    empty = tmp_path / "empty"
    empty.mkdir()
    return {"good": good, "binary": binary, "wrong": wrong, "long": long_line, "blocker": blocker,
            "run": run, "missing": tmp_path / "missing.jsonl", "dir": tmp_path, "empty": empty}  # fmt: skip


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["ingest", "{missing}"], "no such file"),
        (["ingest", "{empty}"], "no log found"),
        (["ingest", "{binary}"], "nor a log in a format I know"),
        (["ingest", "{wrong}", "--format", "verl"], "is not verl output"),
        (["ingest", "{long}", "--format", "verl"], "longer than 1 MiB"),
        (["ingest", "{good}", "--run", "../escape"], "not allowed"),
        (["ingest", "{good}", "--run", "a/b"], "not allowed"),
        (["ingest", "{good}", "--run", ""], "not allowed"),
        (["ingest", "{good}", "--run", "x" * 200], "not allowed"),
        (["ingest", "{good}", "--log-dir", "{blocker}/runs"], "cannot write the run"),
        (
            ["query", "{run}", "EXPLAIN ANALYZE COPY (SELECT 1) TO '{run}/steps/rank=0/part-9.parquet'"],
            "read-only",
        ),
        (["query", "{run}", "SELECT * FROM read_text('/etc/passwd')"], "disabled by configuration"),
        (["summary", "{run}", "--run", "x'; DROP VIEW steps; --"], "no run"),
    ],
)
def test_mistakes_and_attacks_get_one_error_line_and_exit_2(paths, args, message):
    result = runner.invoke(app, [a.format(**paths) for a in args])
    assert result.exit_code == 2, result.output
    assert message in result.output and "Traceback" not in result.output
    assert result.output.strip().count("\n") == 0
    assert (
        not (paths["dir"] / "escape").exists()
        and not (paths["run"] / "steps" / "rank=0" / "part-9.parquet").exists()
    )


@pytest.mark.parametrize(
    ("option", "value"), [("--idle-timeout", "-1"), ("--poll", "0"), ("--poll", "nan?"), ("--format", "nope")]
)
def test_out_of_range_options_are_usage_errors(paths, option, value):
    result = runner.invoke(app, ["ingest", str(paths["good"]), option, value])
    assert result.exit_code == 2 and "Traceback" not in result.output


def test_a_huge_number_in_a_record_is_stored_not_fatal(paths, tmp_path):
    source = tmp_path / "huge.jsonl"
    source.write_text('{"step": 1, "data": {"perf/total_num_tokens": 1' + "0" * 400 + ', "x": 1e999}}\n')
    result = runner.invoke(app, ["ingest", str(source), "--log-dir", str(tmp_path / "runs")])
    assert result.exit_code == 0, result.output
    result = runner.invoke(
        app, ["query", str(tmp_path / "runs"), "SELECT perf_total_num_tokens AS t, x FROM steps", "--json"]
    )
    assert json.loads(result.stdout) == [{"t": float("inf"), "x": float("inf")}]
