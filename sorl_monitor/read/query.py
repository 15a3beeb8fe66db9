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
goes through ``sql.statements``: a child process (``sql.sandbox``) with one DuckDB thread, no lock held, killed
at its time limit or once past the memory limit, at most ``max_rows`` rows (spills go to a private scratch
folder).
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import tempfile
import threading
import weakref
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import duckdb
import pyarrow as pa

from sorl_monitor.logs import ForeignRun, LogOptions
from sorl_monitor.read.catalog import (
    RUN_COLUMNS,
    RUN_FIELDS,
    RunCatalog,
    SkippedPart,
    find_foreign_logs,
    find_runs,
    read_run_info,
)
from sorl_monitor.read.errors import CorruptPartWarning, QueryError, first_line
from sorl_monitor.read.sql.sandbox import QUERY_MISTAKES, SandboxError
from sorl_monitor.read.sql.statements import USER_SQL_TIMEOUT_S, UserStatements
from sorl_monitor.read.verdict_table import verdict_table
from sorl_monitor.read.views import (
    FOREIGN_STEPS,
    READ_PARTS_SQL,
    SharedDatabase,
    Views,
    check_read_only,
    default_memory_limit,
    foreign_steps,
    glob_literal,
)
from sorl_monitor.schema import TABLES
from sorl_monitor.settings import check_setting

__all__ = [
    "FOREIGN_STEPS",
    "READ_PARTS_SQL",
    "RUN_COLUMNS",
    "RUN_FIELDS",
    "USER_SQL_TIMEOUT_S",
    "CorruptPartWarning",
    "NewRows",
    "PartsRead",
    "QueryError",
    "RunSet",
    "SharedDatabase",
    "SkippedPart",
    "check_read_only",
    "default_memory_limit",
    "find_foreign_logs",
    "find_runs",
    "foreign_steps",
    "glob_literal",
    "open_runs",
    "read_run_info",
]

T = TypeVar("T")
READ_ATTEMPTS = 4
"""Tries of a query that fails on a part a live writer compacted away meanwhile."""
_SCRATCH_IN_USE: set[int] = set()
"""The numbers of the scratch tables open in this process (run sets may share a database): a new one takes the
lowest free number, so one post-mortem after another sends the same statements (``views._refusal`` keeps each
checked text)."""
_SCRATCH_LOCK = threading.Lock()


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


@dataclass
class PartsRead:
    """The parts of one table of one run that a reader has taken in (``RunSet.read_new`` keeps it)."""

    files: set[str] = field(default_factory=set)


@dataclass(frozen=True)
class NewRows:
    """What ``RunSet.read_new`` read: the rows of parts not read before (``None``: no new part)."""

    rows: pa.Table | None
    reset: bool
    """The writer compacted parts already read: what was read before is void, ``rows`` hold the whole table."""


