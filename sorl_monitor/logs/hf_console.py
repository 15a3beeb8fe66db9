"""Hugging Face ``Trainer`` / TRL console output: tqdm bars with the log dicts printed between them.

``ProgressCallback.on_log`` writes each ``Trainer.log`` dict with ``tqdm.write(str(logs))`` (``PrinterCallback``
with ``print(logs)`` when the bar is off): one line, Python's repr, ``{'loss': 0.1, 'reward': …, 'epoch': 0.02}``.
transformers 5 writes floats as text with four significant digits (``{'loss': '3.647', …}``), older versions
the floats themselves. A dict is read with ``ast.literal_eval`` (a line of at most ``MAX_DICT_CHARS``). Training dicts are the flat
dicts with an ``epoch`` key (``Trainer.log`` adds it); bare ``nan``/``inf`` (older versions) are quoted before
``literal_eval`` and read back as numbers like the quoted ones; evaluation dicts (``eval_*`` keys) and the
end-of-training summary (``train_runtime``, …) are left out.

The dict holds no step. Its step, the first rule that applies (``step_rule`` says which was used):

1. ``logging_steps`` given (``--logging-steps``, or ``logging_steps`` in the config): the k-th training dict
   is step ``k × logging_steps``;
2. ``bar``: the training bar's count ``N/M`` where it is redrawn after each dict, when every dict has one and
   the counts rise strictly (the console was a terminal, or stdout unbuffered);
3. ``logging_steps`` printed in the log (``logging_steps=20``, ``'logging_steps': 20``), else read off the bar:
   ``tqdm.write`` clears the bar (a line of spaces) and redraws it at the step of the write, so the most
   common gap between the redrawn counts is ``logging_steps`` (a block-buffered stdout, as under ``nohup``,
   prints the dicts in bursts long after their bar positions, so rule 2 fails there but this one holds);
4. otherwise the dict's rank k, with a warning.
"""

from __future__ import annotations

import ast
import re
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from sorl_monitor.logs.console import console_lines, console_text, scan_head
from sorl_monitor.logs.segments import split_runs
from sorl_monitor.logs.table import NO_STEPS, ForeignRun, LogWarning, foreign_run, records_table

MAX_DICT_CHARS = 1 << 16
"""Longest line read as a log dict (``ast.literal_eval`` is given nothing longer)."""
EPOCH = "epoch"
SUMMARY_KEYS = frozenset(
    {"train_runtime", "train_samples_per_second", "train_steps_per_second", "train_loss"}
)
EVAL_PREFIX = "eval_"
BAR = re.compile(r"^\s*\d+%\|[^|]*\|\s*(\d+)/(\d+) \[")
"""A tqdm bar without a description (transformers' training and evaluation bars): its count and total."""
LOGGING_STEPS = re.compile(r"""['"]?logging_steps['"]?\s*[=:]\s*(\d+)""")
NON_FINITE = re.compile(r"(?<![\w'\".])(-?)(nan|inf)(?![\w'\"])")


_KEY = r"'([^'\\]*)'"
_VALUE = r"(?:'([^'\\]*)'|(-?(?:\d[\d.]*(?:[eE][-+]?\d+)?|nan|inf)|True|False|None))"
ENTRY = re.compile(rf"\s*{_KEY}\s*:\s*{_VALUE}\s*")
FLAT_DICT = re.compile(rf"\{{(?:\s*{_KEY}\s*:\s*{_VALUE}\s*(?:,\s*{_KEY}\s*:\s*{_VALUE}\s*)*)?\}}")
"""A flat dict of quoted keys and plain values, the usual printed log dict: read without ``literal_eval``."""
CONSTANTS = {"True": True, "False": False, "None": None}


def _plain_dict(text: str) -> dict[str, Any] | None:
    """The fast path of ``parse_dict``: a dict ``FLAT_DICT`` matches, its entries read by regex."""
    if not FLAT_DICT.fullmatch(text):
        return None
    logs: dict[str, Any] = {}
    for key, quoted, plain in ENTRY.findall(text[1:-1]):
        logs[key] = (CONSTANTS[plain] if plain in CONSTANTS else float(plain)) if plain else quoted
    return logs


