"""The dashboard's run list at fleet scale: read from the verdict table ``sorl fleet`` wrote at the root
(``verdict_table.VERDICTS_FILE``, in a folder or an object-store prefix) or where ``--out`` put it, not from
every run, so a folder of thousands of runs lists in milliseconds and only the runs a viewer picks are
opened.

    runs = VerdictList("runs/")          # the root holds verdicts.parquet (``VerdictList.present``)
    runs = VerdictList("s3://bucket/runs", table="verdicts.parquet")   # a table written elsewhere
    runs.refresh()                       # reads the table again only when it changed
    filter_runs(runs.runs, {"collapsing", "collapsed"}, "grpo")

Order: the table's, most urgent first (``verdict_table.sorted_verdicts``), then the run folders written
since the table (``UNJUDGED``: listed by name, a stat each, never opened; in object storage one LIST and
a HEAD each).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs

from sorl_monitor.read.verdict_table import (
    STATUS_ORDER,
    read_verdicts,
    sorted_verdicts,
    verdicts_file,
    verdicts_stamp,
)
from sorl_monitor.schema import RUN_FILE
from sorl_monitor.storage import StorageError, filesystem, is_remote

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
    """The runs of a root as its verdict table lists them; safe to share between threads.

    ``root``: a folder or an object-store prefix (``s3://bucket/runs``, read through ``storage``);
    ``table``: the verdict table's file or URI when ``sorl fleet --out`` wrote it elsewhere (default
    ``root/verdicts.parquet``)."""

    def __init__(self, root: str | os.PathLike[str], table: str | os.PathLike[str] | None = None) -> None:
        self.root: str | Path = os.fspath(root) if is_remote(root) else Path(root)
        self.table = os.fspath(table) if table is not None else verdicts_file(root)
        """Where the verdict table is read from (a file or a URI)."""
        self.runs: list[ListedRun] = []
        self.judged_at: str | None = None
        """When the newest row of the table was judged (``updated_at``), as ``YYYY-MM-DD HH:MM UTC``."""
        self._signature: tuple[float, int] | None = None
        self._lock = threading.Lock()

    @staticmethod
    def present(root: str | os.PathLike[str]) -> bool:
        """Whether ``root`` holds a verdict table (then the dashboard lists runs from it)."""
        return verdicts_stamp(verdicts_file(root)) is not None

    def refresh(self) -> bool:
        """Read the table again if it changed (its size or mtime) and list the run folders it lacks.
        True when the list changed."""
        with self._lock:
            signature = verdicts_stamp(self.table)
            judged = self.runs if signature == self._signature else None
            if judged is None:
                table = read_verdicts(self.table)
                judged = [] if table is None else listed_runs(table)
                self.judged_at = None if table is None else _newest(table)
                self._signature = signature
            judged = [run for run in judged if run.status != UNJUDGED]
            if isinstance(self.root, Path):
                runs = judged + unjudged_runs(self.root, judged)
            else:
                runs = judged + unjudged_remote_runs(self.root, judged)
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


def unjudged_remote_runs(root: str, judged: Sequence[ListedRun]) -> list[ListedRun]:
    """``unjudged_runs`` of an object-store prefix: one LIST of the folders directly under it, then a HEAD of
    ``run.json`` in each folder that no judged run names (none when the store does not answer)."""
    known = {run.path.rstrip("/").rpartition("/")[2] for run in judged if run.path}
    known |= {run.run_id for run in judged}
    try:
        fs, inner = filesystem(root)
        folders = fs.get_file_info(pafs.FileSelector(inner, recursive=False, allow_not_found=True))
        found = []
        for folder in sorted(folders, key=lambda info: info.base_name):
            name = folder.base_name
            if folder.type != pafs.FileType.Directory or name in known or name.startswith((".", "_")):
                continue
            if fs.get_file_info(f"{folder.path}/{RUN_FILE}").type == pafs.FileType.File:
                found.append(ListedRun(run_id=name, path=f"{root.rstrip('/')}/{name}", status=UNJUDGED))
    except (OSError, StorageError):
        return []
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
