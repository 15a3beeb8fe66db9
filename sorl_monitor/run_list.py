"""The dashboard's run list at fleet scale: read from the verdict table ``sorl fleet`` wrote at the root
(``verdict_table.VERDICTS_FILE``), not from every run, so a folder of thousands of runs lists in
milliseconds and only the runs a viewer picks are opened.

    runs = VerdictList("runs/")          # the root holds verdicts.parquet (``VerdictList.present``)
    runs.refresh()                       # reads the table again only when it changed
    filter_runs(runs.runs, {"collapsing", "collapsed"}, "grpo")

Order: the table's, most urgent first (``verdict_table.sorted_verdicts``), then the run folders written
since the table (``UNJUDGED``: listed by name, a stat each, never opened).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from sorl_monitor.schema import RUN_FILE
from sorl_monitor.verdict_table import STATUS_ORDER, VERDICTS_FILE, read_verdicts, sorted_verdicts

UNJUDGED = "not_in_table"
"""The status of a run folder under the root that the verdict table does not hold (written since)."""


@dataclass(frozen=True)
class ListedRun:
    """One run as the fleet's run list shows it (a row of the verdict table)."""

    run_id: str
    path: str
    status: str
    algorithm: str | None = None
    collapse_step: int | None = None
    last_step: int | None = None
    root_cause: str | None = None
    error: str | None = None


class VerdictList:
    """The runs of a root as its verdict table lists them; safe to share between threads."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self.runs: list[ListedRun] = []
        self.judged_at: str | None = None
        """When the newest row of the table was judged (``updated_at``), as ``YYYY-MM-DD HH:MM UTC``."""
        self._signature: tuple[float, int] | None = None
        self._lock = threading.Lock()

    @staticmethod
    def present(root: str | os.PathLike[str]) -> bool:
        """Whether ``root`` holds a verdict table (then the dashboard lists runs from it)."""
        return (Path(root) / VERDICTS_FILE).is_file()

    def refresh(self) -> bool:
        """Read the table again if it changed (its size or mtime) and list the run folders it lacks.
        True when the list changed."""
        with self._lock:
            try:
                stat = (self.root / VERDICTS_FILE).stat()
                signature = (stat.st_mtime, stat.st_size)
            except OSError:
                signature = None
            judged = self.runs if signature == self._signature else None
            if judged is None:
                table = read_verdicts(self.root)
                judged = [] if table is None else listed_runs(table)
                self.judged_at = None if table is None else _newest(table)
                self._signature = signature
            judged = [run for run in judged if run.status != UNJUDGED]
            runs = judged + unjudged_runs(self.root, judged)
            changed = runs != self.runs
            self.runs = runs
            return changed

    def by_id(self) -> dict[str, ListedRun]:
        """Each listed run by its id."""
        return {run.run_id: run for run in self.runs}


def listed_runs(table: pa.Table) -> list[ListedRun]:
    """The verdict table's rows as ``ListedRun`` s, most urgent first (``sorted_verdicts``)."""
    fields = ListedRun.__dataclass_fields__
    rows = sorted_verdicts(table).to_pylist()
    return [
        ListedRun(**{name: row.get(name) for name in fields})
        for row in rows
        if row.get("run_id") and row.get("status")
    ]


def unjudged_runs(root: Path, judged: Sequence[ListedRun]) -> list[ListedRun]:
    """Run folders directly under ``root`` (a ``run.json`` each) that no judged run's path names, by name."""
    known = {Path(run.path).name for run in judged if run.path} | {run.run_id for run in judged}
    found = []
    try:
        entries = sorted(os.scandir(root), key=lambda entry: entry.name)
    except OSError:
        return []
    for entry in entries:
        if entry.name in known or not entry.is_dir():
            continue
        if (Path(entry.path) / RUN_FILE).is_file():
            found.append(ListedRun(run_id=entry.name, path=entry.path, status=UNJUDGED))
    return found


def filter_runs(
    runs: Sequence[ListedRun], statuses: Collection[str] | None, search: str = ""
) -> list[ListedRun]:
    """The runs whose status is in ``statuses`` (all when ``None``) and whose id, algorithm or root cause
    contains ``search`` (any case), in their order."""
    needle = search.strip().lower()
    return [
        run
        for run in runs
        if (statuses is None or run.status in statuses)
        and (
            not needle
            or any(needle in (text or "").lower() for text in (run.run_id, run.algorithm, run.root_cause))
        )
    ]


def status_counts(runs: Sequence[ListedRun]) -> dict[str, int]:
    """How many runs have each status, most urgent status first (``STATUS_ORDER``, then the others)."""
    counts: dict[str, int] = {}
    for run in runs:
        counts[run.status] = counts.get(run.status, 0) + 1
    order = {status: i for i, status in enumerate((*STATUS_ORDER, UNJUDGED))}
    return dict(sorted(counts.items(), key=lambda item: (order.get(item[0], len(order)), item[0])))


def _newest(table: pa.Table) -> str | None:
    if "updated_at" not in table.column_names or not table.num_rows:
        return None
    newest = pc.max(table.column("updated_at")).as_py()
    return None if newest is None else newest.strftime("%Y-%m-%d %H:%M UTC")
