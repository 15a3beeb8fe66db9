"""DuckDB query layer: views ``runs, steps, turns, modules, alerts`` over one or many runs (docs/detectors.md, docs/logs.md).

    runs = open_runs("runs/")                   # a log dir, a run dir, or a list of them
    runs = open_runs("trainer_state.json")      # or another tool's log (sorl_monitor.logs), format detected
    runs.sql("SELECT step, clip_frac FROM steps WHERE run_id = 'x' ORDER BY step")  # → pyarrow.Table

Another tool's log (TensorBoard, W&B, MLflow, transformers, JSON lines, CSV, verl) is read into memory
(``sorl_monitor.logs``) and its rows join the Parquet runs' rows in ``steps``; it has a ``runs`` row with
status ``imported`` and no ``turns``, ``modules`` or ``alerts`` rows. ``refresh()`` reads such a log again
when a file of it changed size or modification time.

Part files are listed explicitly (their footers checked once and cached), so a corrupt file is
skipped with a warning naming it (``skipped_parts()`` lists each with the reason), and a file being
written is never read (writers ``os.replace`` finished parts into place). ``refresh()`` picks up parts
and runs written since; ``read_new()`` reads only the parts of a run's table a reader has not read yet
(what the dashboard and ``sorl watch`` do on every refresh). User SQL is
read-only: only ``SELECT``/``EXPLAIN`` statements run, on a connection whose file access is locked
to the opened folders (no ``COPY``, ``ATTACH``, ``INSTALL``, or reads elsewhere). A user's statement
goes through ``user_sql``: a child process (``sql_sandbox``) with one DuckDB thread, no lock held, killed
at its time limit or once past the memory limit, at most ``max_rows`` rows (spills go to a private scratch
folder).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import os
import re
import shutil
import tempfile
import threading
import warnings
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import duckdb
import pyarrow as pa
import pyarrow.ipc as pa_ipc
import pyarrow.parquet as pq

from sorl_monitor import sql_sandbox
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
from sorl_monitor.logs.guards import check_path
from sorl_monitor.logs.table import unique_ids
from sorl_monitor.schema import (
    PART_GLOB,
    RUN_FILE,
    TABLES,
    conform,
    empty_table,
    type_conflicts,
    visible_parts,
)
from sorl_monitor.settings import check_setting
from sorl_monitor.sql_sandbox import (
    QUERY_MISTAKES,
    Request,
    SandboxError,
    SandboxLimit,
    SandboxPool,
    confine,
    memory_bytes,
    run_in_child,
    temp_folder,
)
from sorl_monitor.storage import StorageError, is_remote, mirror_down
from sorl_monitor.verdict_table import VERDICT_COLUMNS, read_verdicts, verdict_table

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


USER_SQL_TIMEOUT_S = 120.0
"""Default time limit of a user's statement (``RunSet.user_sql``)."""