def parse_dict(line: str) -> dict[str, Any] | None:
    """The flat dict printed on ``line`` (text before ``{`` ignored), or ``None``."""
    start, end = line.find("{'"), line.rfind("}")
    if start < 0 or end < start or end - start > MAX_DICT_CHARS:
        return None
    text = line[start : end + 1]
    plain = _plain_dict(text)
    if plain is not None:
        return plain
    text = NON_FINITE.sub(lambda m: f"'{m.group(1)}{m.group(2)}'", text)
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return None
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        return None
    if any(isinstance(v, dict | list | tuple | set) for v in value.values()):
        return None
    return value


def value_of(raw: Any) -> float | bool | str | None:
    """A printed value: numbers as float, numeric text (``'3.647'``, ``'nan'``) as float, other text kept."""
    if isinstance(raw, bool):
        return raw
    if isinstance(raw, int | float):
        return float(raw)
    if isinstance(raw, str):
        try:
            return float(raw)
        except ValueError:
            return raw
    return None


def is_training_dict(logs: dict[str, Any]) -> bool:
    """A ``Trainer.log`` dict of a training step: has ``epoch``, no ``eval_*`` key, not the summary."""
    return (
        EPOCH in logs
        and not SUMMARY_KEYS & logs.keys()
        and not any(key.startswith(EVAL_PREFIX) for key in logs)
    )


DICT_LINE = re.compile(r"^\s*(?:\([^()]*\)\s*)?\{'.*\}\s*$")
"""A line that is a printed dict, alone or after a Ray-style ``(pid=…)`` prefix (not ``logs = {…}`` in code)."""


def looks_like(path: Path) -> bool:
    """A text file with a line that is a training log dict (``DICT_LINE``) in its first ``SCAN_BYTES``."""
    start = scan_head(path)
    if b"{'" not in start or b"'epoch'" not in start:
        return False
    for line in console_text(start).replace("\r", "\n").splitlines():
        if "'epoch'" in line and DICT_LINE.match(line) and (logs := parse_dict(line)) is not None:
            if is_training_dict(logs):
                return True
    return False


def _training_bar_counts(lines: list[str]) -> list[tuple[int, int]]:
    """``(line index, count)`` of every drawing of the training bar (the bar total drawn most often)."""
    bars = [(i, int(m.group(1)), int(m.group(2))) for i, line in enumerate(lines) if (m := BAR.match(line))]
    if not bars:
        return []
    total = Counter(total for _, _, total in bars).most_common(1)[0][0]
    return [(i, count) for i, count, t in bars if t == total]


def _bar_steps(dict_lines: list[int], bars: list[tuple[int, int]]) -> list[int] | None:
    """Rule 2: the count of the first training-bar line after each dict (``tqdm.write`` redraws the bar with
    its exact count right after the text; a drawing before it may be stale, tqdm skips redraws within its
    ``mininterval``), if every dict has one and they rise strictly."""
    steps, at = [], 0
    for line in dict_lines:
        while at < len(bars) and bars[at][0] < line:
            at += 1
        if at == len(bars) or (steps and bars[at][1] <= steps[-1]):
            return None
        steps.append(bars[at][1])
    return steps


def _logging_steps_in(text: str, lines: list[str], bars: list[tuple[int, int]]) -> int | None:
    """Rule 3: ``logging_steps`` as printed in the log, else the commonest gap between bar redraws after a
    clear (a line of spaces)."""
    printed = LOGGING_STEPS.search(text)
    if printed and int(printed.group(1)) > 0:
        return int(printed.group(1))
    cleared = {i for i, line in enumerate(lines) if line and not line.strip()}
    redraws, pending = [], False
    bar_at = dict(bars)
    for i in range(len(lines)):
        if i in cleared:
            pending = True
        elif pending and i in bar_at:
            if not redraws or bar_at[i] != redraws[-1]:
                redraws.append(bar_at[i])
            pending = False
    gaps = Counter(b - a for a, b in zip(redraws, redraws[1:], strict=False) if b > a)
    if gaps:
        return gaps.most_common(1)[0][0]
    return redraws[0] if len(redraws) == 1 and redraws[0] > 0 else None


