"""verl's ``console`` logger output, as a captured console holds it, between any other lines.

verl's ``LocalLogger`` prints one line per training step (``verl/utils/logger/aggregate_logger.py``,
``concat_dict_to_str``): ``step:N - key:value - key:value …`` with the numeric metrics only, each value as
``f"{v:.3f}"`` (verl up to mid-2025) or ``pprint.pformat(v)`` (later: ``0.0021``, ``12``, ``nan``, and NumPy
scalars as NumPy 2 writes them, ``np.float64(0.002)``). Under Ray the line carries a prefix such as
``(TaskRunner pid=1234)`` in ANSI colours. A value wrapped as ``np.<type>(x)``, ``numpy.<type>(x)`` or
``tensor(x, …)`` is read as ``x``; a value that is not a number is left out of its row.
"""

from __future__ import annotations

import re
import warnings
from collections import Counter
from pathlib import Path

import numpy as np

from sorl_monitor.logs.console import console_lines, console_text, scan_head
from sorl_monitor.logs.file_head import complete_lines
from sorl_monitor.logs.segments import split_runs
from sorl_monitor.logs.table import NO_STEPS, ForeignRun, LogWarning, foreign_run, pivot
from sorl_monitor.schema import metric_column

STEP_LINE = re.compile(r"(?<![\w/.-])step:(\d+)( - \S.*)$")
"""``step:N - …`` anywhere in a line (not ``global_step:N``), up to the line's end."""
VALIDATION_PREFIXES = ("val-", "val/", "test_score/")
"""verl's validation metrics (``val-core/…``, ``val-aux/…``; ``val/…`` and ``test_score/…`` before): a line of nothing else is an
evaluation (``val_before_train`` prints one at step 0), not a training step, and is left out."""
_NUMBER = r"[-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?|nan|inf)|True|False"
_VALUE = rf"(?:(?:np|numpy|torch)\.\w+\(|tensor\()?\s*({_NUMBER})\s*(?:,[^)]*)?\)?"
VALUE = re.compile(_VALUE)
"""A printed value: ``0.41``, ``nan``, ``True``, ``np.float64(0.002)``, ``numpy.int64(3)``,
``tensor(0.25, device='cuda:0')``; the number inside is its group 1."""
CELL = re.compile(rf" - ([^\s:]+):{_VALUE}(?= - |\s*$)")
"""One `` - name:value`` of a step line whose value is a number (others are skipped)."""
BOOLS = {"True": 1.0, "False": 0.0}


def number(text: str) -> float | None:
    """A printed metric value as a float (``VALUE``), or ``None`` when it is not a number."""
    match = VALUE.fullmatch(text.strip())
    if match is None:
        return None
    raw = match.group(1)
    return BOOLS[raw] if raw in BOOLS else float(raw)


STEP_START = re.compile(r"(?<![\w/.-])step:\d+ - ")
"""Where a step's cells begin: a line holding two is a cut line with the next one joined to it."""


def parse_line(line: str) -> tuple[int, dict[str, float]] | None:
    """``(step, {name: value})`` of one console line holding verl's step metrics, or ``None``."""
    match = STEP_LINE.search(line)
    if match is None:
        return None
    metrics = {name: BOOLS[raw] if raw in BOOLS else float(raw) for name, raw in CELL.findall(match.group(2))}
    return (int(match.group(1)), metrics) if metrics else None


def parse_steps(line: str) -> list[tuple[int, dict[str, float]]]:
    """Every step printed on ``line``: one, or several where a line cut short has the next joined to it (the
    cut one's last cell, which the cut ran into, is not read: ``CELL`` needs `` - `` or the end after it)."""
    starts = [m.start() for m in STEP_START.finditer(line)]
    if len(starts) < 2:
        parsed = parse_line(line)
        return [parsed] if parsed is not None else []
    pieces = [line[a:b] for a, b in zip(starts, [*starts[1:], len(line)], strict=True)]
    return [parsed for piece in pieces if (parsed := parse_line(piece)) is not None]


def _drop_cut_cells(path: Path, lines: list[tuple[int, int, dict[str, float]]]) -> None:
    """A line with fewer cells than most, right before the step goes back (or at the end), was cut short as
    its job died: its last value may be cut mid-number (``0.8…`` → ``0``), so it is left out, with a warning."""
    if len(lines) < 3:
        return
    usual = Counter(len(metrics) for _, _, metrics in lines).most_common(1)[0][0]
    cut = []
    for i, (number, step, metrics) in enumerate(lines):
        before_restart = i + 1 == len(lines) or lines[i + 1][1] <= step
        if len(metrics) < usual and before_restart and len(metrics) > 1 and i + 1 < len(lines):
            metrics.pop(next(reversed(metrics)))
            cut.append(number)
    if cut:
        warnings.warn(
            f"{path}: {len(cut)} line(s) cut short before a restart (first: line {cut[0]}): their last value "
            "left out",
            LogWarning,
            stacklevel=4,
        )


def looks_like(path: Path) -> bool:
    """A text file with a line of verl's step metrics (``step:N - name:value``) in its first ``SCAN_BYTES``."""
    start = scan_head(path)
    if b"step:" not in start:
        return False
    return any(parse_line(line) is not None for line in console_text(start).splitlines() if "step:" in line)


def read(path: Path, name: str) -> list[ForeignRun]:
    """The runs in a captured verl console: one row per ``step:N`` line (a step printed again keeps its later
    values; a line of validation metrics only is left out), names mapped with verl's table. A restart in the
    same file, or two jobs writing one file in turn, gives runs of their own (``segments.split_runs``)."""
    lines: list[tuple[int, int, dict[str, float]]] = []
    huge: list[int] = []
    for number, line in enumerate(console_lines(complete_lines(path, lambda _line: False)), 1):
        for step, metrics in parse_steps(line) if "step:" in line else ():
            if all(k.startswith(VALIDATION_PREFIXES) for k in metrics):
                continue
            if step >= 2**63:
                huge.append(number)
                continue
            if lines and lines[-1][1] == step and not lines[-1][2].keys() & metrics.keys():
                lines[-1][2].update(metrics)  # one step printed over two lines
                continue
            lines.append((number, step, metrics))
    _drop_cut_cells(path, lines)
    if huge:
        warnings.warn(
            f"{path}: {len(huge)} step lines with a step beyond 2^63 − 1 left out (first: line {huge[0]})",
            LogWarning,
            stacklevel=3,
        )
    if not lines:
        return [foreign_run(path, "verl-console", name, NO_STEPS, info={"algorithm": "verl"}, family="verl")]
    line_steps = np.array([step for _, step, _ in lines], np.float64)
    runs = []
    for part, rows in split_runs(
        path, name, line_steps, unit="line", positions=[n for n, _, _ in lines], one_row_per_step=True
    ):
        steps: list[int] = []
        names: list[str] = []
        values: list[float] = []
        for i in rows:
            _, step, metrics = lines[i]
            steps.extend([step] * len(metrics))
            names.extend(metric_column(k) if k == "step" else k for k in metrics)
            values.extend(metrics.values())
        table = pivot(np.array(steps, np.int64), names, np.array(values), None)
        info = {"algorithm": "verl", **({"segment_of": name} if part != name else {})}
        runs.append(foreign_run(path, "verl-console", part, table, info=info, family="verl"))
    return runs
