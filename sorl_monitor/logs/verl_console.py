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
from pathlib import Path

import numpy as np

from sorl_monitor.logs.console import console_lines, console_text, scan_head
from sorl_monitor.logs.sniff import complete_lines
from sorl_monitor.logs.table import NO_STEPS, ForeignRun, foreign_run, pivot
from sorl_monitor.schema import metric_column

STEP_LINE = re.compile(r"(?<![\w/.-])step:(\d+)( - \S.*)$")
"""``step:N - …`` anywhere in a line (not ``global_step:N``), up to the line's end."""
VALIDATION_PREFIXES = ("val-", "val/")
"""verl's validation metrics (``val-core/…``, ``val-aux/…``; ``val/…`` before): a line of nothing else is an
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


def parse_line(line: str) -> tuple[int, dict[str, float]] | None:
    """``(step, {name: value})`` of one console line holding verl's step metrics, or ``None``."""
    match = STEP_LINE.search(line)
    if match is None:
        return None
    metrics = {name: BOOLS[raw] if raw in BOOLS else float(raw) for name, raw in CELL.findall(match.group(2))}
    return (int(match.group(1)), metrics) if metrics else None


def looks_like(path: Path) -> bool:
    """A text file with a line of verl's step metrics (``step:N - name:value``) in its first ``SCAN_BYTES``."""
    start = scan_head(path)
    if b"step:" not in start:
        return False
    return any(parse_line(line) is not None for line in console_text(start).splitlines() if "step:" in line)


def read(path: Path, name: str) -> list[ForeignRun]:
    """The run in a captured verl console: one row per ``step:N`` line (a step printed again, as after a
    resume, keeps its later values; a line of validation metrics only is left out), names mapped with
    verl's table."""
    steps: list[int] = []
    names: list[str] = []
    values: list[float] = []
    for line in console_lines(complete_lines(path, lambda _line: False)):
        parsed = parse_line(line) if "step:" in line else None
        if parsed is not None and not all(k.startswith(VALIDATION_PREFIXES) for k in parsed[1]):
            step, metrics = parsed
            steps.extend([step] * len(metrics))
            names.extend(metric_column(k) if k == "step" else k for k in metrics)
            values.extend(metrics.values())
    table = pivot(np.array(steps, np.int64), names, np.array(values), None) if steps else NO_STEPS
    return [foreign_run(path, "verl-console", name, table, info={"algorithm": "verl"}, family="verl")]
