"""``sorl runs``, ``sorl query``, ``sorl summary``: list, query and summarise logged runs."""

from __future__ import annotations

from typing import Annotated

import typer

from sorl_monitor.cli.console import (
    RUN_PATH_HELP,
    TABLE_ROWS,
    LogFormatOption,
    LoggingStepsOption,
    MapOption,
    fail,
    log_options,
    open_or_fail,
    print_table,
    user_errors,
)
from sorl_monitor.read.query import USER_SQL_TIMEOUT_S
from sorl_monitor.read.summary import metric_summary, run_overview

RunPath = Annotated[str, typer.Argument(help=RUN_PATH_HELP)]
CsvOption = Annotated[bool, typer.Option("--csv", help="Print CSV.")]
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON (a list of row objects).")]


def output_format(csv: bool, json_: bool) -> str:
    """``table``, ``csv`` or ``json`` from the ``--csv``/``--json`` flags."""
    if csv and json_:
        fail("choose one of --csv and --json")
    return "csv" if csv else "json" if json_ else "table"


@user_errors
def runs(
    log_dir: RunPath,
    csv: CsvOption = False,
    json_: JsonOption = False,
    fmt: LogFormatOption = None,
    map_: MapOption = None,
    logging_steps: LoggingStepsOption = None,
) -> None:
    """List the runs under LOG_DIR: algorithm, seed, status, updates, last reward (and path, with --csv/--json)."""
    output = output_format(csv, json_)
    with open_or_fail(log_dir, fmt, options=log_options(map_, logging_steps)) as run_set:
        overview = run_overview(run_set)
    if overview.column("verdict").null_count == overview.num_rows:  # no `sorl fleet` table here
        overview = overview.drop_columns(["verdict"])
    if output == "table":  # fits 80 columns: the path goes, two headers shorten
        overview = overview.drop_columns(["path"]).rename_columns(
            [
                {"last_step": "step", "last_reward": "reward"}.get(n, n)
                for n in overview.column_names
                if n != "path"
            ]
        )
    print_table(overview, output, title=f"runs in {log_dir}")


@user_errors
def query(
    path: RunPath,
    sql: Annotated[
        str, typer.Argument(help="One read-only SELECT over runs, steps, turns, modules, alerts.")
    ],
    csv: CsvOption = False,
    json_: JsonOption = False,
    fmt: LogFormatOption = None,
    map_: MapOption = None,
    logging_steps: LoggingStepsOption = None,
    timeout: Annotated[
        float, typer.Option("--timeout", min=0.001, help="Stop the query after this many seconds.")
    ] = USER_SQL_TIMEOUT_S,
    memory_limit: Annotated[
        str | None,
        typer.Option(
            "--memory-limit", help="DuckDB's memory limit, e.g. 2GB (default: 1/4 of RAM, ≤ 8 GiB)."
        ),
    ] = None,
) -> None:
    """Run read-only SQL over the runs in PATH (views: runs, steps, turns, modules, alerts)."""
    output = output_format(csv, json_)
    # a table shows TABLE_ROWS rows; one more fetched tells there are more
    shown = None if output != "table" else TABLE_ROWS + 1
    with open_or_fail(
        path, fmt, memory_limit=memory_limit, options=log_options(map_, logging_steps)
    ) as run_set:
        result = run_set.user_sql(sql, timeout_s=timeout, max_rows=shown)
    print_table(result, output, max_rows=TABLE_ROWS, complete=shown is None)


@user_errors
def summary(
    path: RunPath,
    run: Annotated[str | None, typer.Option("--run", help="Run id, when PATH holds several runs.")] = None,
    csv: CsvOption = False,
    json_: JsonOption = False,
    fmt: LogFormatOption = None,
    map_: MapOption = None,
    logging_steps: LoggingStepsOption = None,
) -> None:
    """Per-metric count, min, median, max and last value of one run."""
    output = output_format(csv, json_)
    with open_or_fail(path, fmt, options=log_options(map_, logging_steps)) as run_set:
        run_ids = [r["run_id"] for r in run_set.sql("SELECT run_id FROM runs ORDER BY run_id").to_pylist()]
        if run is None and len(run_ids) > 1:
            fail(f"{path} holds {len(run_ids)} runs; pick one with --run ({', '.join(run_ids[:5])}…)")
        run_id = run if run is not None else run_ids[0]
        if run_id not in run_ids:
            fail(f"no run {run_id!r} in {path}")
        table = metric_summary(run_set, run_id)
    if table.num_rows == 0:
        fail(f"run {run_id!r} has no steps logged yet")
    print_table(table, output, title=f"summary of {run_id}")