def read(path: Path, name: str, logging_steps: int | None = None) -> list[ForeignRun]:
    """The runs in a captured ``Trainer`` console: one row per training dict, its step by the module's rules.
    A dict printed twice in a row counts once; training started again in the same file (the dicts' ``epoch``
    going back) is a run of its own (``segments.split_runs``), each numbered by the rules on its own lines."""
    data = path.read_bytes()  # a half-written dict does not parse, a half-drawn bar does not match
    lines = console_lines(data)
    dicts: list[tuple[int, dict[str, Any]]] = []
    doubled = []
    for i, line in enumerate(lines):
        if "{'" in line and (logs := parse_dict(line)) is not None and is_training_dict(logs):
            if dicts and logs == dicts[-1][1]:
                doubled.append(i + 1)
                continue
            dicts.append((i, logs))
    if doubled:
        warnings.warn(
            f"{path}: {len(doubled)} log dicts printed twice in a row counted once (first: line {doubled[0]})",
            LogWarning,
            stacklevel=3,
        )
    if not dicts:
        return [foreign_run(path, "hf-console", name, NO_STEPS)]
    epochs = np.array([_epoch(logs) for _, logs in dicts], np.float64)
    parts = split_runs(path, name, epochs, unit="line", positions=[i + 1 for i, _ in dicts], axis="epoch")
    bars = _training_bar_counts(lines)
    runs = []
    for k, (part, rows) in enumerate(parts):
        mine = [dicts[i] for i in rows]
        low = dicts[parts[k - 1][1].max()][0] if k else -1
        high = dicts[parts[k + 1][1].min()][0] if k + 1 < len(parts) else len(lines)
        own_bars = [(i, count) for i, count in bars if low < i < high]
        runs.append(_numbered_run(path, part, data, lines, mine, own_bars, logging_steps, segment_of=name))
    return runs


def _epoch(logs: dict[str, Any]) -> float:
    value = value_of(logs.get(EPOCH))
    return float(value) if isinstance(value, float) else float("nan")


def _numbered_run(
    path: Path,
    name: str,
    data: bytes,
    lines: list[str],
    dicts: list[tuple[int, dict[str, Any]]],
    bars: list[tuple[int, int]],
    logging_steps: int | None,
    segment_of: str,
) -> ForeignRun:
    """One run's dicts numbered by the module's rules (``step_rule`` says which)."""
    steps, rule = None, "logging_steps given"
    if logging_steps is not None:
        steps = [logging_steps * k for k in range(1, len(dicts) + 1)]
    if steps is None:
        steps, rule = _bar_steps([i for i, _ in dicts], bars), "bar"
    if steps is None:
        found = _logging_steps_in(console_text(data), lines, bars)
        if found is not None:
            steps, rule = [found * k for k in range(1, len(dicts) + 1)], f"logging_steps {found} × rank"
    if steps is None:
        steps, rule = list(range(1, len(dicts) + 1)), "rank"
        warnings.warn(
            f"{path}: its log dicts carry no step and neither the bar nor the log says logging_steps; "
            "steps are the dicts' ranks (give --logging-steps)",
            LogWarning,
            stacklevel=4,
        )
    rows = [
        {"step": step, **{k: v for k, raw in logs.items() if (v := value_of(raw)) is not None}}
        for step, (_, logs) in zip(steps, dicts, strict=True)
    ]
    info: dict[str, Any] = {"config": {"step_rule": rule}}
    if name != segment_of:
        info["segment_of"] = segment_of
    return foreign_run(path, "hf-console", name, records_table(rows), info=info)
