"""``sorl dashboard --verdicts``: a table whose columns are of other kinds is refused in one line, and what a
table's cells hold is shown as text, never read as markdown (no colour, link or emphasis from a run id)."""

from __future__ import annotations

import shutil

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from sorl_monitor.cli import dashboard as dashboard_cli
from sorl_monitor.cli.main import app
from sorl_monitor.read.verdict_table import write_verdicts
from tests.helpers.dashboard_app import open_app
from tests.helpers.paths import SAMPLE_LOGS


@pytest.mark.parametrize(
    ("column", "values", "said"),
    [
        ("status", pa.array([3], pa.int64()), "column 'status' is int64, not text"),
        ("collapse_step", pa.array(["351"]), "column 'collapse_step' is string, not whole numbers"),
        ("updated_at", pa.array([1.5]), "column 'updated_at' is double, not times"),
    ],
)
def test_a_verdict_table_with_a_column_of_another_kind_is_refused_in_one_line(
    tmp_path, monkeypatch, column, values, said
):
    shutil.copytree(SAMPLE_LOGS / "token-ppo", tmp_path / "runs" / "token-ppo")
    columns = {"run_id": pa.array(["token-ppo"]), "path": pa.array(["x"]), "status": pa.array(["collapsed"])}
    columns[column] = values
    pq.write_table(pa.table(columns), tmp_path / "v.parquet")
    monkeypatch.setattr(dashboard_cli.os, "execve", lambda *args: pytest.fail("the dashboard was started"))
    result = CliRunner().invoke(
        app, ["dashboard", str(tmp_path / "runs"), "--verdicts", str(tmp_path / "v.parquet")]
    )
    assert result.exit_code == 2 and said in " ".join(result.output.split()), (
        result.output
    )  # guards against the page's own markup in a cell
    assert "Traceback" not in result.output  # ArrowTypeError


def test_a_run_id_holding_markdown_is_shown_as_text_in_the_run_list(tmp_path, monkeypatch):
    root = tmp_path / "runs"
    shutil.copytree(SAMPLE_LOGS / "token-ppo", root / "token-ppo")
    forged = "x :green[**healthy**] [docs](http://example.com) $x$"
    row = {"run_id": forged, "path": str(root / "token-ppo"), "status": "collapsed", "algorithm": "*ppo*"}
    write_verdicts(pa.Table.from_pylist([row]), root / "verdicts.parquet")
    page = open_app(monkeypatch, root, drawn=False)
    sidebar = "\n".join(str(m.value) for m in page.sidebar.markdown)
    line = next(text for text in sidebar.splitlines() if "healthy" in text)
    assert line.startswith(":red[**collapsed**]"), line
    for markup in (":green[", "](http", "[docs]", "**healthy**", "$x$"):
        assert markup not in line, line  # guards against a table cell drawn as a verdict or a link
    assert "\\*ppo\\*" in sidebar
