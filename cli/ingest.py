"""``sorl ingest PATH``: turn another tool's log into a run in our Parquet layout, once or following it."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    from sorl_monitor.write.monitor import Monitor

from sorl_monitor.cli.console import (
    LogFormatOption,
    LoggingStepsOption,
    MapOption,
    console,
    err_console,
    fail,
    log_options,
    require,
    user_errors,
)
from sorl_monitor.logs import LogOptions, LogSource, find_logs
from sorl_monitor.logs.ingest import (
    LINE_FORMATS,
    IngestReport,
    RunProgress,
    ingest_lines,
    ingest_whole_log,
    parse_flat_line,
)
from sorl_monitor.logs.row_kinds import file_has_kinds
from sorl_monitor.logs.table import ForeignRun
from sorl_monitor.logs.verl import parse_record
from sorl_monitor.read.query import QueryError, open_runs
from sorl_monitor.schema import check_run_id

FIRST_LINE_LIMIT = 1 << 20
LINE_PARSERS: dict[str, Callable[[bytes], tuple[int, dict]]] = {
    "verl": parse_record,
    "jsonl": parse_flat_line,
}
LINE_SHAPES = {"verl": '{"step": N, "data": {...}} per line', "jsonl": "one JSON object with a step per line"}


def first_line_error(path: Path, fmt: str, *, growing: bool) -> str | None:
    """Why the file's first non-blank line is not a ``fmt`` record; None if it is (or is still being written)."""
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
                    LINE_PARSERS[fmt](line)
                except ValueError as error:
                    return f"line {number}: {error}"
                return None
    return None


def last_ingested_step(run_dir: Path) -> int:
    """The highest step already in ``run_dir`` (−1 for a new run): a re-run continues after it."""
    if not run_dir.is_dir():
        return -1
    try:
        with open_runs(run_dir, "sorl") as runs:
            value = runs.sql("SELECT max(step) FROM steps").column(0)[0].as_py()
    except QueryError:
        return -1
    return -1 if value is None else int(value)


def open_monitor(
    log_dir: Path, run_name: str, source: LogSource, config: dict, algorithm: str | None
) -> Monitor:
    require("torch", "torch")
    from sorl_monitor.write.monitor import Monitor

    config = {**config, "source": str(source.path), "format": source.format}
    try:
        return Monitor(log_dir, run_name, config, algorithm=algorithm)
    except OSError as error:
        fail(f"cannot write the run in {log_dir}: {error.strerror or error}")


def print_report(report: IngestReport, source: Path, run_dir: Path, after: int, monitor: Monitor) -> None:
    console.print(
        f"ingested {report.rows} rows from {source} into {run_dir}"
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
    if dropped := monitor.writer_stats().rows_dropped:
        fail(f"{dropped} rows could not be written to {run_dir}", code=1)


def ingest_line_log(
    source: LogSource, log_dir: Path, run: str | None, follow: bool, idle_timeout: float | None, poll: float
) -> None:
    """Stream a verl or JSON-lines file into one run, line by line (following it with ``follow``)."""
    if (problem := first_line_error(source.path, source.format, growing=follow)) is not None:
        shape = LINE_SHAPES[source.format]
        fail(f"{source.path} is not {source.format} output ({shape}): {problem}")
    run_name = run or source.name
    after = last_ingested_step(log_dir / run_name)
    algorithm = "verl" if source.format == "verl" else None
    monitor = open_monitor(log_dir, run_name, source, {}, algorithm)
    stop = threading.Event()
    previous = signal.signal(signal.SIGINT, lambda *_: stop.set())
    try:
        report = ingest_lines(
            source.path,
            monitor,
            LINE_PARSERS[source.format],
            family="verl" if source.format == "verl" else "auto",
            merge_lines=source.format == "jsonl",
            after_step=after,
            follow=follow,
            idle_timeout_s=idle_timeout,
            poll_s=poll,
            stop=stop,
        )
    finally:
        signal.signal(signal.SIGINT, previous)
        monitor.close("ingested")
    print_report(report, source.path, log_dir / run_name, after, monitor)


def ingest_and_report_whole_log(
    source: LogSource,
    log_dir: Path,
    run: str | None,
    follow: bool,
    idle_timeout: float | None,
    poll: float,
    options: LogOptions | None = None,
) -> None:
    """Read a log whole and write each of its runs (``logs.ingest.ingest_whole_log``; with ``follow``, again
    whenever its files change), then report what each run got."""

    def open_run(name: str, foreign: ForeignRun) -> tuple[Monitor, int]:
        after = last_ingested_step(log_dir / name)
        config = foreign.info.get("config") or {}
        return open_monitor(log_dir, name, source, config, foreign.info.get("algorithm")), after

    written: dict[str, RunProgress] = {}
    stop = threading.Event()
    previous = signal.signal(signal.SIGINT, lambda *_: stop.set())
    try:
        unread = ingest_whole_log(
            source,
            open_run,
            written,
            options=options,
            run_name=run,
            follow=follow,
            idle_timeout_s=idle_timeout,
            poll_s=poll,
            stop=stop,
        )
    finally:
        signal.signal(signal.SIGINT, previous)
        for progress in written.values():
            progress.sink.close("ingested")
    for name, progress in written.items():
        print_report(progress.report, source.path, log_dir / name, progress.after_step, progress.sink)
    if unread is not None:
        err_console.print(
            f"warning: the last change of {source.path} did not read ({unread}); its steps are not ingested",
            highlight=False,
            soft_wrap=True,
        )


@user_errors
def ingest(
    path: Annotated[Path, typer.Argument(help="A log in any format sorl reads (docs/logs.md).")],
    fmt: LogFormatOption = None,
    log_dir: Annotated[Path, typer.Option("--log-dir", help="Folder that holds runs.")] = Path("runs"),
    run: Annotated[
        str | None, typer.Option("--run", help="Run name (default: from the log or its file).")
    ] = None,
    follow: Annotated[
        bool, typer.Option("--follow", help="Keep reading as the log grows (Ctrl-C stops).")
    ] = False,
    idle_timeout: Annotated[
        float | None,
        typer.Option("--idle-timeout", min=0, help="With --follow: stop after this many idle seconds."),
    ] = None,
    poll: Annotated[
        float, typer.Option("--poll", min=0.01, help="With --follow: seconds between reads.")
    ] = 0.5,
    map_: MapOption = None,
    logging_steps: LoggingStepsOption = None,
) -> None:
    """Write the steps of the log at PATH into a run under --log-dir; steps already in that run are skipped."""
    if not path.exists():
        fail(f"no such file or directory: {path}")
    if fmt == "sorl":
        fail(f"{path} is given as sorl's own format: there is nothing to ingest")
    if run is not None:
        check_run_id(run)
    sources = find_logs(path, None if fmt is None else str(fmt))
    if not sources:
        fail(f"no log found in {path} (formats and how they are told apart: docs/logs.md)")
    if len(sources) > 1:
        fail(
            f"{path} holds {len(sources)} logs; ingest one at a time ({', '.join(str(s.path) for s in sources[:3])}…)"
        )
    source = sources[0]
    options = log_options(map_, logging_steps)
    # JSON lines of row kinds merge rows across lines, and --map renames after reading: both read whole
    streamed = source.format in LINE_FORMATS and source.path.is_file()
    if streamed and not options.names and not (source.format == "jsonl" and file_has_kinds(source.path)):
        ingest_line_log(source, log_dir, run, follow, idle_timeout, poll)
    else:
        ingest_and_report_whole_log(source, log_dir, run, follow, idle_timeout, poll, options)
