"""The dashboard finds the verdict table wherever ``sorl fleet`` wrote it (issue 30): at an ``s3://`` root
(the real SeaweedFS server of ``tests/storage``), and elsewhere, given with ``--verdicts``. The runs are
the real sample runs ``token-ppo`` (collapses) and ``so-ppo-auto-ctn``; the tables are the real
``sorl fleet``'s."""

from __future__ import annotations

from pathlib import Path

import pyarrow.fs as pafs
from typer.testing import CliRunner

from sorl_monitor.cli.main import app as cli
from sorl_monitor.dashboard.launch_settings import LOG_DIR_ENV, VERDICTS_ENV
from sorl_monitor.read.verdict_table import read_verdicts
from tests.helpers.browser import free_port
from tests.helpers.dashboard_app import assert_clean, charts, open_app, page_text
from tests.helpers.dashboard_launch import stub_launch
from tests.helpers.paths import ROOT

RUNS = ("token-ppo", "so-ppo-auto-ctn")
COLLAPSED = "token-ppo"


def copy_runs(target: str, filesystem: pafs.FileSystem) -> None:
    for name in RUNS:
        pafs.copy_files(
            str(ROOT / "sample_logs" / name),
            f"{target}/{name}",
            source_filesystem=pafs.LocalFileSystem(),
            destination_filesystem=filesystem,
        )


def test_the_run_list_of_an_s3_root_comes_from_the_verdict_table_fleet_wrote_there(
    monkeypatch, s3_server, s3_root
):
    copy_runs(s3_root.removeprefix("s3://"), s3_server.filesystem())
    result = CliRunner().invoke(cli, ["fleet", s3_root, "--jobs", "1"])
    assert result.exit_code == 3, result.output
    table = read_verdicts(s3_root)
    assert table is not None and sorted(table.column("run_id").to_pylist()) == sorted(RUNS)
    page = open_app(monkeypatch, s3_root)
    assert_clean(page)
    assert f"{len(RUNS)} of {len(RUNS)} runs; verdicts of `sorl fleet`" in page_text(page)
    assert page.multiselect(key="runs").value == [COLLAPSED]
    assert COLLAPSED in charts(page)["overview"]["data"][1]["hovertemplate"], "the run opened from s3://"


def test_sorl_dashboard_passes_an_s3_root_whole_to_the_app(monkeypatch, s3_server, s3_root):
    copy_runs(s3_root.removeprefix("s3://"), s3_server.filesystem())

    launched = stub_launch(monkeypatch)(s3_root, "--port", free_port())
    assert launched.env[LOG_DIR_ENV] == s3_root
    missing = CliRunner().invoke(cli, ["dashboard", s3_root + "-nothing-here"])
    assert missing.exit_code == 2 and "no such bucket or prefix" in missing.output


def test_a_table_written_elsewhere_is_the_run_list_when_given_with_verdicts(monkeypatch, tmp_path: Path):
    root = tmp_path / "runs"
    copy_runs(str(root), pafs.LocalFileSystem())
    out = tmp_path / "elsewhere" / "fleet.parquet"
    out.parent.mkdir()
    result = CliRunner().invoke(cli, ["fleet", str(root), "--jobs", "1", "--out", str(out)])
    assert result.exit_code == 3, result.output
    monkeypatch.setenv(VERDICTS_ENV, str(out))
    page = open_app(monkeypatch, root)
    assert_clean(page)
    assert f"{len(RUNS)} of {len(RUNS)} runs; verdicts of `sorl fleet`" in page_text(page)
    assert page.multiselect(key="runs").value == [COLLAPSED]
