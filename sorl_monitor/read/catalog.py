"""The run catalog: which runs and logs a run set reads, and which of their part files read.

``RunCatalog`` finds Parquet run folders (``find_runs``) and other tools' logs (``find_foreign_logs``, read
into memory by ``sorl_monitor.logs``), reads each run's ``run.json`` (``read_run_info``), and lists each
table's part files: a part's footer is checked once and cached by size and modification time, a part that
does not read is skipped with a warning naming it (``skipped``), parts replaced by a compaction are left out
(``schema.visible_parts``), and a file being written is never listed (writers ``os.replace`` finished parts
into place). Object-store roots are read through a local copy that ``relist`` mirrors again
(``storage.mirror_down``). The catalog holds no lock: ``query.RunSet`` calls it under its own.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from sorl_monitor.logs import (
    ForeignRun,
    LogFormatError,
    LogOptions,
    LogSource,
    check_format,
    check_names_found,
    find_logs,
    fingerprint,
    is_run_dir,
    read_source,
)
from sorl_monitor.logs.input_limits import check_path
from sorl_monitor.logs.table import unique_ids
from sorl_monitor.read.errors import CorruptPartWarning, QueryError, first_line
from sorl_monitor.read.verdict_table import VERDICT_COLUMNS, read_verdicts
from sorl_monitor.schema import PART_GLOB, RUN_FILE, has_flush_gaps, type_conflicts, visible_parts
from sorl_monitor.storage import StorageError, is_remote, mirror_down

RUN_COLUMNS = pa.schema(
    [
        pa.field("run_id", pa.string()),
        pa.field("path", pa.string()),
        pa.field("algorithm", pa.string()),
        pa.field("seed", pa.int64()),
        pa.field("status", pa.string()),
        pa.field("created_at", pa.string()),
        pa.field("finished_at", pa.string()),
        pa.field("schema_version", pa.int64()),
        pa.field("world_size", pa.int64()),
        pa.field("config", pa.string()),
        pa.field("last_write", pa.float64()),
    ]
)


LIST_ATTEMPTS = 4
"""How many times a table folder is listed while its listing looks stale (``RunCatalog._table_parts``)."""


def list_parts(folder: Path) -> list[str]:
    """The part files in a table folder's rank folders, as one directory scan finds them."""
    return [str(p) for p in folder.glob(f"rank=*/{PART_GLOB}")]


def _as_list(
    paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
) -> list[str | os.PathLike[str]]:
    return [paths] if isinstance(paths, str | os.PathLike) else list(paths)


def _as_paths(paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]]) -> list[Path]:
    return [Path(p) for p in _as_list(paths)]


def _mirrored(uri: str | os.PathLike[str], options: dict[str, str] | None) -> Path:
    """The local copy of an object-store root, brought up to date (``storage.mirror_down``)."""
    try:
        return mirror_down(os.fspath(uri), options)
    except StorageError as error:
        raise QueryError(str(error)) from None


def find_runs(
    paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]], fmt: str | None = None
) -> list[Path]:
    """Parquet run folders named by ``paths``: each a run folder or a log folder whose children are runs
    (another tool's log, a file or a folder, holds none; ``find_logs`` finds those)."""
    found: list[Path] = []
    for path in _as_paths(paths):
        if not path.exists():
            raise QueryError(f"no such file or directory: {path}")
        if not path.is_dir() or fmt not in (None, "sorl"):
            continue
        if is_run_dir(path):
            found.append(path.resolve())
        else:
            found.extend(sorted(c.resolve() for c in path.iterdir() if c.is_dir() and is_run_dir(c)))
    return list(dict.fromkeys(found))


