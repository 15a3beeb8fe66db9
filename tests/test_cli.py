"""``sorl runs|query|summary``: output formats, and a one-line error with exit 2 for user mistakes."""

from __future__ import annotations

import csv
import io
import json

import pytest
from typer.testing import CliRunner

from sorl_monitor.cli.main import app
from tests.helpers.runs import write_run

runner = CliRunner()


def invoke(*args: str):
    return runner.invoke(app, [str(a) for a in args])


def test_runs_lists_every_run(tmp_path):
    write_run(tmp_path, "alpha", updates=2)
    write_run(tmp_path, "beta", updates=2)
    result = invoke("runs", tmp_path)
    assert result.exit_code == 0
    assert "alpha" in result.output and "beta" in result.output


def test_query_prints_csv_and_json(run_dir):
    result = invoke("query", run_dir, "SELECT step, clip_frac FROM steps ORDER BY step", "--csv")
    rows = list(csv.DictReader(io.StringIO(result.output)))
    assert result.exit_code == 0 and [int(r["step"]) for r in rows] == list(range(6))
    result = invoke("query", run_dir, "SELECT count(*) AS n FROM turns", "--json")
    assert json.loads(result.output) == [{"n": 6 * 4 * 3}]


def test_summary_of_one_run(run_dir):
    result = invoke("summary", run_dir, "--json")
    metrics = {row["metric"]: row for row in json.loads(result.output)}
    assert result.exit_code == 0 and metrics["ratio_mean"]["n"] == 6


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("query", "{missing}", "SELECT 1"), "no such file"),
        (("query", "{empty}", "SELECT 1"), "no runs found"),
        (("query", "{run}", "SELEC 1"), "bad SQL"),
        (("query", "{run}", "DELETE FROM steps"), "only read-only"),
        (("query", "{run}", "SELECT 1", "--csv", "--json"), "choose one"),
        (("summary", "{logs}"), "pick one with --run"),
        (("summary", "{run}", "--run", "nope"), "no run 'nope'"),
        (("runs", "{missing}"), "no such file"),
    ],
)
def test_user_mistakes_get_one_line_and_exit_2(tmp_path, args, message):
    logs = tmp_path / "logs"
    run = write_run(logs, "a", updates=1)
    write_run(logs, "b", updates=1)
    (tmp_path / "empty").mkdir()
    paths = {"missing": tmp_path / "missing", "empty": tmp_path / "empty", "run": run, "logs": logs}
    result = invoke(*(a.format(**paths) for a in args))
    assert result.exit_code == 2
    assert message in result.output
    assert "Traceback" not in result.output
    assert result.output.strip().count("\n") == 0


def test_bad_flag_is_a_usage_error(run_dir):
    result = invoke("query", run_dir, "SELECT 1", "--bogus")
    assert result.exit_code == 2 and "No such option" in result.output
