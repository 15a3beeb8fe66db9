"""``sorl dashboard LOG_DIR``: the live Streamlit dashboard over a log folder (127.0.0.1 unless told otherwise).

LOG_DIR may be an object-store prefix (``s3://bucket/runs``); the run list comes from its verdict table
(``sorl fleet``'s) when it holds one, or from the table ``--verdicts`` names.

Runs ``streamlit run dashboard/app.py`` headless, without usage statistics, with error details kept in
the server log (the page shows one-line messages). The log folder and settings reach the app through
the environment (``dashboard.view_parts``).
"""

from __future__ import annotations

import ipaddress
import os
import socket
import sys
from pathlib import Path
from typing import Annotated

import pyarrow.fs as pafs
import typer

import sorl_monitor.dashboard as dashboard
from sorl_monitor.cli.console import (
    LogFormatOption,
    LoggingStepsOption,
    MapOption,
    err_console,
    fail,
    log_options,
    require,
    user_errors,
)
from sorl_monitor.dashboard.launch_settings import (
    CONFIG_ENV,
    DEFAULT_REFRESH_S,
    DEFAULT_SQL_TIMEOUT_S,
    FORMAT_ENV,
    LOG_DIR_ENV,
    LOG_MAP_ENV,
    LOGGING_STEPS_ENV,
    OVERRIDES_ENV,
    REFRESH_ENV,
    SQL_TIMEOUT_ENV,
    STORAGE_OPTIONS_ENV,
    VERDICTS_ENV,
)
from sorl_monitor.diagnose.postmortem import load_configs
from sorl_monitor.logs import FORMATS, detect_format
from sorl_monitor.logs.input_limits import check_path
from sorl_monitor.read.verdict_table import VERDICTS_FILE, load_verdicts
from sorl_monitor.storage import StorageError, default_storage_options, filesystem, is_remote

APP = Path(dashboard.__file__).resolve().parent / "app.py"


def streamlit_command(host: str, port: int) -> list[str]:
    """The ``streamlit run`` command line of the dashboard app."""
    return [
        sys.executable, "-m", "streamlit", "run", str(APP),
        "--server.address", host, "--server.port", str(port), "--server.headless", "true",
        "--browser.gatherUsageStats", "false", "--server.fileWatcherType", "none",
        "--server.runOnSave", "false", "--client.showErrorDetails", "none", "--client.toolbarMode", "minimal",
        "--global.developmentMode", "false",
    ]  # fmt: skip


def port_in_use(host: str, port: int) -> bool:
    """True if something already listens on ``host:port`` (binding there fails)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError:
            return True
    return False


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_log_dir(log_dir: str, format_given: bool) -> None:
    """Fail (one line, exit 2) unless ``log_dir`` is a folder, a log in a known format, or a reachable
    object-store prefix."""
    if is_remote(log_dir):
        try:
            fs, inner = filesystem(log_dir)
            found = fs.get_file_info(inner).type != pafs.FileType.NotFound
        except StorageError as error:
            fail(str(error))
        except OSError as error:
            fail(f"{log_dir}: {str(error).splitlines()[0]}")
        if not found:
            fail(f"no such bucket or prefix: {log_dir}")
        return
    path = Path(log_dir)
    check_path(path)
    if not path.exists():
        fail(f"no such folder: {log_dir} (give the log_dir your Monitor writes to)")
    if not path.is_dir() and not format_given and detect_format(path) is None:
        fail(
            f"not a folder: {log_dir} (give the log_dir your Monitor writes to), nor a log in a format "
            f"I know ({', '.join(FORMATS)}); give --format to force one"
        )


@user_errors
def dashboard_command(
    log_dir: Annotated[
        str,
        typer.Argument(
            help="The folder your Monitor writes runs to (or one run), another tool's log, or an object-store "
            "prefix (s3://bucket/runs)."
        ),
    ],
    port: Annotated[int, typer.Option(min=1, max=65535, help="Port to serve on.")] = 8501,
    host: Annotated[
        str, typer.Option(help="Address to bind; 127.0.0.1 keeps the dashboard on this machine.")
    ] = "127.0.0.1",
    refresh: Annotated[
        float, typer.Option(min=0.25, help="Seconds between live redraws of a run being written.")
    ] = DEFAULT_REFRESH_S,
    sql_timeout: Annotated[
        float, typer.Option("--sql-timeout", min=0.1, help="Seconds a statement of the SQL tab may run.")
    ] = DEFAULT_SQL_TIMEOUT_S,
    config: Annotated[
        Path | None,
        typer.Option("--config", help="TOML file of settings (as for sorl postmortem)."),
    ] = None,
    set_: Annotated[
        list[str] | None,
        typer.Option("--set", help="Override one setting: name=value (repeatable; as for sorl postmortem)."),
    ] = None,
    fmt: LogFormatOption = None,
    map_: MapOption = None,
    logging_steps: LoggingStepsOption = None,
    verdicts: Annotated[
        str | None,
        typer.Option(
            "--verdicts",
            help=f"The run list's verdict table, a file or s3:// URI, where `sorl fleet --out` put it "
            f"(default: LOG_DIR/{VERDICTS_FILE} when there is one).",
        ),
    ] = None,
) -> None:
    """Start the live dashboard on LOG_DIR: curves, turns, gradients, alerts and verdict, read-only SQL."""
    require("streamlit", "dashboard")
    require("plotly", "dashboard")
    check_log_dir(log_dir, fmt is not None)
    if verdicts is not None:
        load_verdicts(verdicts if is_remote(verdicts) else Path(verdicts))  # ValueError: one line, exit 2
    load_configs(config, set_ or ())
    log_options(map_, logging_steps, config)
    try:
        socket.getaddrinfo(host, port)
    except socket.gaierror:
        fail(f"cannot resolve host {host!r}")
    if port_in_use(host, port):
        fail(f"port {port} on {host} is in use (or not yours to bind); pick another with --port")
    if not is_loopback(host):
        err_console.print(
            f"warning: serving on {host}: anyone who can reach it can read these runs (there is no login)"
        )
    env = {
        **os.environ,
        LOG_DIR_ENV: log_dir if is_remote(log_dir) else str(Path(log_dir).resolve()),
        REFRESH_ENV: str(refresh),
        SQL_TIMEOUT_ENV: str(sql_timeout),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(APP.parents[1]), os.environ.get("PYTHONPATH")])),
    }
    if config is not None:
        env[CONFIG_ENV] = str(config.resolve())
    if set_:
        env[OVERRIDES_ENV] = "\n".join(set_)
    if fmt is not None:
        env[FORMAT_ENV] = str(fmt)
    if map_:
        env[LOG_MAP_ENV] = "\n".join(map_)
    if logging_steps is not None:
        env[LOGGING_STEPS_ENV] = str(logging_steps)
    if verdicts is not None:
        env[VERDICTS_ENV] = verdicts if is_remote(verdicts) else str(Path(verdicts).resolve())
    if storage := default_storage_options():
        env[STORAGE_OPTIONS_ENV] = "\n".join(f"{key}={value}" for key, value in storage.items())
    err_console.print(f"sorl dashboard: http://{host}:{port} (Ctrl-C to stop)")
    command = streamlit_command(host, port)
    os.execve(command[0], command, env)
