"""The console of a hand-written training loop: ``name: number`` / ``name=number`` pairs beside a counter.

People who write their own GRPO or PPO loop print what they like, for example::

    Epoch:[1/1](40/500), Reward: 0.33, Fmt: 0.9, KL_ref: 0.004, Avg Len: 88
    GRPO Iteration: 12            (then a reward histogram and a few ``Mean reward: 0.41`` lines)
    2025-09-03 15:10:59 | step 5 | reward=0.31 kl=0.002 loss=-0.04

A line's **counter** is, in this order: a word counter (``step``, ``iteration``, ``iter``, ``update``,
``episode``, ``batch``, ``round``, then ``N`` or ``N/M``), or a bracketed count ``(i/N)`` / ``[i/N]`` (after
``Epoch [e/E]``, the step is ``(e − 1)·N + i``), or an epoch alone. The counter opens a **block**: the
``name: number`` pairs on its line and on the lines after it, up to the next counter, belong to that step; a
name seen several times in one block (per-prompt rewards) is averaged. Pairs before the first counter
(the configuration a script prints) are not read. A console with no counter at all, whose lines each hold the
same two or more names, is numbered by line, with a warning. Names start with a letter (histogram buckets such
as ``0.0-0.2: 12`` are not metrics); the counter words themselves are not metrics.
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

WORD_COUNTER = re.compile(
    r"(?<![\w-])(step|iteration|iter|update|episode|batch|round)\b\s*[:=#]?\s*\[?\s*(\d+)(?:\s*/\s*\d+)?",
    re.I,
)
EPOCH_COUNTER = re.compile(r"(?<![\w-])epoch\b\s*[:=#]?\s*[\[(]?\s*(\d+)(?:\s*/\s*(\d+))?\s*[\])]?", re.I)
FRACTION = re.compile(r"[\[(]\s*(\d+)\s*/\s*(\d+)\s*[\])]")
LEAD_FRACTION = re.compile(r"^\s*(?:\[[^\]]*\]\s*)?(\d+)\s*/\s*(\d+)\s*[|,:]")
"""A line that starts with its count, ``  12/50 | loss=…`` (after a ``[run]`` tag)."""
TABLE_ROW = re.compile(r"^\s*\|\s*([A-Za-z][^|]{0,40}?)\s*\|\s*([-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|\.\d+))\b")
"""A Markdown table row ``| Accuracy Mean | 0.750 ± 0.433 |``: its first two cells as a name and a number."""
_NUMBER = r"[-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?|nan|inf)"
_WORD = r"[A-Za-z][A-Za-z_/.@\-]*\d*"
PAIR = re.compile(rf"(?<![\w.])({_WORD}(?: {_WORD}){{0,2}})\s*[:=]\s*({_NUMBER})(?=[\s,;|)%\]]|$)")
"""``name: number`` or ``name=number``; a name is up to three words of letters (digits only at a word's end)."""
COUNTER_NAMES = frozenset({"step", "iteration", "iter", "update", "episode", "batch", "round", "epoch"})
LOG_SUFFIXES = frozenset({".log", ".txt", ".out", ".err", ".md", ""})
"""A file read as such a console by its content only when its name looks like a captured console."""
MIN_STEPS = 3
"""Detection: at least this many counted steps with a metric each in the first MiB."""


def counters(line: str) -> list[tuple[str, int]]:
    """The ``(kind, step)`` counters of a line by the module's rules: a word counter's kind is its word, a
    bracketed count's ``(i/N)``, an epoch's ``epoch``."""
    found = [(_word_kind(word), int(word.group(2))) for word in WORD_COUNTER.finditer(line)]
    lead = LEAD_FRACTION.match(line)
    if lead is not None:
        found.append(("i/N", int(lead.group(1))))
    epoch = EPOCH_COUNTER.search(line)
    rest = line[epoch.end() :] if epoch is not None else line
    fraction = FRACTION.search(rest)
    if fraction is not None:
        inner, total = int(fraction.group(1)), int(fraction.group(2))
        if epoch is not None and epoch.group(2) is not None:
            found.append(("(i/N)", (max(int(epoch.group(1)), 1) - 1) * total + inner))
        else:
            found.append(("(i/N)", inner))
    elif epoch is not None:
        found.append(("epoch", int(epoch.group(1))))
    return found


PROSE_WORDS = 6
"""A line with more words than this and no metric is prose (``Step 1: Identify the key information…`` in a
printed completion): its counter is not read."""
_WORDS = re.compile(r"[A-Za-z]{2,}")


def line_counters(line: str) -> list[tuple[str, int]]:
    """``counters`` of a line that is not prose (``PROSE_WORDS``)."""
    found = counters(line)
    if found and len(_WORDS.findall(line)) > PROSE_WORDS and not pairs(line):
        return []
    return found


def _word_kind(word: re.Match) -> str:
    """``step`` for ``Step 3``, ``step/N`` for ``Step: 3/43``: two counters a log may print side by side."""
    return word.group(1).lower() + ("/N" if "/" in word.group(0) else "")


def main_counter(lines: list[str]) -> str | None:
    """The kind of counter that numbers the loop: the one with the most distinct values, less the times it goes
    back (a ``Micro-update 1/1`` inside each step, or ``Step 1: …`` in a printed completion, counts less than the
    loop's own ``Step: 3/43``); a tie goes to the one printed first."""
    seen: dict[str, list[int]] = {}
    for line in lines:
        for kind, step in line_counters(line):
            seen.setdefault(kind, []).append(step)

    def score(kind: str) -> int:
        values = seen[kind]
        return len(set(values)) - sum(b < a for a, b in zip(values, values[1:], strict=False))

    return max(seen, key=score, default=None)


def pairs(line: str) -> list[tuple[str, float]]:
    """The ``name: number`` pairs of a line (or a Markdown table row's first two cells), counter words left out."""
    row = TABLE_ROW.match(line)
    if row is not None:
        return [(row.group(1).strip(), float(row.group(2)))]
    out = []
    for name, raw in PAIR.findall(line):
        name = name.strip()
        if len(name) > 1 and name.split()[-1].lower() not in COUNTER_NAMES:
            out.append((name, float(raw)))
    return out


def blocks(lines: list[str]) -> list[tuple[int, int, dict[str, float]]]:
    """``(line number, step, {name: mean value})`` of each block, in the log's order (``main_counter``'s;
    a stray mention of it that leaves the sequence and comes straight back, ``strays``, is not a counter)."""
    kind = main_counter(lines)
    at = {}
    if kind is not None:
        for i, line in enumerate(lines):
            step = next((value for k, value in line_counters(line) if k == kind), None)
            if step is not None:
                at[i] = step
    stray = strays(list(at.values()))
    at = {i: step for (i, step), bad in zip(at.items(), stray, strict=True) if not bad}
    out: list[tuple[int, int, dict[str, list[float]]]] = []
    for i, line in enumerate(lines):
        step = at.get(i)
        found = pairs(line)
        if step is not None and (not out or out[-1][1] != step or found and _repeats(out[-1][2], found)):
            out.append((i + 1, step, {}))
        if out and found:
            for name, value in found:
                out[-1][2].setdefault(name, []).append(value)
    return [(n, s, {k: float(np.mean(v)) for k, v in m.items()}) for n, s, m in out if m]


def strays(steps: list[int]) -> list[bool]:
    """Counter values that leave the sequence for one mention and come straight back (a ``step 5`` in a printed
    completion): below the one before while the next is back at or above it, or above the next one while the
    next one continues from the one before."""
    bad = [False] * len(steps)
    for k in range(1, len(steps) - 1):
        before, value, after = steps[k - 1], steps[k], steps[k + 1]
        if (value < before <= after) or (value > after >= before and value != before):
            bad[k] = True
    return bad


def _repeats(block: dict[str, list[float]], found: list[tuple[str, float]]) -> bool:
    """A counter line whose names the block already holds, on a line of its own: a new row of the same step
    (a log printed twice, a restart) rather than more of this block."""
    return bool(found) and all(name in block for name, _ in found) and len(found) >= max(2, len(block) // 2)


def numbered_lines(lines: list[str]) -> list[tuple[int, int, dict[str, float]]]:
    """A console with no counter: lines that hold the commonest set of two or more names, numbered 1, 2, …"""
    found = [(n, dict(pairs(line))) for n, line in enumerate(lines, 1)]
    found = [(n, m) for n, m in found if len(m) >= 2]
    if not found:
        return []
    common = Counter(frozenset(m) for _, m in found).most_common(1)[0][0]
    rows = [(n, m) for n, m in found if frozenset(m) == common]
    return [(n, k, m) for k, (n, m) in enumerate(rows, 1)]


def looks_like(path: Path) -> bool:
    """A text file named like a console, with ``MIN_STEPS`` counted steps holding metrics in its first MiB."""
    if path.suffix.lower() not in LOG_SUFFIXES:
        return False
    start = scan_head(path)
    if not start:
        return False
    found = blocks(console_text(start).replace("\r", "\n").splitlines())
    return len({step for _, step, _ in found}) >= MIN_STEPS


def read(path: Path, name: str) -> list[ForeignRun]:
    """The runs in a hand-written loop's console: one row per counted step (``blocks``); a counter going back
    starts a run of its own (``segments.split_runs``)."""
    lines = console_lines(complete_lines(path, lambda _line: False))
    found = blocks(lines)
    rule = "counter"
    if len({step for _, step, _ in found}) < MIN_STEPS:
        found, rule = numbered_lines(lines), "line rank"
        if found:
            warnings.warn(
                f"{path}: no step, iteration or epoch counter; its {len(found)} metric lines are numbered 1, 2, …",
                LogWarning,
                stacklevel=3,
            )
    if not found:
        return [foreign_run(path, "console", name, NO_STEPS)]
    steps = np.array([step for _, step, _ in found], np.float64)
    runs = []
    for part, rows in split_runs(path, name, steps, unit="line", positions=[n for n, _, _ in found]):
        points = [(found[i][1], k, v) for i in rows for k, v in found[i][2].items()]
        table = pivot(np.array([p[0] for p in points], np.int64), [p[1] for p in points],
                      np.array([p[2] for p in points]), None)  # fmt: skip
        info = {"config": {"step_rule": rule}, **({"segment_of": name} if part != name else {})}
        runs.append(foreign_run(path, "console", part, table, info=info))
    return runs
