"""``sorl dashboard``: the streamlit command it runs, and one-line errors (exit 2) for user mistakes."""

from __future__ import annotations

import socket

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from sorl_monitor.cli.main import app
from sorl_monitor.dashboard.launch_settings import (
    CONFIG_ENV,
    LOG_DIR_ENV,
    OVERRIDES_ENV,
    REFRESH_ENV,
    SQL_TIMEOUT_ENV,
    VERDICTS_ENV,
)
from sorl_monitor.read.verdict_table import verdict_table, write_verdicts
from tests.helpers.browser import free_port
from tests.helpers.dashboard_launch import stub_launch

runner = CliRunner()


@pytest.fixture
def launch(monkeypatch):
    """Run ``sorl dashboard ARGS`` up to the point where it would start Streamlit; return that launch."""
    return stub_launch(monkeypatch)


def option(command: list[str], name: str) -> str:
    return command[command.index(name) + 1]


def test_dashboard_binds_localhost_headless_without_usage_stats_by_default(launch, tmp_path):
    launched = launch(tmp_path, "--port", free_port())
    command = launched.command
    assert command[1:4] == ["-m", "streamlit", "run"]
    assert command[4].endswith("dashboard/app.py")
    assert option(command, "--server.address") == "127.0.0.1"
    assert option(command, "--server.headless") == "true"
    assert option(command, "--browser.gatherUsageStats") == "false"
    assert option(command, "--client.showErrorDetails") == "none"


def test_dashboard_passes_the_log_folder_and_settings_to_the_app(launch, tmp_path):
    config = tmp_path / "detectors.toml"
    config.write_text("clip_rise_critical = 7.5\n")
    port = free_port()
    launched = launch(
        tmp_path,
        "--port",
        port,
        "--refresh",
        "5",
        "--sql-timeout",
        "7",
        "--config",
        config,
        "--set",
        "kl_rise_warning=3",
    )
    assert option(launched.command, "--server.port") == str(port)
    assert launched.env[LOG_DIR_ENV] == str(tmp_path.resolve())
    assert launched.env[REFRESH_ENV] == "5.0"
    assert launched.env[SQL_TIMEOUT_ENV] == "7.0"
    assert launched.env[CONFIG_ENV] == str(config.resolve())
    assert launched.env[OVERRIDES_ENV] == "kl_rise_warning=3"


def test_a_missing_log_folder_is_a_one_line_error(tmp_path):
    result = runner.invoke(app, ["dashboard", str(tmp_path / "nowhere")])
    assert result.exit_code == 2
    assert "no such folder" in result.output


def test_a_file_instead_of_a_log_folder_is_a_one_line_error(tmp_path):
    (tmp_path / "run.json").write_text("{}")
    result = runner.invoke(app, ["dashboard", str(tmp_path / "run.json")])
    assert result.exit_code == 2
    assert "not a folder" in result.output


def test_a_port_in_use_is_a_one_line_error(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = runner.invoke(app, ["dashboard", str(tmp_path), "--port", str(port)])
    assert result.exit_code == 2
    assert f"port {port} on 127.0.0.1 is in use" in result.output


def test_a_bad_detector_setting_is_a_one_line_error(tmp_path):
    result = runner.invoke(app, ["dashboard", str(tmp_path), "--set", "no_such_setting=1"])
    assert result.exit_code == 2
    assert "no_such_setting" in result.output


def test_an_out_of_range_port_is_refused(tmp_path):
    result = runner.invoke(app, ["dashboard", str(tmp_path), "--port", "70000"])
    assert result.exit_code == 2


def test_verdicts_given_with_the_option_reach_the_app(launch, tmp_path):
    table = tmp_path / "elsewhere" / "v.parquet"
    table.parent.mkdir()
    write_verdicts(verdict_table([{"run_id": "a", "path": str(tmp_path / "a"), "status": "healthy"}]), table)
    launched = launch(tmp_path, "--port", free_port(), "--verdicts", table)
    assert launched.env[VERDICTS_ENV] == str(table.resolve())


@pytest.mark.parametrize("kind", ["missing", "not parquet", "other columns"])
def test_a_verdicts_file_that_is_not_a_verdict_table_is_a_one_line_error(tmp_path, kind):
    table = tmp_path / "v.parquet"
    if kind == "not parquet":
        table.write_text("run_id,status\n")
    elif kind == "other columns":
        pq.write_table(pa.table({"run_id": ["a"], "reward": [1.0]}), table)
    result = runner.invoke(app, ["dashboard", str(tmp_path), "--verdicts", str(table)])
    assert result.exit_code == 2, result.output
    assert "verdict table" in result.output and "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1
