"""``sorl fleet``: the post-mortem of every run under a folder, as one verdict table (``sorl_monitor.diagnose.fleet``)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from sorl_monitor.cli.console import err_console, fail, print_table, user_errors
from sorl_monitor.cli.core import output_format
from sorl_monitor.cli.diagnose import EXIT_COLLAPSE, EXIT_HEALTHY, ConfigOption, SetOption
from sorl_monitor.diagnose.fleet import ENGINES, fleet_verdicts
from sorl_monitor.logs.input_limits import check_path
from sorl_monitor.read.query import QueryError
from sorl_monitor.read.verdict_table import (
    VERDICTS_FILE,
    check_table_path,
    read_verdicts,
    verdicts_file,
    write_verdicts,
)
from sorl_monitor.storage import StorageError, default_storage_options, filesystem, is_remote

ALARMING = ("collapsed", "collapsing", "diverging")
"""Statuses that make ``sorl fleet`` exit with ``EXIT_COLLAPSE`` (a CI gate over a whole fleet)."""
SHOWN = ["run_id", "status", "collapse_step", "first_critical", "root_cause", "last_step"]
"""The columns the table output shows (80 columns); ``--csv``/``--json`` give them all."""


@user_errors
def fleet(
    path: Annotated[
        str, typer.Argument(help="A folder of runs and logs, or an object-store prefix (s3://bucket/runs).")
    ],
    engine: Annotated[
        str, typer.Option("--engine", help=f"Where the post-mortems run: {' or '.join(ENGINES)}.")
    ] = "local",
    address: Annotated[
        str | None, typer.Option("--address", help="Ray cluster address (ray engine; default: a local Ray).")
    ] = None,
    jobs: Annotated[
        int | None, typer.Option("--jobs", min=1, help="Processes / Ray CPUs (default: cores).")
    ] = None,
    out: Annotated[
        str | None,
        typer.Option(
            "--out", help=f"Where the table goes, a file or s3:// URI (default: PATH/{VERDICTS_FILE})."
        ),
    ] = None,
    watch: Annotated[
        float | None,
        typer.Option("--watch", min=1.0, help="Judge again every this many seconds (Ctrl-C stops)."),
    ] = None,
    csv: Annotated[bool, typer.Option("--csv", help="Print the table as CSV.")] = False,
    json_: Annotated[bool, typer.Option("--json", help="Print the table as JSON.")] = False,
    config_file: ConfigOption = None,
    set_: SetOption = None,
) -> None:
    """Post-mortem every run under PATH and write one verdict table (read by `sorl runs`, the dashboard and
    `sorl query`'s `verdicts` view); runs unchanged since the last table are not judged again.

    Exit status: 0 no run collapsing, 3 at least one collapsed, collapsing or diverging, 2 user error (also a
    store or path that fails, in any round of --watch).
    """
    output = output_format(csv, json_)
    if not is_remote(path) and not Path(path).is_dir():
        fail(f"not a folder: {path}")
    out = out or verdicts_file(path)
    _check_out(out)
    while True:
        try:
            table = _judge(path, out, engine, address, jobs, config_file, set_ or [])
            write_verdicts(table, out)
        except (StorageError, QueryError, ValueError) as error:  # a store or path that fails, in any round
            fail(str(error))
        if watch is None:
            break
        err_console.print(f"{time.strftime('%H:%M:%S')} {_counts(table)} → {out}", highlight=False)
        try:
            time.sleep(watch)
        except KeyboardInterrupt:
            break
    shown = table
    if output == "table":  # fits 80 columns
        shown = table.select(SHOWN).rename_columns(
            ["run", "status", "collapse", "alarm", "root cause", "step"]
        )
    print_table(shown, output, title=f"{_counts(table)} ({out})")
    alarming = any(status in ALARMING for status in table.column("status").to_pylist())
    raise typer.Exit(EXIT_COLLAPSE if alarming else EXIT_HEALTHY)


def _check_out(out: str) -> None:
    """Fail (one line) unless ``out`` can take the verdict table: a regular file or none yet, in a folder that
    exists; an object-store URI ``storage`` takes."""
    try:
        if is_remote(out):
            filesystem(out)
            return
        check_path(Path(out))
        check_table_path(out)
    except (StorageError, ValueError) as error:
        fail(str(error))
    if not Path(out).parent.is_dir():
        fail(f"no such folder for --out: {Path(out).parent}")


def _judge(path, out, engine, address, jobs, config_file, settings):  # noqa: ANN001, ANN202 - CLI glue
    with Progress(
        TextColumn("judging runs"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        console=err_console, transient=True,
    ) as bar:  # fmt: skip
        task = bar.add_task("runs", total=None)
        return fleet_verdicts(
            path,
            engine=engine,
            address=address,
            jobs=jobs,
            settings=settings,
            config_file=config_file,
            storage_options=default_storage_options(),
            previous=read_verdicts(out),
            progress=lambda done, total: bar.update(task, completed=done, total=total),
        )


def _counts(table) -> str:  # noqa: ANN001
    statuses = table.column("status").to_pylist()
    counts = {s: statuses.count(s) for s in dict.fromkeys(statuses)}
    return f"{len(statuses)} runs: " + ", ".join(f"{n} {s}" for s, n in counts.items())
