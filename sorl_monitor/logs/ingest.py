"""Write another tool's log into a run through ``Monitor.log_scalars`` (``sorl ingest``).

Line logs (verl's file logger, flat JSON lines) are streamed: each line becomes a row as it is read, and a
follower keeps reading as the file grows. Other logs are read whole (``read_source``) and their rows
after the last step already in the run are written; a follower reads them again when their files change.
Names arrive already mapped to ``steps`` columns (``names.map_metrics``).
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sorl_monitor.integrations.names import guess_family, map_metrics
from sorl_monitor.logs.guards import json_loads
from sorl_monitor.logs.table import (
    DROPPED_COLUMNS,
    ForeignRun,
    flat_record,
    step_column,
    without_trainer_prefix,
)
from sorl_monitor.schema import KEYS

if TYPE_CHECKING:
    from sorl_monitor.monitor import Monitor

LINE_FORMATS = ("verl", "jsonl")
"""Formats ingested line by line (and followed as they grow)."""
FLUSH_EVERY_ROWS = 1000
"""Rows between flushes while a long file is read: back-pressure, so the writer's queue never overflows."""

LineParser = Callable[[bytes], tuple[int, dict[str, Any]]]


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
    monitor: Monitor,
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
    """Write each line's record with ``step > after_step`` as one ``steps`` row (names mapped with
    ``family``; ``"auto"``: guessed from every name in the file, as a reader in place guesses it). With ``merge_lines``, consecutive lines of one
    step are one row (written when a later step starts or the file's end is reached; a line of a step
    already written is skipped).

    With ``follow``, keep reading as the file grows (an incomplete last line waits for its end; a file that
    shrinks — verl reopens it with ``"wb"`` on restart — is read again from the start, steps already
    written skipped) until ``stop`` is set or nothing new arrives for ``idle_timeout_s``. Rows are flushed
    after each read, so a follower's rows reach disk as they come.
    """
    names = _Names(family)
    names.learn(_names_in(path, parse))
    report = IngestReport()
    last_step = after_step
    position = 0
    line_number = 0
    idle_since = time.monotonic()
    pending: list[bytes] = []  # the chunks of the line being read
    held: tuple[int, dict[str, Any]] | None = None

    def write(step: int, data: Mapping[str, Any]) -> None:
        monitor.log_scalars(step, names(data), names=None)
        report.rows += 1
        if report.rows % FLUSH_EVERY_ROWS == 0:
            monitor.flush()

    with open(path, "rb") as handle:
        while True:
            if Path(path).stat().st_size < position:  # truncated and rewritten: start over
                handle.seek(0)
                position, line_number, pending = 0, 0, []
            chunk = handle.read(1 << 20)
            position += len(chunk)
            *lines, tail = chunk.split(b"\n")
            if lines:  # a line's chunks are joined once, when its end arrives: linear in its length
                lines[0] = b"".join([*pending, lines[0]])
                pending = []
            if tail:
                pending.append(tail)
            if not follow and not chunk and pending:
                lines, pending = [b"".join(pending)], []  # the last line has no newline: it is complete
            for line in lines:
                line_number += 1
                if not line.strip():
                    continue
                report.lines += 1
                try:
                    step, data = parse(line)
                except ValueError as error:
                    report.bad_lines.append(line_number)
                    report.first_error = report.first_error or f"line {line_number}: {error}"
                    continue
                if held is not None and step == held[0]:
                    held[1].update(data)
                    continue
                if step <= last_step:
                    report.already_ingested += 1
                    continue
                if held is not None:
                    write(*held)
                held, last_step = (step, dict(data)), step
                if not merge_lines:
                    write(*held)
                    held = None
            if not chunk and held is not None:
                write(*held)
                held = None
                monitor.flush()
            if lines:
                monitor.flush()
                idle_since = time.monotonic()
            if chunk:
                continue
            if not follow or (stop is not None and stop.is_set()):
                return report
            if idle_timeout_s is not None and time.monotonic() - idle_since > idle_timeout_s:
                return report
            time.sleep(poll_s)


def ingest_run(run: ForeignRun, monitor: Monitor, after_step: int = -1) -> IngestReport:
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
