"""Write another tool's log into a run through ``Monitor.log_scalars`` (``sorl ingest``).

Line logs (verl's file logger, flat JSON lines) are streamed: each line becomes a row as it is read, and a
follower keeps reading as the file grows. Other logs are read whole (``read_source``) and their rows
after the last step already in the run are written; a follower reads them again when their files change.
Names arrive already mapped to ``steps`` columns (``metric_names.map_metrics``).
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import pyarrow.compute as pc

from sorl_monitor.logs import LogSource, fingerprint, read_source
from sorl_monitor.logs.input_limits import json_loads
from sorl_monitor.logs.options import LogOptions
from sorl_monitor.logs.table import (
    DROPPED_COLUMNS,
    ForeignRun,
    LogFormatError,
    flat_record,
    step_column,
    without_trainer_prefix,
)
from sorl_monitor.metric_names import guess_family, map_metrics
from sorl_monitor.schema import KEYS

LINE_FORMATS = ("verl", "jsonl")
"""Formats ingested line by line (and followed as they grow)."""
FLUSH_EVERY_ROWS = 1000
"""Rows between flushes while a long file is read: back-pressure, so the writer's queue never overflows."""

LineParser = Callable[[bytes], tuple[int, dict[str, Any]]]


class ScalarSink(Protocol):
    """Where ingest writes its rows: a ``Monitor`` (these two methods are all ingest calls)."""

    def log_scalars(
        self, step: int | None, scalars: Mapping[str, Any], *, names: str | Mapping[str, str] | None = ...
    ) -> None: ...

    def flush(self, timeout: float = ...) -> bool: ...


@dataclass
class IngestReport:
    """What one ingest did: lines read, rows written, lines skipped and why."""

    lines: int = 0
    rows: int = 0
    already_ingested: int = 0
    bad_lines: list[int] = field(default_factory=list)
    first_error: str = ""


def parse_flat_line(line: bytes) -> tuple[int, dict[str, Any]]:
    """``(step, metrics)`` of one flat JSON line (nested objects flattened, the step column and W&B
    bookkeeping removed); ``ValueError`` if it is not an object with an integer step."""
    try:
        record = json_loads(line)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"not JSON ({error})") from None
    if not isinstance(record, dict):
        raise ValueError("not a JSON object")
    flat = flat_record(record)
    name = step_column(flat)
    if name is None:
        raise ValueError("no step column")
    step = flat.pop(name)
    if isinstance(step, float) and step.is_integer():
        step = int(step)
    if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step < 2**63:
        raise ValueError(f"step {step!r} is not an integer in 0 … 2^63 − 1")
    return step, {k: v for k, v in flat.items() if k not in DROPPED_COLUMNS}


class _Names:
    """Maps each row with one family, unless given: guessed from every name the log has had so far (``learn``:
    the whole file as it is when ingest starts, then each new name as it arrives), as the readers guess it
    from every column of a log read in place (``train/`` prefix as they treat it)."""

    def __init__(self, family: str | Mapping[str, str] | None) -> None:
        self.guessing = family == "auto"
        self.family = None if self.guessing else family
        self.renamed: dict[str, str] = {}
        self.seen: set[str] = set()

    def learn(self, names: Iterable[str]) -> None:
        """Take ``names`` into the guess (a name not seen before may change the family)."""
        new = set(names) - self.seen
        if not self.guessing or not new:
            return
        self.seen |= new
        self.renamed = without_trainer_prefix(sorted(self.seen))
        self.family = guess_family(self.renamed.values())

    def __call__(self, data: Mapping[str, Any]) -> dict[str, Any]:
        self.learn(data)
        return map_metrics({self.renamed.get(k, k): v for k, v in data.items()}, self.family)


def _names_in(path: str | os.PathLike[str], parse: LineParser) -> set[str]:
    """Every metric name of the file's lines as they are now (lines that do not parse left out)."""
    names: set[str] = set()
    with open(path, "rb") as handle:
        for line in handle:
            try:
                names.update(parse(line)[1])
            except ValueError:
                continue
    return names