def find_foreign_logs(paths: Sequence[Path], fmt: str | None = None) -> list[LogSource]:
    """The other tools' logs named by ``paths`` (``logs.find_logs`` of each), as ``QueryError`` on a problem."""
    sources: list[LogSource] = []
    for path in paths:
        if fmt == "sorl" and path.is_file():
            raise QueryError(f"not a directory: {path} (give a run folder or a log folder of runs)")
        try:
            sources.extend(find_logs(path, fmt))
        except LogFormatError as error:
            raise QueryError(str(error)) from None
    return list(dict.fromkeys(sources))


def _is_int64(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and -(2**63) <= value < 2**63


_INTEGER_TEXT = re.compile(r"^[+-]?[0-9]{1,19}$")
RUN_FIELDS: dict[str, tuple[str, Callable[[Any], bool]]] = {
    "run_id": ("text", lambda value: isinstance(value, str)),
    "algorithm": ("text", lambda value: isinstance(value, str)),
    "seed": ("a 64-bit integer or text", lambda value: _is_int64(value) or isinstance(value, str)),
    "status": ("text", lambda value: isinstance(value, str)),
    "created_at": ("text", lambda value: isinstance(value, str)),
    "finished_at": ("text", lambda value: isinstance(value, str)),
    "schema_version": ("a 64-bit integer", _is_int64),
    "world_size": ("a 64-bit integer", _is_int64),
    "config": ("an object", lambda value: isinstance(value, dict)),
}
"""The ``run.json`` fields the ``runs`` view reads, what each must be, and its check (docs/schema.md)."""


def read_run_info(run_dir: Path, shown: str | None = None) -> dict[str, Any]:
    """``run.json`` of a run (or what can be inferred without it), plus its path.

    A field of another type than ``RUN_FIELDS`` says (``{"seed": 2**64}``, ``{"status": 5}``) is read as
    null, and a file that is not a JSON object as empty, each with a warning naming the file: one bad
    ``run.json`` never stops the other runs from being read. A seed stored as text is read as its integer
    where it fits 64 bits, else as null. ``shown``: the run as warnings name it (its URI, for a local copy).
    """
    path = run_dir / RUN_FILE
    named = f"{shown}/{RUN_FILE}" if shown else str(path)
    info: Any = {}
    try:
        info = json.loads(path.read_text())
    except FileNotFoundError:
        pass
    except (OSError, ValueError, RecursionError) as error:
        warnings.warn(f"unreadable {named}: {first_line(error)}", CorruptPartWarning, stacklevel=2)
    if not isinstance(info, dict):
        warnings.warn(f"{named} is not a JSON object; read as empty", CorruptPartWarning, stacklevel=2)
        info = {}
    for name, (expected, valid) in RUN_FIELDS.items():
        value = info.get(name)
        if value is not None and not valid(value):
            shown = repr(value) if len(repr(value)) <= 60 else repr(value)[:57] + "..."
            warnings.warn(
                f"{named}: {name} is {shown}, not {expected}; read as null", CorruptPartWarning, stacklevel=2
            )
            info[name] = None
    if isinstance(info.get("seed"), str):
        seed = info["seed"].strip()
        info["seed"] = int(seed) if _INTEGER_TEXT.match(seed) and _is_int64(int(seed)) else None
    info["run_id"] = info.get("run_id") or run_dir.name
    info["path"] = str(run_dir)
    return info


@dataclass
class _ForeignLog:
    """One foreign log as last read: its files' sizes and times, and its runs."""

    stamp: tuple[tuple[str, int, int], ...]
    runs: list[ForeignRun]


@dataclass(frozen=True)
class SkippedPart:
    """A part file left out of every view and read because it does not read."""

    path: str
    reason: str
    """The reader's error, first line."""

    @property
    def table(self) -> str:
        """``steps``, ``turns``, ``modules`` or ``alerts`` (``<run>/<table>/rank=R/part-…``)."""
        return Path(self.path).parts[-3]


@dataclass(frozen=True)
class _PartCheck:
    size: int
    mtime_ns: int
    ok: bool
    read_in_full: bool = False


class RunCatalog:
    """The runs and logs under ``paths``, and the readable part files of each of their tables."""

    def __init__(
        self,
        paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
        fmt: str | None = None,
        *,
        storage_options: dict[str, str] | None = None,
        log_options: LogOptions | None = None,
    ) -> None:
        self._remote = [(os.fspath(p), storage_options) for p in _as_list(paths) if is_remote(p)]
        """Object-store roots, read through a local copy that ``relist()`` mirrors again (``storage``)."""
        self.roots = [_mirrored(p, storage_options) if is_remote(p) else Path(p) for p in _as_list(paths)]
        self._uris = {
            str(root): os.fspath(given).rstrip("/")
            for root, given in zip(self.roots, _as_list(paths), strict=True)
            if is_remote(given)
        }
        """Each object-store root's local copy → its URI: what warnings and errors name."""
        self.log_options = log_options
        """What the user told the log readers (``--map``, ``--logging-steps``: ``logs.options``)."""
        try:
            for root in self.roots:
                check_path(root)
            self.format = check_format(fmt)
        except (LogFormatError, ValueError) as error:
            raise QueryError(str(error)) from None
        self.run_dirs = find_runs(self.roots, fmt)
        self._logs: dict[LogSource, _ForeignLog] = {}
        self.foreign: dict[str, ForeignRun] = {}
        """Runs read from other tools' logs, by run id (held in memory)."""
        self._foreign_changed = False
        self._read_foreign_logs(find_foreign_logs(self.roots, fmt))
        try:
            check_names_found(list(self.foreign.values()), log_options)
        except LogFormatError as error:
            raise QueryError(str(error)) from None
        if not self.run_dirs and not self.foreign:
            where = ", ".join(self.shown(str(p)) for p in self.roots)
            raise QueryError(
                f"no runs found in {where} (a run is a folder with run.json or steps/, or a log: "
                "see docs/logs.md)"
            )
        self._checked: dict[str, _PartCheck] = {}
        self._skipped: dict[str, str] = {}
        self._run_paths: dict[str, str] = {}
        self._just_listed = True  # the first relist does not find and detect every log a second time

    def relist(self) -> bool:
        """Mirror object-store roots again, find runs and logs added since, read logs whose files changed.
        True if the foreign runs changed since the last call."""
        if self._just_listed:  # the constructor has just mirrored and found them
            self._just_listed = False
        else:
            for uri, options in self._remote:
                _mirrored(uri, options)
            if any(p.is_dir() and not is_run_dir(p) for p in self.roots):
                self.run_dirs = list(dict.fromkeys(self.run_dirs + find_runs(self.roots, self.format)))
                self._read_foreign_logs(find_foreign_logs(self.roots, self.format))
            else:
                self._read_foreign_logs(list(self._logs))
        changed, self._foreign_changed = self._foreign_changed, False
        return changed

    def allowed_folders(self) -> list[str]:
        """The folders the run set's SQL may read: the opened folders and the run folders."""
        folders = {p.resolve() for p in self.roots if p.is_dir()}
        return sorted({str(p) for p in folders} | {str(p) for p in self.run_dirs})

    def _read_foreign_logs(self, sources: list[LogSource]) -> None:
        """Read the logs among ``sources`` that are new or whose files changed; keep the others as read."""
        for source in sources:
            stamp = fingerprint(source)
            known = self._logs.get(source)
            if known is not None and known.stamp == stamp:
                continue
            try:
                runs = read_source(source, self.log_options)
            except LogFormatError as error:
                if known is None and source.path in self._named_files():
                    raise QueryError(str(error)) from None
                if known is None:  # one bad log among those found in a folder: the others still read
                    warnings.warn(
                        self.shown(f"skipping {source.path}: {error}"), CorruptPartWarning, stacklevel=3
                    )
                    continue
                warnings.warn(
                    self.shown(f"keeping the last read of {source.path}: {error}"),
                    CorruptPartWarning,
                    stacklevel=3,
                )
                continue
            self._logs[source] = _ForeignLog(stamp, runs)
            self._foreign_changed = True
        if self._foreign_changed:
            runs = [run for log in self._logs.values() for run in log.runs]
            unique_ids(runs, taken={path.name for path in self.run_dirs})
            self.foreign = {run.run_id: run for run in runs}

    def _named_files(self) -> set[Path]:
        """The logs given by path (not found in a folder): one of them that does not read is an error."""
        return {root.resolve() for root in self.roots if not root.is_dir()}

    def shown(self, text: str) -> str:
        """``text`` naming object-store runs by their URI, not by their local copy's path."""
        for local, uri in self._uris.items():
            text = text.replace(local, uri)
        return text

    def parts(self, table: str) -> Iterable[str]:
        """Readable parts of ``table``: footer checked once (cached), parts replaced by a compaction left out."""
        for run_dir in self.run_dirs:
            yield from self._table_parts(run_dir / table)

    def _table_parts(self, folder: Path) -> list[str]:
        """The readable parts of one table folder, from a listing taken again (up to ``LIST_ATTEMPTS``) while
        it is stale: a part it names is gone by the time it is checked, or a rank's flush numbers have a hole
        that the next listing does not repeat. A compaction between the directory scan and the check (it
        writes ``part-A-B``, then deletes ``A…B``) would otherwise hide those rows until the next refresh."""
        previous: list[str] | None = None
        readable: list[str] = []
        for _attempt in range(LIST_ATTEMPTS):
            listed = sorted(visible_parts(list_parts(folder)))
            readable, gone = self._readable(listed)
            if not gone and (listed == previous or not has_flush_gaps(listed)):
                break
            previous = listed
        return readable

    def _readable(self, listed: list[str]) -> tuple[list[str], bool]:
        """The parts of ``listed`` whose footers read (checked once per size and mtime), and whether one of
        them was gone when checked."""
        readable, gone = [], False
        for key in listed:
            try:
                stat = os.stat(key)
            except FileNotFoundError:
                gone = True
                continue
            except OSError:
                continue
            cached = self._checked.get(key)
            if cached is None or (cached.size, cached.mtime_ns) != (stat.st_size, stat.st_mtime_ns):
                ok = self._footer_ok(key)
                if ok is None:
                    gone = True
                    continue
                cached = _PartCheck(stat.st_size, stat.st_mtime_ns, ok)
                self._checked[key] = cached
            if cached.ok:
                readable.append(key)
        return readable, gone

    def _footer_ok(self, path: str) -> bool | None:
        """Whether a part's footer reads and its known columns have types the views take (a part with text
        in ``loss`` would make every query of its table that computes on ``loss`` fail, naming no file);
        None if it was compacted away since it was listed."""
        try:
            schema = pq.read_schema(path)
        except FileNotFoundError:
            return None
        except Exception as error:  # noqa: BLE001 - any unreadable file is skipped, loudly
            self.skip(path, error)
            return False
        if conflicts := type_conflicts(Path(path).parts[-3], schema):
            self.skip(path, ValueError("; ".join(conflicts)))
            return False
        self._skipped.pop(path, None)
        return True

    def skip(self, path: str, error: BaseException) -> None:
        """Leave the part ``path`` out from now on, with a warning and an entry in ``skipped_parts``."""
        self._skipped[path] = first_line(error)
        message = self.shown(f"skipping unreadable part {path}: {error}")
        warnings.warn(message, CorruptPartWarning, stacklevel=5)

    def skipped_parts(self, run_id: str | None = None) -> list[SkippedPart]:
        """The part files left out because they do not read (of ``run_id`` only, if given), by path."""
        prefix = None if run_id is None else self._run_paths.get(run_id, "\0") + os.sep
        return [
            SkippedPart(path, reason)
            for path, reason in sorted(self._skipped.items())
            if (prefix is None or path.startswith(prefix)) and os.path.exists(path)
        ]

    def run_path(self, run_id: str) -> str | None:
        """The folder of a Parquet run, as last listed (``run_rows``)."""
        return self._run_paths.get(run_id)

    def mark_unreadable(self, path: str, error: BaseException) -> None:
        """Leave out a listed part whose data (not its footer) failed to read (``skip``)."""
        self.skip(path, error)
        check = self._checked.get(path)
        if check is not None:
            self._checked[path] = dataclasses.replace(check, ok=False)

    def read_parts_in_full(self, files: Iterable[str]) -> bool:
        """Read each of ``files`` not yet read in full; skip (with a warning) those whose data pages are
        corrupt. A part's footer is checked when it is listed; a part whose footer is intact but whose data
        is not makes a query fail without naming it, so after such a failure each part is read once. True if
        a part was newly skipped."""
        found = False
        for key in files:
            check = self._checked[key]
            if check.read_in_full:
                continue
            try:
                pq.read_table(key)
            except Exception as error:  # noqa: BLE001 - any unreadable file is skipped, loudly
                self.mark_unreadable(key, error)
                found = True
                continue
            self._checked[key] = dataclasses.replace(check, read_in_full=True)
        return found

    def run_rows(self) -> pa.Table:
        """The ``runs`` table: one row per run (``RUN_COLUMNS``), Parquet runs from ``run.json`` first."""
        rows = []
        for run_dir in self.run_dirs:
            info = read_run_info(run_dir, self.shown(str(run_dir)) if self._uris else None)
            config = info.get("config", {})
            rows.append(
                {
                    "run_id": info["run_id"],
                    "path": info["path"],
                    "algorithm": info.get("algorithm"),
                    "seed": info.get("seed"),
                    "status": info.get("status") or "unknown",
                    "created_at": info.get("created_at"),
                    "finished_at": info.get("finished_at"),
                    "schema_version": info.get("schema_version"),
                    "world_size": info.get("world_size"),
                    "config": None if config is None else json.dumps(config, sort_keys=True, default=str),
                    "last_write": _last_write(run_dir),
                }
            )
        for run in self.foreign.values():
            rows.append(
                {
                    "run_id": run.run_id,
                    "path": str(run.source),
                    "algorithm": run.info.get("algorithm"),
                    "seed": None,
                    "status": run.info.get("status", "imported"),
                    "world_size": 1,
                    "config": json.dumps(run.info.get("config", {}), sort_keys=True, default=str),
                    "last_write": _source_last_write(run.source),
                }
            )
        self._run_paths = {row["run_id"]: row["path"] for row in rows[: len(self.run_dirs)]}
        return pa.Table.from_pylist(rows, schema=RUN_COLUMNS)

    def verdict_tables(self) -> list[pa.Table]:
        """The verdict tables ``sorl fleet`` wrote in the opened folders, as ``VERDICT_COLUMNS``."""
        tables = [t for t in (read_verdicts(p) for p in self.roots if p.is_dir()) if t is not None]
        return [
            t.select(VERDICT_COLUMNS.names).cast(VERDICT_COLUMNS) for t in tables if _has(t, VERDICT_COLUMNS)
        ]


def _has(table: pa.Table, schema: pa.Schema) -> bool:
    return set(schema.names) <= set(table.column_names)


def _last_write(run_dir: Path) -> float | None:
    """Newest modification time among the run's part files and run.json (seconds since the epoch)."""
    newest = None
    for path in [run_dir / RUN_FILE, *run_dir.glob(f"*/rank=*/{PART_GLOB}")]:
        try:
            mtime = path.stat().st_mtime
        except OSError:
            continue
        newest = mtime if newest is None else max(newest, mtime)
    return newest


def _source_last_write(source: Path) -> float | None:
    """Newest modification time of a foreign log's files (seconds since the epoch)."""
    files = [source] if source.is_file() else [p for p in source.rglob("*") if p.is_file()]
    times = []
    for file in files:
        try:
            times.append(file.stat().st_mtime)
        except OSError:
            continue
    return max(times, default=None)
