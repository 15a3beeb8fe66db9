"""Shared pieces of the ``sorl`` front-end: one-line errors instead of tracebacks, table output."""

from __future__ import annotations

import functools
import io
import json
import math
from collections.abc import Callable
from enum import StrEnum
from typing import Annotated, Any, NoReturn, TypeVar

import pyarrow as pa
import pyarrow.csv as pacsv
import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from sorl_monitor.logs import FORMATS
from sorl_monitor.query import QueryError, RunSet, open_runs

console = Console()
err_console = Console(stderr=True)
F = TypeVar("F", bound=Callable[..., Any])

EXIT_USAGE = 2
"""Exit status for a user mistake: bad path, no runs, bad SQL, refused statement, bad option value."""


def fail(message: str, code: int = EXIT_USAGE) -> NoReturn:
    """Print ``error: message`` on stderr and exit with ``code``."""
    err_console.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def user_errors(func: F) -> F:
    """Turn the errors a user can cause into a one-line message and exit status 2."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except (QueryError, ValueError, FileNotFoundError, NotADirectoryError, PermissionError) as error:
            fail(str(error))

    return wrapper  # type: ignore[return-value]


LogFormat = StrEnum("LogFormat", {name: name for name in FORMATS})
"""The log formats ``--format`` accepts (``sorl_monitor.logs.FORMATS``)."""
LogFormatOption = Annotated[
    LogFormat | None, typer.Option("--format", help="Log format (default: detected; docs/logs.md).")
]
RUN_PATH_HELP = "A run folder, a folder of runs, or another tool's log (file or folder; docs/logs.md)."


def open_or_fail(paths: str | list[str], fmt: LogFormat | str | None = None) -> RunSet:
    """``open_runs(paths, fmt)``, or ``error: …`` and exit 2."""
    try:
        return open_runs(paths, None if fmt is None else str(fmt))
    except QueryError as error:
        fail(str(error))


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        return f"{value:.6g}"
    return str(value)


def print_table(data: pa.Table, fmt: str = "table", title: str | None = None, max_rows: int = 200) -> None:
    """Print an Arrow table as a rich table, CSV or JSON (one object per row)."""
    if fmt == "csv":
        buffer = io.BytesIO()
        pacsv.write_csv(data, buffer)
        typer.echo(buffer.getvalue().decode(), nl=False)
        return
    if fmt == "json":
        typer.echo(json.dumps(data.to_pylist(), default=str, allow_nan=True))
        return
    table = Table(title=title, show_lines=False, header_style="bold")
    for name in data.column_names:
        table.add_column(name, overflow="fold")
    for row in data.slice(0, max_rows).to_pylist():
        table.add_row(*(_cell(v) for v in row.values()))
    console.print(table)
    if data.num_rows > max_rows:
        console.print(f"… {data.num_rows - max_rows} more rows (use --csv or --json for all)")