def ingest_lines(
    path: str | os.PathLike[str],
    monitor: ScalarSink,
    parse: LineParser,
    *,
    family: str | Mapping[str, str] | None = "auto",
    merge_lines: bool = False,
    after_step: int = -1,
    follow: bool = False,
    idle_timeout_s: float | None = None,
    poll_s: float = 0.5,
    stop: threading.Event | None = None,
) -> IngestReport:
    """Write each line's record with ``step > after_step`` as a ``steps`` row (names mapped with ``family``;
    ``"auto"``: guessed from every name in the file, as a reader in place guesses it). With ``merge_lines``,
    consecutive lines of one step are one row. Nothing is dropped for its order: a line of a step written
    before (a late line, a step out of order) is a row of its own, which readers merge with the step's other
    rows (``step_rows``).

    With ``follow``, keep reading as the file grows (an incomplete last line waits for its end) until ``stop``
    is set or nothing new arrives for ``idle_timeout_s``; rows are flushed after each read. A file replaced at
    its path (rotated: another inode) is read to its end, then the new file from its start; a file rewritten
    in place (shorter than what was read, or its bytes before the read position changed: verl reopens it
    with ``"wb"`` on restart) is read again from its start. After either, steps up to the last one written
    are skipped as already ingested (a restarted trainer logs them again).
    """
    names = _Names(family)
    names.learn(_names_in(path, parse))
    report = IngestReport()
    skip_upto = after_step  # lines of these steps are already in the run
    written_upto = after_step
    held: tuple[int, dict[str, Any]] | None = None

    def write(step: int, data: Mapping[str, Any]) -> None:
        nonlocal written_upto
        monitor.log_scalars(step, names(data), names=None)
        written_upto = max(written_upto, step)
        report.rows += 1
        if report.rows % FLUSH_EVERY_ROWS == 0:
            monitor.flush()

    def take(line: bytes, number: int) -> None:
        nonlocal held
        report.lines += 1
        try:
            step, data = parse(line)
        except ValueError as error:
            report.bad_lines.append(number)
            report.first_error = report.first_error or f"line {number}: {error}"
            return
        if step <= skip_upto:
            report.already_ingested += 1
            return
        if held is not None and step == held[0]:
            held[1].update(data)
            return
        if held is not None:
            write(*held)
        held = (step, dict(data))
        if not merge_lines:
            write(*held)
            held = None

    reader = _LineReader(path)
    idle_since = time.monotonic()
    try:
        while True:
            if follow and (change := reader.changed_under_it()) is not None:
                for number, line in reader.rest() if change == "replaced" else []:
                    if line.strip():
                        take(line, number)  # the old file is done: its lines to its end, the last one whole
                if held is not None:
                    write(*held)
                    held = None
                skip_upto = max(skip_upto, written_upto)
                reader.reopen()
            lines = reader.read(final=not follow)
            for number, line in lines:
                if line.strip():
                    take(line, number)
            if reader.at_end and held is not None:
                write(*held)
                held = None
            if lines or reader.at_end:
                monitor.flush()
            if lines:
                idle_since = time.monotonic()
            if not reader.at_end:
                continue
            if not follow or (stop is not None and stop.is_set()):
                return report
            if idle_timeout_s is not None and time.monotonic() - idle_since > idle_timeout_s:
                return report
            time.sleep(poll_s)
    finally:
        reader.close()