def default_memory_limit() -> str:
    """DuckDB's memory limit for a run set: a quarter of the machine's memory, at most 8 GiB (DuckDB's own
    default, 80 %, leaves a training process on the same machine little)."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return "4GiB"
    return f"{min(total // 4, 8 << 30) >> 20}MiB"


T = TypeVar("T")
READ_ATTEMPTS = 4
"""Tries of a query that fails on a part a live writer compacted away meanwhile."""


def ctrl_c_is_keyboard_interrupt(func: Callable[..., T]) -> Callable[..., T]:
    """Let Ctrl-C during a query reach the caller as ``KeyboardInterrupt``, as it does everywhere else.

    DuckDB catches a SIGINT that arrives while a query runs and reports it as ``RuntimeError("Query
    interrupted")`` (or ``duckdb.InterruptException``), which a command would otherwise print as a crash.
    """

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> T:
        try:
            return func(*args, **kwargs)
        except (duckdb.InterruptException, RuntimeError) as error:
            if isinstance(error, duckdb.InterruptException) or "interrupted" in str(error):
                raise KeyboardInterrupt from None
            raise

    return wrapper


READ_PARTS_SQL = "SELECT * FROM read_parquet($files, union_by_name = true)"
"""Whole rows of the parts ``$files`` (``read_new``'s default reader)."""


class QueryError(Exception):
    """A user-facing problem with a query or the runs it reads (bad path, bad SQL, refused statement)."""


class CorruptPartWarning(UserWarning):
    """A Parquet part could not be read and is skipped."""


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


def read_run_info(run_dir: Path) -> dict[str, Any]:
    """``run.json`` of a run (or what can be inferred without it), plus its path.

    A field of another type than ``RUN_FIELDS`` says (``{"seed": 2**64}``, ``{"status": 5}``) is read as
    null, and a file that is not a JSON object as empty, each with a warning naming the file: one bad
    ``run.json`` never stops the other runs from being read. A seed stored as text is read as its integer
    where it fits 64 bits, else as null.
    """
    path = run_dir / RUN_FILE
    info: Any = {}
    try:
        info = json.loads(path.read_text())
    except FileNotFoundError:
        pass
    except (OSError, ValueError, RecursionError) as error:
        warnings.warn(f"unreadable {path}: {_first_line(error)}", CorruptPartWarning, stacklevel=2)
    if not isinstance(info, dict):
        warnings.warn(f"{path} is not a JSON object; read as empty", CorruptPartWarning, stacklevel=2)
        info = {}
    for name, (expected, valid) in RUN_FIELDS.items():
        value = info.get(name)
        if value is not None and not valid(value):
            shown = repr(value) if len(repr(value)) <= 60 else repr(value)[:57] + "..."
            warnings.warn(
                f"{path}: {name} is {shown}, not {expected}; read as null", CorruptPartWarning, stacklevel=2
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


@dataclass
class PartsRead:
    """The parts of one table of one run that a reader has taken in (``RunSet.read_new`` keeps it)."""

    files: set[str] = dataclasses.field(default_factory=set)


@dataclass(frozen=True)
class NewRows:
    """What ``RunSet.read_new`` read: the rows of parts not read before (``None``: no new part)."""

    rows: pa.Table | None
    reset: bool
    """The writer compacted parts already read: what was read before is void, ``rows`` hold the whole table."""


@dataclass(frozen=True)
class _PartCheck:
    size: int
    mtime_ns: int
    ok: bool
    read_in_full: bool = False


class RunSet:
    """Read-only DuckDB views over the runs found under ``paths`` (see module docstring)."""

    def __init__(
        self,
        paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
        fmt: str | None = None,
        *,
        memory_limit: str | None = None,
        threads: int | None = None,
        storage_options: dict[str, str] | None = None,
        log_options: LogOptions | None = None,
    ) -> None:
        self._remote = [(os.fspath(p), storage_options) for p in _as_list(paths) if is_remote(p)]
        """Object-store roots, read through a local copy that ``refresh()`` mirrors again (``storage``)."""
        self.roots = [_mirrored(p, storage_options) if is_remote(p) else Path(p) for p in _as_list(paths)]
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
        """Runs read from other tools' logs, by run id (held in memory; see module docstring)."""
        self._foreign_changed = False
        self._read_foreign_logs(find_foreign_logs(self.roots, fmt))
        try:
            check_names_found(list(self.foreign.values()), log_options)
        except LogFormatError as error:
            raise QueryError(str(error)) from None
        if not self.run_dirs and not self.foreign:
            where = ", ".join(str(p) for p in self.roots)
            raise QueryError(
                f"no runs found in {where} (a run is a folder with run.json or steps/, or a log: "
                "see docs/logs.md)"
            )
        self._checked: dict[str, _PartCheck] = {}
        self._skipped: dict[str, str] = {}
        self._files: dict[str, tuple[str, ...]] = {}
        self._run_paths: dict[str, str] = {}
        self._lock = threading.RLock()
        self.con = duckdb.connect(config={"threads": threads or max(1, os.cpu_count() or 1)})
        self.memory_limit = memory_limit or default_memory_limit()
        """DuckDB's memory limit (``4GiB``, ``500MB``): queries past it spill to a private scratch folder
        (as large as the limit at most), then fail with a one-line ``QueryError``."""
        self._scratch = tempfile.mkdtemp(prefix="sorl-query-")
        weakref.finalize(self, shutil.rmtree, self._scratch, ignore_errors=True)
        folders = {p.resolve() for p in self.roots if p.is_dir()}
        dirs = {str(p) for p in folders} | {str(p) for p in self.run_dirs}
        # DuckDB checks a part's name as given, so a folder's name as a pattern (``glob_literal``) too
        self._allowed = sorted(dirs | {glob_literal(d) for d in dirs})
        try:
            confine(self.con, memory_limit=self.memory_limit, temp_dir=self._scratch, allowed=self._allowed)
        except duckdb.Error as error:
            self.con.close()
            raise QueryError(f"bad memory limit {self.memory_limit!r}: {_first_line(error)}") from None
        (shown_limit,) = self.con.execute("SELECT current_setting('memory_limit')").fetchone() or ("",)
        self._memory_limit_bytes = memory_bytes(str(shown_limit))
        self._views: dict[str, str] = {}
        """The ``SELECT`` behind each view, as created (a user's statement rebuilds them in its child)."""
        self._tables: dict[str, tuple[pa.Table, int]] = {}
        """Each in-memory table and its serial number (its Arrow file for a child is named by it)."""
        self._serial = 0
        self._statements_running = 0
        self._sandboxes = SandboxPool()
        weakref.finalize(self, self._sandboxes.close)
        self._just_listed = True  # the first refresh does not find and detect every log a second time
        self.refresh()

    # ------------------------------------------------------------------ views
    @ctrl_c_is_keyboard_interrupt
    def refresh(self) -> bool:
        """Re-list runs and part files; rebuild the views whose files changed. True if anything changed."""
        with self._lock:
            for uri, options in self._remote:
                _mirrored(uri, options)
            if self._just_listed:
                self._just_listed = False
            elif any(p.is_dir() and not is_run_dir(p) for p in self.roots):
                self.run_dirs = list(dict.fromkeys(self.run_dirs + find_runs(self.roots, self.format)))
                self._read_foreign_logs(find_foreign_logs(self.roots, self.format))
            else:
                self._read_foreign_logs(list(self._logs))
            # run.json first: a run marked finished then has every part on disk before they are listed
            self._register_runs()
            self._register_verdicts()
            changed, self._foreign_changed = self._foreign_changed, False
            for table in TABLES:
                for _attempt in range(3):
                    files = tuple(self._valid_parts(table))
                    if files == self._files.get(table) and not (table == "steps" and changed):
                        break
                    try:
                        with self._swap():
                            self._create_view(table, files)
                    except duckdb.IOException:  # a part compacted away between listing and binding
                        continue  # after 3 tries the view keeps its previous files until the next refresh
                    self._files[table] = files
                    changed = True
                    break
            return changed

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
                    warnings.warn(f"skipping {source.path}: {error}", CorruptPartWarning, stacklevel=3)
                    continue
                warnings.warn(
                    f"keeping the last read of {source.path}: {error}", CorruptPartWarning, stacklevel=3
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

    def files(self, table: str) -> tuple[str, ...]:
        """The readable part files behind a view."""
        return self._files.get(table, ())

    def _valid_parts(self, table: str) -> Iterable[str]:
        """Readable parts of ``table``: footer checked once (cached), parts replaced by a compaction left out."""
        for run_dir in self.run_dirs:
            listed = [str(p) for p in (run_dir / table).glob(f"rank=*/{PART_GLOB}")]
            for key in sorted(visible_parts(listed)):
                path = Path(key)
                try:
                    stat = path.stat()
                except OSError:
                    continue
                cached = self._checked.get(key)
                if cached is None or (cached.size, cached.mtime_ns) != (stat.st_size, stat.st_mtime_ns):
                    cached = _PartCheck(stat.st_size, stat.st_mtime_ns, self._footer_ok(key))
                    self._checked[key] = cached
                if cached.ok:
                    yield key

    def _footer_ok(self, path: str) -> bool:
        """Whether a part's footer reads and its known columns have types the views take (a part with text
        in ``loss`` would make every query of its table that computes on ``loss`` fail, naming no file)."""
        try:
            schema = pq.read_schema(path)
        except FileNotFoundError:  # compacted away since it was listed
            return False
        except Exception as error:  # noqa: BLE001 - any unreadable file is skipped, loudly
            self._skip(path, error)
            return False
        if conflicts := type_conflicts(Path(path).parts[-3], schema):
            self._skip(path, ValueError("; ".join(conflicts)))
            return False
        self._skipped.pop(path, None)
        return True

    def _skip(self, path: str, error: BaseException) -> None:
        """Leave the part ``path`` out from now on, with a warning and an entry in ``skipped_parts``."""
        self._skipped[path] = _first_line(error)
        warnings.warn(f"skipping unreadable part {path}: {error}", CorruptPartWarning, stacklevel=5)

    def skipped_parts(self, run_id: str | None = None) -> list[SkippedPart]:
        """The part files left out because they do not read (of ``run_id`` only, if given), by path."""
        with self._lock:
            prefix = None if run_id is None else self._run_paths.get(run_id, "\0") + os.sep
            return [
                SkippedPart(path, reason)
                for path, reason in sorted(self._skipped.items())
                if (prefix is None or path.startswith(prefix)) and os.path.exists(path)
            ]

    def run_files(self, run_id: str, table: str) -> list[str]:
        """The readable part files of one table of one Parquet run, as last listed (``refresh``)."""
        with self._lock:
            run_path = self._run_paths.get(run_id)
            if run_path is None:
                return []
            prefix = os.path.join(run_path, table) + os.sep
            return [f for f in self._files.get(table, ()) if f.startswith(prefix)]

    @ctrl_c_is_keyboard_interrupt
    def read_new(self, run_id: str, table: str, seen: PartsRead, sql: str = READ_PARTS_SQL) -> NewRows:
        """Read the parts of ``table`` of ``run_id`` that ``seen`` has not taken in, with ``sql`` (a query
        over ``read_parquet($files, …)``), and add them to ``seen``.

        Finished parts never change, so each is read once. Once the writer has compacted parts already
        read, every part of the table is read again (``reset``). A part that does not read is left out and
        listed in ``skipped_parts``; a part compacted away while it was read makes the listing refresh and
        the read start again. Parts written since the last ``refresh()`` wait for the next one.
        """
        for _attempt in range(READ_ATTEMPTS):
            with self._lock:
                listed = self.run_files(run_id, table)
                cursor = self.con.cursor()
            reset = not seen.files <= set(listed)
            new = [f for f in listed if reset or f not in seen.files]
            try:
                rows = self._read_parts(cursor, sql, new) if new else None
            except duckdb.InterruptException:
                raise
            except duckdb.Error:
                if not all(os.path.exists(f) for f in new):
                    self.refresh()
                    continue
                rows, new = self._read_each(cursor, sql, new)
            finally:
                cursor.close()
            if reset:
                seen.files.clear()
            seen.files.update(new)
            return NewRows(rows, reset)
        raise QueryError(f"the {table} parts of run {run_id!r} kept changing while being read; try again")

    @staticmethod
    def _read_parts(cursor: duckdb.DuckDBPyConnection, sql: str, files: list[str]) -> pa.Table:
        return cursor.sql(sql, params={"files": [glob_literal(f) for f in files]}).to_arrow_table()

    def _read_each(
        self, cursor: duckdb.DuckDBPyConnection, sql: str, files: list[str]
    ) -> tuple[pa.Table | None, list[str]]:
        """Read ``files`` one by one, leaving out (``_skip``) those that do not read; the rows and the files read."""
        tables, read = [], []
        for path in files:
            try:
                tables.append(self._read_parts(cursor, sql, [path]))
                read.append(path)
            except duckdb.InterruptException:
                raise
            except duckdb.Error as error:
                if os.path.exists(path):
                    with self._lock:
                        self._skip(path, error)
                        check = self._checked.get(path)
                        if check is not None:
                            self._checked[path] = dataclasses.replace(check, ok=False)
        if len(read) < len(files):
            self.refresh()
        rows = pa.concat_tables(tables, promote_options="permissive") if tables else None
        return rows, read

    def _create_view(self, table: str, files: tuple[str, ...]) -> None:
        foreign = table == "steps" and bool(self.foreign)
        if foreign:
            self._store_table(FOREIGN_STEPS, foreign_steps(self.foreign.values()))
        if files:
            self._drop(table)
            # every known column, even where no part has it yet (parts written before a column was added)
            known = f"_sorl_known_{table}"
            self._store_table(known, empty_table(table))
            parquet = "SELECT * FROM read_parquet($files, hive_partitioning = true, union_by_name = true)"
            union = f" UNION ALL BY NAME SELECT * FROM {known}"
            union += f" UNION ALL BY NAME SELECT * FROM {FOREIGN_STEPS}" if foreign else ""
            literal = _sql_list(glob_literal(f) for f in files)
            self._create_named_view(table, f"{parquet}{union}".replace("$files", literal))
        elif foreign:
            self._drop(table)
            self._create_named_view(table, f"SELECT * FROM {FOREIGN_STEPS}")
        else:
            self._store_table(table, empty_table(table))

    @contextlib.contextmanager
    def _swap(self) -> Iterator[None]:
        """Replace views and tables in one transaction: a query on another cursor (``user_sql``, which holds
        no lock) sees them before or after, never missing."""
        self.con.begin()
        views, tables = dict(self._views), dict(self._tables)
        try:
            yield
        except BaseException:
            self.con.rollback()
            self._views, self._tables = views, tables
            raise
        self.con.commit()

    def _create_named_view(self, name: str, select: str) -> None:
        self.con.execute(f"CREATE VIEW {name} AS {select}")
        self._views[name] = select

    def _drop(self, name: str) -> None:
        self._views.pop(name, None)
        self._tables.pop(name, None)
        kinds = self.con.execute(
            "SELECT table_type FROM information_schema.tables WHERE table_name = $name", {"name": name}
        ).fetchall()
        for (kind,) in kinds:
            self.con.execute(f"DROP {'VIEW' if kind == 'VIEW' else 'TABLE'} {name}")

    def _store_table(self, name: str, data: pa.Table) -> None:
        """Keep ``data`` as an in-memory table ``name`` (visible to every cursor)."""
        self._drop(name)
        self.con.register("_sorl_incoming", data)
        self.con.execute(f"CREATE TABLE {name} AS SELECT * FROM _sorl_incoming")
        self.con.unregister("_sorl_incoming")
        self._serial += 1
        self._tables[name] = (data, self._serial)

    def _register_runs(self) -> None:
        rows = []
        for run_dir in self.run_dirs:
            info = read_run_info(run_dir)
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
        with self._swap():
            self._store_table("runs", pa.Table.from_pylist(rows, schema=RUN_COLUMNS))

    def _register_verdicts(self) -> None:
        """The ``verdicts`` view: the verdict tables ``sorl fleet`` wrote in the opened folders (else empty)."""
        tables = [t for t in (read_verdicts(p) for p in self.roots if p.is_dir()) if t is not None]
        tables = [
            t.select(VERDICT_COLUMNS.names).cast(VERDICT_COLUMNS) for t in tables if _has(t, VERDICT_COLUMNS)
        ]
        with self._swap():
            self._store_table("verdicts", pa.concat_tables(tables) if tables else verdict_table([]))

    # ------------------------------------------------------------------ queries
    @ctrl_c_is_keyboard_interrupt
    def sql(self, query: str, params: dict[str, Any] | None = None) -> pa.Table:
        """Run read-only SQL over the views and return an Arrow table; ``QueryError`` on any problem.

        For the package's own queries; a user's statement goes through ``user_sql`` (time limit, no lock).
        """
        check_read_only(query)
        with self._lock:
            for attempt in range(READ_ATTEMPTS):
                try:
                    return self._run(query, params)
                except QUERY_MISTAKES as error:
                    raise QueryError(f"bad SQL: {_first_line(error)}") from None
                except duckdb.InterruptException:
                    raise
                except duckdb.Error as error:
                    # a part compacted away since the last refresh (a live writer may compact again while
                    # we retry), or one whose data pages are corrupt: re-list, skip unreadable parts, retry
                    last = attempt == READ_ATTEMPTS - 1
                    if last or not (self.refresh() or self._skip_parts_that_do_not_read()):
                        raise QueryError(f"bad SQL: {_first_line(error)}") from None
            raise AssertionError("unreachable")

    @ctrl_c_is_keyboard_interrupt
    def user_sql(
        self,
        query: str,
        params: dict[str, Any] | None = None,
        *,
        timeout_s: float = USER_SQL_TIMEOUT_S,
        max_rows: int | None = None,
        cancel: threading.Event | None = None,
    ) -> pa.Table:
        """Run a user's read-only statement (``sorl query``, a dashboard's SQL box) and return an Arrow table.

        It runs in a child process (``sql_sandbox``) over the views as last refreshed, with one DuckDB
        thread, without holding the run set's lock (a ``refresh`` never waits for it); the child is killed
        after ``timeout_s`` seconds, within 0.05 s of another thread setting ``cancel``, or once its memory
        passes ``memory_limit`` (plus the interpreter's), and at most ``max_rows`` rows are fetched (ask for
        one more to learn whether there are more). Any problem, a time or memory limit hit or a cancel
        included, is a one-line ``QueryError``.
        """
        check_setting("timeout_s", timeout_s, above=0)
        if max_rows is not None:
            check_setting("max_rows", max_rows, least=0, integer=True)
        for attempt in range(READ_ATTEMPTS):  # the child checks it is read-only (parsing takes time too)
            try:
                return self._run_limited(query, params, timeout_s, max_rows, cancel)
            except SandboxLimit as stop:
                if stop.reason == "time":
                    raise QueryError(f"query stopped at its time limit of {timeout_s:g} s") from None
                if stop.reason == "memory":
                    raise QueryError(f"query stopped at its memory limit of {self.memory_limit}") from None
                raise QueryError("query stopped") from None
            except SandboxError as error:
                if error.kind == "memory":
                    raise QueryError(f"query stopped at its memory limit of {self.memory_limit}") from None
                if error.kind == "refused":
                    raise QueryError(str(error)) from None
                if error.kind != "read":  # bad SQL, a bad value, or a child that died
                    raise QueryError(f"bad SQL: {error}") from None
                with self._lock:  # as in ``sql``: a part compacted away or corrupt
                    retry = attempt < READ_ATTEMPTS - 1 and (
                        self.refresh() or self._skip_parts_that_do_not_read()
                    )
                if not retry:
                    raise QueryError(f"bad SQL: {error}") from None
        raise AssertionError("unreachable")

    def _run_limited(
        self,
        query: str,
        params: dict[str, Any] | None,
        timeout_s: float,
        max_rows: int | None,
        cancel: threading.Event | None,
    ) -> pa.Table:
        with self._lock:
            self._serial += 1
            self._statements_running += 1
            serial = self._serial
            tables, views = dict(self._tables), list(self._views.items())
        table_files = []
        for name, (data, table_serial) in tables.items():
            path = os.path.join(self._scratch, f"table-{table_serial}.arrow")
            if not os.path.exists(path):
                _write_arrow_file(data, path)
            table_files.append((name, path))
        request = Request(
            query=query,
            params=params,
            max_rows=max_rows,
            memory_limit=self.memory_limit,
            temp_dir=temp_folder(self._scratch, serial),
            allowed=self._allowed,
            tables=table_files,
            views=views,
            result_path=os.path.join(self._scratch, f"result-{serial}.arrow"),
        )
        try:
            return run_in_child(
                self._sandboxes.take(),
                request,
                timeout_s=timeout_s,
                memory_limit_bytes=self._memory_limit_bytes,
                cancel=cancel,
            )
        finally:
            shutil.rmtree(request.temp_dir, ignore_errors=True)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(request.result_path)
            self._remove_old_table_files()

    def _remove_old_table_files(self) -> None:
        """Delete the Arrow files of tables replaced since, once no statement may still read them."""
        with self._lock:
            self._statements_running -= 1
            if self._statements_running:
                return
            current = {f"table-{serial}.arrow" for _, serial in self._tables.values()}
            for path in Path(self._scratch).glob("table-*.arrow"):
                if path.name not in current:
                    path.unlink(missing_ok=True)

    def _run(self, query: str, params: dict[str, Any] | None) -> pa.Table:
        relation = self.con.cursor().sql(query, params=params or None)
        return relation.to_arrow_table() if relation is not None else pa.table({})

    def _skip_parts_that_do_not_read(self) -> bool:
        """Read every part not yet read in full; skip (with a warning) those whose data pages are corrupt.

        A part's footer is checked when it is listed; a part whose footer is intact but whose data is not
        makes a query fail without naming it, so after such a failure each part is read once. True if a
        part was newly skipped (the views are then rebuilt).
        """
        found = False
        for files in self._files.values():
            for key in files:
                check = self._checked[key]
                if check.read_in_full:
                    continue
                try:
                    pq.read_table(key)
                except Exception as error:  # noqa: BLE001 - any unreadable file is skipped, loudly
                    self._skip(key, error)
                    self._checked[key] = dataclasses.replace(check, ok=False)
                    found = True
                    continue
                self._checked[key] = dataclasses.replace(check, read_in_full=True)
        if found:
            self.refresh()
        return found

    def table(self, name: str) -> pa.Table:
        """A whole view as an Arrow table."""
        if name not in (*TABLES, "runs"):
            raise QueryError(f"unknown table {name!r}: one of runs, {', '.join(TABLES)}")
        return self.sql(f"SELECT * FROM {name}")

    def columns(self, name: str) -> list[str]:
        """Column names of a view."""
        return [row["column_name"] for row in self.sql(f"DESCRIBE {name}").to_pylist()]

    def close(self) -> None:
        self._sandboxes.close()
        self.con.close()
        shutil.rmtree(self._scratch, ignore_errors=True)

    def __enter__(self) -> RunSet:
        return self

    def __exit__(self, *_: Any) -> None:
        self.close()


def open_runs(
    paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    fmt: str | None = None,
    *,
    memory_limit: str | None = None,
    threads: int | None = None,
    storage_options: dict[str, str] | None = None,
    log_options: LogOptions | None = None,
) -> RunSet:
    """Open runs for querying (see ``RunSet``); ``fmt`` forces a log format (``logs.FORMATS``);
    ``memory_limit`` bounds DuckDB's memory (default ``default_memory_limit()``), ``threads`` its threads
    (default one per core); a path may be an object-store URI (``s3://bucket/prefix``, read through a local
    copy; ``storage_options`` as ``storage.filesystem`` takes them); ``log_options``: what the user told the
    log readers (``logs.options``: ``--map``, ``--logging-steps``)."""
    return RunSet(
        paths,
        fmt,
        memory_limit=memory_limit,
        threads=threads,
        storage_options=storage_options,
        log_options=log_options,
    )


FOREIGN_STEPS = "_sorl_foreign_steps"
"""The in-memory table of foreign runs' ``steps`` rows (the ``steps`` view adds them to the Parquet rows)."""


def foreign_steps(runs: Iterable[ForeignRun]) -> pa.Table:
    """The ``steps`` rows of foreign runs as one table with every known column (``schema.conform``); a
    column that is numbers in one run and text in another is kept as text."""
    tables = [run.steps for run in runs if run.steps.num_rows]
    if not tables:
        return empty_table("steps")
    types: dict[str, set[pa.DataType]] = {}
    for table in tables:
        for field in table.schema:
            types.setdefault(field.name, set()).add(field.type)
    mixed = {
        name for name, kinds in types.items() if len(kinds) > 1 and any(pa.types.is_string(k) for k in kinds)
    }
    tables = [
        t.cast(pa.schema([f.with_type(pa.string()) if f.name in mixed else f for f in t.schema]))
        for t in tables
    ]
    return conform("steps", pa.concat_tables(tables, promote_options="permissive"))


def check_read_only(query: str) -> None:
    """``QueryError`` unless ``query`` is one read-only statement (``SELECT``, or ``EXPLAIN`` of one)."""
    try:
        sql_sandbox.check_read_only(query)
    except sql_sandbox.RefusedStatement as error:
        raise QueryError(str(error)) from None


def _has(table: pa.Table, schema: pa.Schema) -> bool:
    return set(schema.names) <= set(table.column_names)


def glob_literal(path: str) -> str:
    """``path`` as a DuckDB glob pattern that matches only itself: DuckDB reads every file name it is given
    as a pattern and has no escape character, so each of ``*``, ``?`` and ``[`` becomes a one-character
    class (``a[x]`` -> ``a[[]x]``, which does not match a sibling ``ax``)."""
    return "".join(f"[{char}]" if char in "*?[" else char for char in path)


def _sql_list(items: Iterable[str]) -> str:
    return "[" + ", ".join("'" + item.replace("'", "''") + "'" for item in items) + "]"


def _write_arrow_file(data: pa.Table, path: str) -> None:
    """``data`` as an Arrow file at ``path``, written under another name and renamed into place."""
    partial = f"{path}.{threading.get_ident()}.partial"
    with pa_ipc.new_file(partial, data.schema) as writer:
        writer.write_table(data)
    os.replace(partial, path)


def _first_line(error: Exception) -> str:
    return str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__


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


STALE_AFTER_S = 120.0
"""A run still marked ``running`` with no write for this long is shown as ``stale`` (crashed or paused)."""

RUN_OVERVIEW_SQL = """
SELECT r.run_id, r.algorithm, r.seed,
       CASE WHEN r.status = 'running' AND epoch(now()) - r.last_write > $stale_after THEN 'stale'
            ELSE r.status END AS status,
       coalesce(s.updates, 0) AS updates, s.last_step, s.last_reward,
       round(epoch(now()) - r.last_write) AS idle_s, r.path, v.verdict
FROM runs r
LEFT JOIN (SELECT run_id, arg_max(status, updated_at) AS verdict FROM verdicts GROUP BY run_id) v USING (run_id)
LEFT JOIN (
    SELECT run_id, count(*) AS updates, max(step) AS last_step,
           arg_max(reward_mean, step) FILTER (WHERE reward_mean IS NOT NULL) AS last_reward
    FROM steps GROUP BY run_id
) s USING (run_id)
ORDER BY r.created_at NULLS LAST, r.run_id
"""


def run_overview(runs: RunSet, stale_after_s: float = STALE_AFTER_S) -> pa.Table:
    """One row per run: id, algorithm, seed, status (``running``/``finished``/``failed``/``stale``), updates,
    and its ``verdict`` from the fleet's verdict table (``sorl fleet``) where one was written."""
    return runs.sql(RUN_OVERVIEW_SQL, {"stale_after": stale_after_s})


SUMMARY_COLUMNS_PER_QUERY = 64
"""Columns summarised by one statement. The run's rows are read from ``steps`` once, then summarised in
statements of this many columns over those rows: one statement per column over the ``steps`` view, in one
``UNION ALL``, took time that grew faster than the number of columns (200: 6.6 s, 1,000: 74 s)."""
SUMMARY_SQL = "SELECT {aggregates} FROM run_rows"
SUMMARY_AGGREGATES = (
    "count({q}) AS n_{i}, min({q})::DOUBLE AS min_{i}, median({q})::DOUBLE AS median_{i}, "
    "max({q})::DOUBLE AS max_{i}, arg_max({q}, step)::DOUBLE AS last_{i}"
)
SUMMARY_SCHEMA = pa.schema(
    [("metric", pa.string()), ("n", pa.int64())]
    + [(k, pa.float64()) for k in ("min", "median", "max", "last")]
)


def metric_summary(runs: RunSet, run_id: str) -> pa.Table:
    """Per numeric ``steps`` column of one run: count, min, median, max and last value (by step), in time
    linear in the number of columns (``SUMMARY_COLUMNS_PER_QUERY``)."""
    described = runs.sql("DESCRIBE steps").to_pylist()
    numeric = [
        row["column_name"]
        for row in described
        if row["column_type"] in {"DOUBLE", "FLOAT", "BIGINT", "INTEGER", "BOOLEAN"}
        and row["column_name"]
        not in {"rank", "step", "iteration", "ppo_epoch", "minibatch", "policy_lag", "wall_time"}
    ]
    if not numeric:
        return pa.table({"metric": pa.array([], pa.string())})
    quoted = ['"' + name.replace('"', '""') + '"' for name in numeric]
    run_rows = runs.sql(f"SELECT step, {', '.join(quoted)} FROM steps WHERE run_id = $run", {"run": run_id})
    summaries = []
    with duckdb.connect() as summariser:
        for start in range(0, len(numeric), SUMMARY_COLUMNS_PER_QUERY):
            batch = range(start, min(start + SUMMARY_COLUMNS_PER_QUERY, len(numeric)))
            # only the batch's columns: a statement over all of them binds in time linear in their number
            summariser.register("run_rows", run_rows.select(["step", *(numeric[i] for i in batch)]))
            aggregates = ", ".join(SUMMARY_AGGREGATES.format(q=quoted[i], i=i) for i in batch)
            (values,) = summariser.sql(SUMMARY_SQL.format(aggregates=aggregates)).to_arrow_table().to_pylist()
            summaries += [
                {
                    "metric": numeric[i],
                    **{key: values[f"{key}_{i}"] for key in ("n", "min", "median", "max", "last")},
                }
                for i in batch
                if values[f"n_{i}"]
            ]
    return pa.Table.from_pylist(summaries, schema=SUMMARY_SCHEMA)
