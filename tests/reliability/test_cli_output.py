"""Every ``sorl`` output path prints any cell text and any SQL result type, or fails with one line (exit 2)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sorl_monitor.cli.main import app
from tests.helpers.runs import write_run

runner = CliRunner()
ODD_TYPES = (
    "SELECT INTERVAL 3 DAY AS span, [1, 2] AS list, {'a': 1} AS struct, MAP {'k': 1} AS map, "
    "BIT '101' AS bits, to_timestamp(253402300800) AS year_10000, DATE '9999-12-31' + 5 AS day"
)


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    return write_run(tmp_path_factory.mktemp("logs"), "run", updates=1)


def test_cell_text_is_shown_as_it_is_not_as_markup(run):
    sql = "SELECT '<s>[INST] hi [/INST]' AS chat, '[red]alarm[/red]' AS \"[bold]name\""
    result = runner.invoke(app, ["query", str(run), sql])
    assert result.exit_code == 0, result.output
    for text in ("[INST] hi [/INST]", "[red]alarm[/red]", "[bold]name"):
        assert text in result.output


@pytest.mark.parametrize("flags", [[], ["--csv"], ["--json"]])
def test_every_result_type_prints_in_every_output_format(run, flags):
    result = runner.invoke(app, ["query", str(run), ODD_TYPES, *flags])
    assert result.exit_code == 0, result.output
    assert "Traceback" not in result.output
    if flags:  # the table wraps its cells
        assert "10000-01-01" in result.output
    if flags == ["--json"]:
        row = json.loads(result.output)[0]
        assert row["list"] == [1, 2] and row["struct"] == {"a": 1}


@pytest.mark.parametrize("target", ["/dev/full", "{run}/run.json/report.html"])
def test_an_unwritable_html_report_gets_one_error_line(run, target):
    result = runner.invoke(app, ["report", str(run), "--html", target.format(run=run)])
    assert result.exit_code == 2, result.output
    assert result.output.startswith("error: cannot write") and "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1