class _LineReader:
    """The complete lines of a file as it grows, in chunks (a long line is joined once: linear in its length),
    with what ``ingest_lines`` needs to notice a file replaced or rewritten under it."""

    CHUNK = 1 << 20
    CHECK_BYTES = 64
    """Bytes before the read position compared at each poll: changed bytes mean the file was rewritten."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = path
        self.handle = open(path, "rb")  # noqa: SIM115 - closed by close(); reopened on rotation
        self.position = 0
        self.line_number = 0
        self.pending: list[bytes] = []
        self.last_bytes = b""
        self.at_end = False

    def changed_under_it(self) -> str | None:
        """``replaced`` if the path now holds another file (the old one is then read to its end: ``rest``),
        ``rewritten`` if the file was cut or its bytes before the read position changed, else None."""
        try:
            now = os.stat(self.path)
        except OSError:
            return None  # between a rename and the new file's creation: keep reading the old one
        mine = os.fstat(self.handle.fileno())
        if (now.st_ino, now.st_dev) != (mine.st_ino, mine.st_dev):
            return "replaced"
        if mine.st_size < self.position:
            return "rewritten"
        start = self.position - len(self.last_bytes)
        if self.last_bytes and os.pread(self.handle.fileno(), len(self.last_bytes), start) != self.last_bytes:
            return "rewritten"
        return None

    def rest(self) -> list[tuple[int, bytes]]:
        """Every line left in the file, read to its end (a last line without a newline included)."""
        lines = self.read(final=True)
        while not self.at_end:
            lines += self.read(final=True)
        return lines

    def reopen(self) -> None:
        """Read the file at the path from its start (the old file's unfinished last line is a line of it)."""
        self.handle.close()
        self.handle = open(self.path, "rb")  # noqa: SIM115
        self.position, self.line_number, self.pending, self.last_bytes = 0, 0, [], b""
        self.at_end = False

    def read(self, *, final: bool) -> list[tuple[int, bytes]]:
        """The next complete lines with their numbers (a last line without a newline too when ``final``)."""
        chunk = self.handle.read(self.CHUNK)
        self.position += len(chunk)
        self.at_end = not chunk
        self.last_bytes = (self.last_bytes + chunk)[-self.CHECK_BYTES :]
        *lines, tail = chunk.split(b"\n")
        if lines:
            lines[0] = b"".join([*self.pending, lines[0]])
            self.pending = []
        if tail:
            self.pending.append(tail)
        if final and not chunk and self.pending:
            lines, self.pending = [b"".join(self.pending)], []  # the last line has no newline: it is complete
        numbered = []
        for line in lines:
            self.line_number += 1
            numbered.append((self.line_number, line))
        return numbered

    def close(self) -> None:
        self.handle.close()


def ingest_run(run: ForeignRun, monitor: ScalarSink, after_step: int = -1) -> IngestReport:
    """Write the rows of a run read whole (its names already mapped) with ``step > after_step``."""
    report = IngestReport()
    metrics = [name for name in run.steps.column_names if name not in KEYS]
    for row in run.steps.select(["step", *metrics]).to_pylist():
        step = row.pop("step")
        if step <= after_step:
            report.already_ingested += 1
            continue
        monitor.log_scalars(step, {k: v for k, v in row.items() if v is not None}, names=None)
        report.rows += 1
        if report.rows % FLUSH_EVERY_ROWS == 0:
            monitor.flush()
    report.lines = run.steps.num_rows
    monitor.flush()
    return report


@dataclass
class RunProgress:
    """One run a whole-log ingest writes: where its rows go, the step it resumed after (−1: a new run), the
    last step written and what was written so far."""

    sink: ScalarSink
    after_step: int
    last_step: int
    report: IngestReport = field(default_factory=IngestReport)


def ingest_whole_log(
    source: LogSource,
    open_run: Callable[[str, ForeignRun], tuple[ScalarSink, int]],
    written: dict[str, RunProgress],
    *,
    options: LogOptions | None = None,
    run_name: str | None = None,
    follow: bool = False,
    idle_timeout_s: float | None = None,
    poll_s: float = 0.5,
    stop: threading.Event | None = None,
) -> str | None:
    """Read a log whole and write each of its runs' steps after the last one already written; with ``follow``,
    read it again whenever its files change (``fingerprint``) until ``stop`` is set or nothing changes for
    ``idle_timeout_s``. A followed log that does not read (a ``trainer_state.json`` caught half written) is
    read again at its next change.

    ``open_run(name, run)`` gives the sink of a run met for the first time and the last step it already holds;
    ``written`` (run name → ``RunProgress``) is filled as runs are opened, so the caller closes every sink
    even when this raises. ``run_name`` names the one run of the log. Returns why the log's last change did
    not read (None when it read).
    """
    stop = stop or threading.Event()
    unread: str | None = None
    try:
        runs = read_source(source, options)
    except LogFormatError as error:
        if not follow:
            raise
        runs, unread = [], str(error)
    if run_name is not None and len(runs) > 1:
        raise ValueError(f"{source.path} holds {len(runs)} runs; --run names one run")
    stamp = fingerprint(source)
    while True:
        for foreign in runs:
            name = run_name or foreign.run_id
            if name not in written:
                sink, after = open_run(name, foreign)
                written[name] = RunProgress(sink, after, after)
            progress = written[name]
            report = ingest_run(foreign, progress.sink, progress.last_step)
            progress.report.rows += report.rows
            if progress.last_step == progress.after_step:
                progress.report.already_ingested += report.already_ingested
            if report.rows:
                progress.last_step = max(progress.last_step, pc.max(foreign.steps.column("step")).as_py())
        if not follow:
            return unread
        idle_since = time.monotonic()  # idle from the end of this read, not from its start
        while not stop.is_set():
            time.sleep(poll_s)
            if (now := fingerprint(source)) != stamp:
                stamp, idle_since = now, time.monotonic()
                try:
                    runs, unread = read_source(source, options), None
                except LogFormatError as error:
                    unread = str(error)  # half written: read again at its next change
                    continue
                break
            if idle_timeout_s is not None and time.monotonic() - idle_since > idle_timeout_s:
                stop.set()
        if stop.is_set():
            return unread
