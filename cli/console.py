"""What the ``sorl`` front-end prints and how it fails: one-line errors, tables, the shared options."""

from __future__ import annotations

import errno
import functools
import importlib
import io
import json
import math
from collections.abc import Callable
from enum import StrEnum
from pathlib import Path, PurePath
from typing import Annotated, Any, NoReturn, TypeVar

import pyarrow as pa
import pyarrow.csv as pacsv
import typer
from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from sorl_monitor.logs import FORMATS, LogOptions
from sorl_monitor.logs.input_limits import check_path
from sorl_monitor.logs.options import config_tables
from sorl_monitor.read.query import QueryError, RunSet, open_runs
from sorl_monitor.storage import StorageError

console = Console()
err_console = Console(stderr=True)
F = TypeVar("F", bound=Callable[..., Any])

EXIT_USAGE = 2
"""Exit status for a user mistake: bad path, no runs, bad SQL, refused statement, bad option value."""


def fail(message: str, code: int = EXIT_USAGE) -> NoReturn:
    """Print ``error: message`` on stderr and exit with ``code``."""
    err_console.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def show_warning_in_one_line(
    message: Warning | str,
    category: type[Warning],
    filename: str,
    lineno: int,
    file: Any = None,
    line: Any = None,
) -> None:
    """``warnings.showwarning`` for the command line: ``warning: message``, without the source line that
    raised it (which says nothing to a user)."""
    err_console.print(f"[yellow]warning:[/] {escape(str(message))}", highlight=False, soft_wrap=True)


def require(module: str, extra: str) -> None:
    """Fail in one line when an optional dependency of the command is not installed."""
    try:
        importlib.import_module(module)
    except ModuleNotFoundError:
        fail(f"this command needs {module}: pip install 'sorl-monitor[{extra}]'")


def user_errors(func: F) -> F:
    """Turn the errors a user can cause into a one-line message and exit status 2."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            for value in kwargs.values():  # every path option and argument, as it enters
                if isinstance(value, PurePath):
                    check_path(value)
            return func(*args, **kwargs)
        except (
            QueryError,
            StorageError,
            ValueError,
            FileNotFoundError,
            NotADirectoryError,
            PermissionError,
        ) as error:
            fail(str(error))
        except OSError as error:
            if error.errno != errno.ENAMETOOLONG:
                raise
            fail(f"file name too long: {error.filename}")

    return wrapper  # type: ignore[return-value]


LogFormat = StrEnum("LogFormat", {name: name for name in FORMATS})
"""The log formats ``--format`` accepts (``sorl_monitor.logs.FORMATS``)."""
LogFormatOption = Annotated[
    LogFormat | None, typer.Option("--format", help="Log format (default: detected; docs/logs.md).")
]
MapOption = Annotated[
    list[str] | None,
    typer.Option(
        "--map",
        help="Read the log's metric NAME as COLUMN: COLUMN=NAME, e.g. reward=train_reward (repeatable; "
        "docs/logs.md).",
    ),
]
LoggingStepsOption = Annotated[
    int | None,
    typer.Option(
        "--logging-steps",
        min=1,
        help="Optimizer steps between printed log dicts (Hugging Face console logs).",
    ),
]
RUN_PATH_HELP = "A run folder, a folder of runs, or another tool's log (file or folder; docs/logs.md)."


def log_options(
    names: list[str] | None, logging_steps: int | None = None, config_file: str | Path | None = None
) -> LogOptions:
    """``--map`` and ``--logging-steps`` over the ``[map]`` and ``[logs]`` tables of ``--config``; ``error: …`` and
    exit 2 for a bad one."""
    try:
        return LogOptions.build(names or (), logging_steps, config_tables(config_file))
    except ValueError as error:
        fail(str(error))


def open_or_fail(
    paths: str | list[str],
    fmt: LogFormat | str | None = None,
    *,
    memory_limit: str | None = None,
    options: LogOptions | None = None,
) -> RunSet:
    """``open_runs(paths, fmt, memory_limit=…, log_options=…)``, or ``error: …`` and exit 2."""
    try:
        return open_runs(
            paths, None if fmt is None else str(fmt), memory_limit=memory_limit, log_options=options
        )
    except QueryError as error:
        fail(str(error))


def _cell(value: Any) -> Text:
    """A value as a table cell, its text shown as it is (``[/INST]`` is not rich markup)."""
    if value is None:
        return Text("")
    if isinstance(value, float):
        return Text("nan" if math.isnan(value) else f"{value:.6g}")
    return Text(str(value))


def _values(column: pa.ChunkedArray) -> list[Any]:
    """A column as Python values; as text where Python has no such value (a date past year 9999)."""
    try:
        return column.to_pylist()
    except (OverflowError, ValueError, pa.ArrowException):
        return column.cast(pa.string()).to_pylist()


def _text(value: Any) -> str | None:
    """A value as CSV text: lists and dicts as JSON, anything else as ``str``."""
    if value is None:
        return None
    return json.dumps(value, default=str) if isinstance(value, list | dict) else str(value)


def _write_csv(data: pa.Table) -> bytes:
    buffer = io.BytesIO()
    pacsv.write_csv(data, buffer)
    return buffer.getvalue()


def _csv(data: pa.Table) -> bytes:
    """``data`` as CSV; a column the CSV writer cannot write (an interval, a list, a struct, binary that is
    not UTF-8) is written as text."""
    try:
        return _write_csv(data)
    except pa.ArrowException:
        pass
    columns = []
    for column in data.columns:
        try:
            _write_csv(pa.table({"column": column}))
        except pa.ArrowException:
            column = pa.array([_text(v) for v in _values(column)], pa.string())
        columns.append(column)
    return _write_csv(pa.Table.from_arrays(columns, names=data.column_names))


TABLE_ROWS = 200
"""Rows a rich table shows (``--csv`` and ``--json`` print all)."""


def print_table(
    data: pa.Table,
    fmt: str = "table",
    title: str | None = None,
    max_rows: int = TABLE_ROWS,
    *,
    complete: bool = True,
) -> None:
    """Print an Arrow table as a rich table, CSV or JSON (one object per row); any column type, text as it is.

    ``complete=False``: ``data`` holds only the first rows of a result (its count past ``max_rows`` unknown).
    """
    if fmt == "csv":
        typer.echo(_csv(data).decode(), nl=False)
        return
    if fmt == "json":
        columns = [_values(column) for column in data.columns]
        rows = [dict(zip(data.column_names, values, strict=True)) for values in zip(*columns, strict=True)]
        typer.echo(json.dumps(rows, default=str, allow_nan=True))
        return
    table = Table(
        title=None if title is None else Text(title),
        show_lines=False,
        header_style="bold",
        box=box.SIMPLE_HEAD,
        padding=(0, 1, 0, 0),
        pad_edge=False,
    )
    for name in data.column_names:
        table.add_column(Text(name), overflow="fold")
    shown = data.slice(0, max_rows)
    for values in zip(*(_values(column) for column in shown.columns), strict=True):
        table.add_row(*(_cell(v) for v in values))
    console.print(table)
    if data.num_rows > max_rows:
        more = f"{data.num_rows - max_rows} more rows" if complete else "more rows"
        console.print(f"… {more} (use --csv or --json for all)")