class RunSet:
    """Read-only DuckDB views over the runs found under ``paths`` (see module docstring): a facade over the
    run catalog (``catalog.RunCatalog``), the views (``views.Views``) and the users' statements
    (``sql.statements.UserStatements``), which it keeps in step under one lock."""

    def __init__(
        self,
        paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
        fmt: str | None = None,
        *,
        memory_limit: str | None = None,
        threads: int | None = None,
        storage_options: dict[str, str] | None = None,
        log_options: LogOptions | None = None,
        tables: Sequence[str] = TABLES,
        materialize: Collection[str] = (),
        database: SharedDatabase | None = None,
        interruptible: bool = True,
    ) -> None:
        if unknown := [t for t in (*tables, *materialize) if t not in TABLES]:
            raise QueryError(f"unknown table {unknown[0]!r}: one of {', '.join(TABLES)}")
        self._shown = tuple(tables)
        """The tables with a view (``runs`` and ``verdicts`` always have one)."""
        self.catalog = RunCatalog(paths, fmt, storage_options=storage_options, log_options=log_options)
        self._lock = threading.RLock()
        self._scratch = tempfile.mkdtemp(prefix="sorl-query-")
        weakref.finalize(self, shutil.rmtree, self._scratch, ignore_errors=True)
        try:
            self.views = Views(
                threads=threads or max(1, os.cpu_count() or 1),
                memory_limit=memory_limit or default_memory_limit(),
                scratch=self._scratch,
                folders=self.catalog.allowed_folders(),
                materialize=materialize,
                database=database,
                interruptible=interruptible,
            )
        except QueryError:
            shutil.rmtree(self._scratch, ignore_errors=True)
            raise
        self._statements = UserStatements(self.views, self._lock, self._scratch)
        try:
            self.refresh()
        except BaseException:
            self.close()
            raise

    @property
    def roots(self) -> list[Path]:
        """The opened folders and files (an object-store root as its local copy)."""
        return self.catalog.roots

    @property
    def run_dirs(self) -> list[Path]:
        """The Parquet run folders, as last listed."""
        return self.catalog.run_dirs

    @property
    def foreign(self) -> dict[str, ForeignRun]:
        """Runs read from other tools' logs, by run id (held in memory; see module docstring)."""
        return self.catalog.foreign

    @property
    def format(self) -> str | None:
        return self.catalog.format

    @property
    def log_options(self) -> LogOptions | None:
        return self.catalog.log_options

    @property
    def con(self) -> duckdb.DuckDBPyConnection:
        return self.views.con

    @property
    def memory_limit(self) -> str:
        """DuckDB's memory limit (``4GiB``, ``500MB``): queries past it spill to a private scratch folder
        (as large as the limit at most), then fail with a one-line ``QueryError``."""
        return self.views.memory_limit

    # ------------------------------------------------------------------ catalog → views
    @ctrl_c_is_keyboard_interrupt
    def refresh(self) -> bool:
        """Re-list runs and part files; rebuild the views whose files changed. True if anything changed."""
        with self._lock:
            changed = self.catalog.relist()
            # run.json first: a run marked finished then has every part on disk before they are listed
            self.views.store("runs", self.catalog.run_rows())
            tables = self.catalog.verdict_tables()
            self.views.store("verdicts", pa.concat_tables(tables) if tables else verdict_table([]))
            foreign = list(self.catalog.foreign.values())
            for table in self._shown:
                for _attempt in range(3):
                    files = tuple(self.catalog.parts(table))
                    if self.views.shows(table, files) and not (table == "steps" and changed):
                        break
                    try:
                        self.views.show_parts(table, files, foreign if table == "steps" else ())
                    except duckdb.IOException:  # a part compacted away between listing and binding
                        continue  # after 3 tries the view keeps its previous files until the next refresh
                    changed = True
                    break
            return changed

    def files(self, table: str) -> tuple[str, ...]:
        """The readable part files behind a view."""
        return self.views.files(table)

    def skipped_parts(self, run_id: str | None = None) -> list[SkippedPart]:
        """The part files left out because they do not read (of ``run_id`` only, if given), by path."""
        with self._lock:
            return self.catalog.skipped_parts(run_id)

    def run_files(self, run_id: str, table: str) -> list[str]:
        """The readable part files of one table of one Parquet run, as last listed (``refresh``)."""
        with self._lock:
            run_path = self.catalog.run_path(run_id)
            if run_path is None:
                return []
            prefix = os.path.join(run_path, table) + os.sep
            return [f for f in self.views.files(table) if f.startswith(prefix)]

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
                cursor = self.views.con.cursor()
            reset = not seen.files <= set(listed)
            new = [f for f in listed if reset or f not in seen.files]
            try:
                rows = self.views.read_parts(cursor, sql, new) if new else None
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

    def _read_each(
        self, cursor: duckdb.DuckDBPyConnection, sql: str, files: list[str]
    ) -> tuple[pa.Table | None, list[str]]:
        """Read ``files`` one by one, leaving out (``RunCatalog.mark_unreadable``) those that do not read; the rows
        and the files read."""
        tables, read = [], []
        for path in files:
            try:
                tables.append(self.views.read_parts(cursor, sql, [path]))
                read.append(path)
            except duckdb.InterruptException:
                raise
            except duckdb.Error as error:
                if os.path.exists(path):
                    with self._lock:
                        self.catalog.mark_unreadable(path, error)
        if len(read) < len(files):
            self.refresh()
        rows = pa.concat_tables(tables, promote_options="permissive") if tables else None
        return rows, read

    # ------------------------------------------------------------------ queries
    @ctrl_c_is_keyboard_interrupt
    def sql(self, query: str, params: dict[str, Any] | None = None) -> pa.Table:
        """Run read-only SQL over the views and return an Arrow table; ``QueryError`` on any problem.

        For the package's own queries; a user's statement goes through ``user_sql`` (time limit, no lock).
        """
        check_read_only(query)
        return self._retried(lambda: self.views.run(query, params))

    @contextlib.contextmanager
    def scratch_table(self, query: str, params: dict[str, Any] | None = None) -> Iterator[str]:
        """``query``'s rows (read-only SQL over the views) as an in-memory table, for the package's own queries
        that read one intermediate result several times (the post-mortem's blocks): yields its name, drops it
        on exit. The views' files are those of this moment: a ``refresh`` meanwhile does not change it."""
        check_read_only(query)
        with _SCRATCH_LOCK:
            number = min(set(range(len(_SCRATCH_IN_USE) + 1)) - _SCRATCH_IN_USE)
            _SCRATCH_IN_USE.add(number)
        name = f"_sorl_scratch_{number}"
        try:
            self._retried(lambda: self.views.create_table(name, query, params))
            yield name
        finally:
            with self._lock, contextlib.suppress(duckdb.Error):  # (closed meanwhile: nothing left to drop)
                self.views.drop_table(name)
            with _SCRATCH_LOCK:
                _SCRATCH_IN_USE.discard(number)

    @ctrl_c_is_keyboard_interrupt
    def _retried(self, statement: Callable[[], T]) -> T:
        """``statement()`` under the lock, as ``sql`` runs a query: a part compacted away or corrupt is retried
        after a refresh; any other problem is a one-line ``QueryError``."""
        with self._lock:
            for attempt in range(READ_ATTEMPTS):
                try:
                    return statement()
                except QUERY_MISTAKES as error:
                    raise QueryError(f"bad SQL: {first_line(error)}") from None
                except duckdb.InterruptException:
                    raise
                except duckdb.Error as error:
                    # a part compacted away since the last refresh (a live writer may compact again while
                    # we retry), or one whose data pages are corrupt: re-list, skip unreadable parts, retry
                    last = attempt == READ_ATTEMPTS - 1
                    if last or not (self.refresh() or self._skip_parts_that_do_not_read()):
                        raise QueryError(f"bad SQL: {first_line(error)}") from None
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

        It runs in a child process (``sql.sandbox``) over the views as last refreshed, with one DuckDB
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
                return self._statements.run(
                    query, params, timeout_s=timeout_s, max_rows=max_rows, cancel=cancel
                )
            except SandboxError as error:  # a part compacted away or corrupt, as in ``sql``
                with self._lock:
                    retry = attempt < READ_ATTEMPTS - 1 and (
                        self.refresh() or self._skip_parts_that_do_not_read()
                    )
                if not retry:
                    raise QueryError(f"bad SQL: {error}") from None
        raise AssertionError("unreachable")

    def _skip_parts_that_do_not_read(self) -> bool:
        """Read every part behind the views not yet read in full, skipping those that do not read
        (``RunCatalog.read_parts_in_full``); True if one was newly skipped (the views are then rebuilt)."""
        found = self.catalog.read_parts_in_full(list(self.views.all_files()))
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
        self._statements.close()
        self.views.close()
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
    tables: Sequence[str] = TABLES,
    materialize: Collection[str] = (),
    database: SharedDatabase | None = None,
    interruptible: bool = True,
) -> RunSet:
    """Open runs for querying (see ``RunSet``); ``fmt`` forces a log format (``logs.FORMATS``);
    ``memory_limit`` bounds DuckDB's memory (default ``default_memory_limit()``), ``threads`` its threads
    (default one per core); a path may be an object-store URI (``s3://bucket/prefix``, read through a local
    copy; ``storage_options`` as ``storage.filesystem`` takes them); ``log_options``: what the user told the
    log readers (``logs.options``: ``--map``, ``--logging-steps``); ``tables``: the tables to make views
    of (default all; one left out has none, so a query of it fails rather than reads nothing);
    ``materialize``: tables read into memory when their parts change rather than by every query (for a
    reader that queries a table many times between refreshes, as a fleet's post-mortem does); ``database``:
    a ``SharedDatabase`` to work in instead of a new one (its memory limit and threads then apply);
    ``interruptible=False``: statements cost less CPU, but a Ctrl-C waits for the one running to end
    (for batch work of short statements; ``views.Views``)."""
    return RunSet(
        paths,
        fmt,
        memory_limit=memory_limit,
        threads=threads,
        storage_options=storage_options,
        log_options=log_options,
        tables=tables,
        materialize=materialize,
        database=database,
        interruptible=interruptible,
    )
