"""``sorl ingest verl-jsonl FILE``: turn verl's file-logger output into a run, once or following it."""

from __future__ import annotations

import signal
import threading
from pathlib import Path
from typing import Annotated

import typer

from cli.common import console, err_console, fail, user_errors
from sorl_monitor.integrations.verl import ingest_verl_jsonl, parse_record, safe_run_name
from sorl_monitor.monitor import Monitor
from sorl_monitor.query import QueryError, open_runs
from sorl_monitor.schema import check_run_id

app = typer.Typer(help="Import the metrics another trainer wrote into a run.", no_args_is_help=True)

FIRST_LINE_LIMIT = 1 << 20


def first_line_error(path: Path, *, growing: bool) -> str | None:
    """Why the file's first non-blank line is not a file-logger record; None if it is (or is still being written)."""
    with open(path, "rb") as handle:
        number = 0
        while line := handle.readline(FIRST_LINE_LIMIT):
            number += 1
            if not line.endswith(b"\n"):
                if len(line) >= FIRST_LINE_LIMIT:
                    return f"line {number} is longer than 1 MiB"
                if growing:
                    return None
            if line.strip():
                try:
                    parse_record(line)
                except ValueError as error:
                    return f"line {number}: {error}"
                return None
    return None


def last_ingested_step(run_dir: Path) -> int:
    """The highest step already in ``run_dir`` (−1 for a new run): a re-run continues after it."""
    if not run_dir.is_dir():
        return -1
    try:
        with open_runs(run_dir) as runs:
            value = runs.sql("SELECT max(step) FROM steps").column(0)[0].as_py()
    except QueryError:
        return -1
    return -1 if value is None else int(value)


@app.command("verl-jsonl")
@user_errors
def verl_jsonl(
    file: Annotated[
        Path, typer.Argument(help='verl\'s file-logger output: one {"step": N, "data": {...}} per line.')
    ],
    log_dir: Annotated[Path, typer.Option("--log-dir", help="Folder that holds runs.")] = Path("runs"),
    run: Annotated[
        str | None, typer.Option("--run", help="Run name (default: the file's name, made safe).")
    ] = None,
    follow: Annotated[
        bool, typer.Option("--follow", help="Keep reading as the file grows (Ctrl-C stops).")
    ] = False,
    idle_timeout: Annotated[
        float | None,
        typer.Option("--idle-timeout", min=0, help="With --follow: stop after this many idle seconds."),
    ] = None,
    poll: Annotated[
        float, typer.Option("--poll", min=0.01, help="With --follow: seconds between reads.")
    ] = 0.5,
) -> None:
    """Write each record of FILE as one steps row of a run; steps already in that run are skipped."""
    if not file.exists():
        fail(f"no such file: {file}")
    if not file.is_file():
        fail(f"not a file: {file} (give verl's file-logger .jsonl)")
    if (problem := first_line_error(file, growing=follow)) is not None:
        fail(f'{file} is not verl file-logger output ({{"step": N, "data": {{...}}}} per line): {problem}')
    run_name = check_run_id(run) if run is not None else safe_run_name(file.stem)
    after = last_ingested_step(log_dir / run_name)
    try:
        monitor = Monitor(log_dir, run_name, {"source": str(file.resolve())}, algorithm="verl")
    except OSError as error:
        fail(f"cannot write the run in {log_dir}: {error.strerror or error}")
    stop = threading.Event()
    previous = signal.signal(signal.SIGINT, lambda *_: stop.set())
    try:
        report = ingest_verl_jsonl(
            file,
            monitor,
            after_step=after,
            follow=follow,
            idle_timeout_s=idle_timeout,
            poll_s=poll,
            stop=stop,
        )
    finally:
        signal.signal(signal.SIGINT, previous)
        monitor.close("ingested")
    dropped = monitor.writer_stats().rows_dropped
    console.print(
        f"ingested {report.rows} rows from {file} into {log_dir / run_name}"
        + (f" (continuing after step {after})" if after >= 0 else ""),
        highlight=False,
    )
    if report.already_ingested:
        console.print(
            f"skipped {report.already_ingested} records at steps already in the run", highlight=False
        )
    if report.bad_lines:
        err_console.print(
            f"warning: skipped {len(report.bad_lines)} unreadable lines (first: {report.first_error})",
            highlight=False,
            soft_wrap=True,
        )
    if dropped:
        fail(f"{dropped} rows could not be written to {log_dir / run_name}", code=1)
