"""``sorl runs``, ``sorl query``, ``sorl summary``: list, query and summarise logged runs."""

from __future__ import annotations

from typing import Annotated

import typer

from cli.common import RUN_PATH_HELP, LogFormatOption, fail, open_or_fail, print_table, user_errors
from sorl_monitor.query import metric_summary, run_overview

RunPath = Annotated[str, typer.Argument(help=RUN_PATH_HELP)]
CsvOption = Annotated[bool, typer.Option("--csv", help="Print CSV.")]
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON (a list of row objects).")]


def output_format(csv: bool, json_: bool) -> str:
    """``table``, ``csv`` or ``json`` from the ``--csv``/``--json`` flags."""
    if csv and json_:
        fail("choose one of --csv and --json")
    return "csv" if csv else "json" if json_ else "table"


@user_errors
def runs(log_dir: RunPath, fmt: LogFormatOption = None) -> None:
    """List the runs under LOG_DIR: algorithm, seed, status, updates, last reward."""
    with open_or_fail(log_dir, fmt) as run_set:
        print_table(run_overview(run_set), title=f"runs in {log_dir}")


@user_errors
def query(
    path: RunPath,
    sql: Annotated[
        str, typer.Argument(help="One read-only SELECT over runs, steps, turns, modules, alerts.")
    ],
    csv: CsvOption = False,
    json_: JsonOption = False,
    fmt: LogFormatOption = None,
) -> None:
    """Run read-only SQL over the runs in PATH (views: runs, steps, turns, modules, alerts)."""
    output = output_format(csv, json_)
    with open_or_fail(path, fmt) as run_set:
        result = run_set.sql(sql)
    print_table(result, output)


@user_errors
def summary(
    path: RunPath,
    run: Annotated[str | None, typer.Option("--run", help="Run id, when PATH holds several runs.")] = None,
    csv: CsvOption = False,
    json_: JsonOption = False,
    fmt: LogFormatOption = None,
) -> None:
    """Per-metric count, min, median, max and last value of one run."""
    output = output_format(csv, json_)
    with open_or_fail(path, fmt) as run_set:
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
