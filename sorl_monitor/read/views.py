"""The run set's DuckDB views: ``runs, steps, turns, modules, alerts`` (and ``verdicts``) on one connection.

``Views`` owns a DuckDB connection confined to reading the opened folders (``sql.sandbox.confine``: no
writes, no other files, no extensions, a memory limit with spills in a private scratch folder). Each
table's view reads the part files the catalog listed (``read_parquet`` of an explicit list, every known
column included even where no part has it yet); the ``steps`` view adds other tools' runs' rows, held as an
in-memory table. Views and tables are replaced in one transaction (``swap``), so a query on another cursor
sees them before or after a refresh, never missing. The ``SELECT`` behind each view and each in-memory
table are kept (``snapshot``) so that a user's statement can rebuild them in its own process
(``sql.statements``).
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import warnings
from collections.abc import Collection, Iterable, Iterator, Sequence
from typing import Any

import duckdb
import pyarrow as pa

from sorl_monitor.logs import ForeignRun
from sorl_monitor.read.errors import QueryError, first_line
from sorl_monitor.read.sql import sandbox
from sorl_monitor.read.sql.sandbox import confine, memory_bytes
from sorl_monitor.schema import TABLES, conform, empty_table

RESULT_COPY_WARNING = "Arrow output on a DB-API result makes an extra copy"
"""DuckDB 2's warning on ``execute(...).to_arrow_table()`` (``Views.run``): ignored where this module calls
it (a filter added by each ``Views``; adding the same filter again replaces it)."""

READ_PARTS_SQL = "SELECT * FROM read_parquet($files, union_by_name = true)"
"""Whole rows of the parts ``$files`` (``RunSet.read_new``'s default reader)."""


class Views:
    """A confined DuckDB connection and the views and in-memory tables on it (see module docstring)."""

    def __init__(
        self,
        *,
        threads: int,
        memory_limit: str,
        scratch: str,
        folders: Sequence[str],
        materialize: Collection[str] = (),
        database: SharedDatabase | None = None,
        interruptible: bool = True,
    ) -> None:
        self._materialize = frozenset(materialize)
        """Tables read into memory when their parts change, not read from the files by every query: for a
        reader that queries one table many times and never refreshes (``fleet``: the post-mortem reads
        ``steps`` ~10 times)."""
        self._interruptible = interruptible
        """Statements go through DuckDB's relation API, which a Ctrl-C stops at once; else through its
        DB-API, which costs less CPU a statement (the relation API tokenizes each statement in Python;
        docs/results.md) but lets a statement run to its end before the ``KeyboardInterrupt``: for batch work of
        short statements (a fleet task)."""
        if not interruptible:
            warnings.filterwarnings(
                "ignore", message=RESULT_COPY_WARNING, category=UserWarning, module=re.escape(__name__) + "$"
            )
        # DuckDB checks a part's name as given, so a folder's name as a pattern (``glob_literal``) too
        self.allowed = allowed_names(folders)
        """What the connection may read: ``folders``, by name and as patterns."""
        if database is not None and not set(self.allowed) <= set(database.allowed):
            database = None  # it may not read a folder of these runs (a symbolic link out): connect alone
        self._database = database
        if database is None:
            self.con = confined_connection(
                threads=threads, memory_limit=memory_limit, scratch=scratch, allowed=self.allowed
            )
            self.memory_limit = memory_limit
            """DuckDB's memory limit (``4GiB``, ``500MB``): queries past it spill to ``scratch`` (as large as
            the limit at most), then fail."""
        else:
            self.con = database.con.cursor()
            self.memory_limit = database.memory_limit
            if not database.clean:  # a run set before this one did not close: drop what it left
                _drop_everything(self.con)
                database.known.clear()
            database.clean = False
        (shown_limit,) = self.con.execute("SELECT current_setting('memory_limit')").fetchall()[0]
        self.memory_limit_bytes = memory_bytes(str(shown_limit))
        self._views: dict[str, str] = {}
        """The ``SELECT`` behind each view, as created (a user's statement rebuilds them in its child)."""
        self._tables: dict[str, tuple[pa.Table, int]] = {}
        """Each in-memory table and its serial number (its Arrow file for a child is named by it)."""
        self._serial = 0
        self._files: dict[str, tuple[str, ...]] = {}
        self._borrowed: set[str] = set()
        """In-memory tables of the shared database (``SharedDatabase.known_table``) that views here read: kept
        in ``_tables`` for ``snapshot``, never dropped by this object."""

    def files(self, table: str) -> tuple[str, ...]:
        """The part files behind a view, as last shown."""
        return self._files.get(table, ())

    def shows(self, table: str, files: tuple[str, ...]) -> bool:
        """Whether the view ``table`` exists and reads exactly ``files``."""
        return self._files.get(table) == files

    def all_files(self) -> Iterator[str]:
        """Every part file behind every view."""
        for files in self._files.values():
            yield from files

    def show_parts(self, table: str, files: tuple[str, ...], foreign: Sequence[ForeignRun] = ()) -> None:
        """Point the view ``table`` at ``files`` (and, for ``steps``, the rows of ``foreign`` runs), in one
        transaction; ``duckdb.IOException`` (a part gone since it was listed) leaves the view as it was."""
        with self._swap():
            self._create_view(table, files, foreign)
        self._files[table] = files

    def store(self, name: str, data: pa.Table) -> None:
        """Replace the in-memory table ``name`` by ``data``, in one transaction."""
        with self._swap():
            self._store_table(name, data)

    def snapshot(self) -> tuple[dict[str, tuple[pa.Table, int]], list[tuple[str, str]]]:
        """The in-memory tables (with their serial numbers) and the views' ``SELECT``s, as now."""
        return dict(self._tables), list(self._views.items())

    def run(self, query: str, params: dict[str, Any] | None) -> pa.Table:
        """``query`` on a new cursor, as an Arrow table (no check: ``check_read_only`` first): through
        DuckDB's relation API (``sql``), or where the views are not ``interruptible`` its DB-API
        (``execute``)."""
        if self._interruptible:
            relation = self.con.cursor().sql(query, params=params or None)
            return relation.to_arrow_table() if relation is not None else pa.table({})
        cursor = self.con.cursor()
        try:
            result = cursor.execute(query, params or None)
            if hasattr(result, "to_arrow_table"):
                return result.to_arrow_table()
            return result.fetch_arrow_table()  # DuckDB before 2.0
        finally:
            cursor.close()

    def create_table(self, name: str, query: str, params: dict[str, Any] | None) -> None:
        """An in-memory table ``name`` of ``query``'s rows (no check: ``check_read_only`` first), on a new cursor
        as ``run``; not one of the views' tables (``drop_table`` drops it; a user's statement does not see it)."""
        statement = f"CREATE TABLE {name} AS {query}"
        cursor = self.con.cursor()
        try:
            if self._interruptible:
                cursor.sql(statement, params=params or None)
            else:
                cursor.execute(statement, params or None)
        finally:
            cursor.close()

    def drop_table(self, name: str) -> None:
        """Drop what ``create_table`` made."""
        self.con.execute(f"DROP TABLE IF EXISTS {name}")

    @staticmethod
    def read_parts(cursor: duckdb.DuckDBPyConnection, sql: str, files: list[str]) -> pa.Table:
        """``sql`` (a query over ``read_parquet($files, …)``) over ``files``."""
        return cursor.sql(sql, params={"files": [glob_literal(f) for f in files]}).to_arrow_table()

    def _create_view(self, table: str, files: tuple[str, ...], foreign_runs: Sequence[ForeignRun]) -> None:
        foreign = table == "steps" and bool(foreign_runs)
        if foreign:
            self._store_table(FOREIGN_STEPS, foreign_steps(foreign_runs))
        known = self._known_table(table)
        if files:
            self._drop(table)
            # every known column, even where no part has it yet (parts written before a column was added)
            parquet = "SELECT * FROM read_parquet($files, hive_partitioning = true, union_by_name = true)"
            union = f" UNION ALL BY NAME SELECT * FROM {known}"
            union += f" UNION ALL BY NAME SELECT * FROM {FOREIGN_STEPS}" if foreign else ""
            literal = _sql_list(glob_literal(f) for f in files)
            self._create_named_view(table, f"{parquet}{union}".replace("$files", literal))
        elif foreign:
            self._drop(table)
            self._create_named_view(table, f"SELECT * FROM {FOREIGN_STEPS}")
        else:  # no rows: the known columns
            self._drop(table)
            self._create_named_view(table, f"SELECT * FROM {known}")

    def _known_table(self, table: str) -> str:
        """The name of an in-memory table with ``table``'s known columns and no rows, created once for the
        connection's life, or for a shared database's (``SharedDatabase.known_table``: a fleet task's run
        sets do not each create it again)."""
        known = f"_sorl_known_{table}"
        if known in self._tables:
            return known
        if self._database is not None and (data := self._database.known.get(known)) is not None:
            self._serial += 1
            self._tables[known] = (data, self._serial)
            self._borrowed.add(known)
        else:
            self._store_table(known, empty_table(table))
        return known

    @contextlib.contextmanager
    def _swap(self) -> Iterator[None]:
        """Replace views and tables in one transaction: a query on another cursor (``RunSet.read_new``, which
        holds no lock) sees them before or after, never missing."""
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
        """The view ``name``, or for a table of ``materialize`` an in-memory copy of its rows (a user's
        statement rebuilds either as the view: the same rows)."""
        kind = "TABLE" if name in self._materialize else "VIEW"
        self.con.execute(f"CREATE {kind} {name} AS {select}")
        self._views[name] = select

    def _drop(self, name: str) -> None:
        """Drop the view or table ``name`` if this object created it (only ``_create_named_view`` and
        ``_store_table`` create any, and ``_swap`` keeps their records in step with the connection)."""
        if self._views.pop(name, None) is not None:
            self.con.execute(f"DROP {'TABLE' if name in self._materialize else 'VIEW'} {name}")
        if self._tables.pop(name, None) is not None and name not in self._borrowed:
            self.con.execute(f"DROP TABLE {name}")

    def _store_table(self, name: str, data: pa.Table) -> None:
        """Keep ``data`` as an in-memory table ``name`` (visible to every cursor)."""
        self._drop(name)
        self.con.register("_sorl_incoming", data)
        self.con.execute(f"CREATE TABLE {name} AS SELECT * FROM _sorl_incoming")
        self.con.unregister("_sorl_incoming")
        self._serial += 1
        self._tables[name] = (data, self._serial)

    def close(self) -> None:
        """Close the connection; on a shared database, drop this object's views and tables first."""
        if self._database is not None:
            with contextlib.suppress(duckdb.Error):
                for name in [*self._views, *(t for t in self._tables if t not in self._borrowed)]:
                    self._drop(name)
                self._database.clean = True
        self.con.close()


class SharedDatabase:
    """One confined DuckDB database that run sets use one after another (``open_runs(database=…)``), each
    on its own cursor: a fleet task judging a chunk of runs connects and confines once, not once per run. It may read ``folders`` (every folder of every run set that will use it);
    ``threads`` and ``memory_limit`` are the run sets'. A run set drops its views and tables when it closes,
    and one that opens drops whatever is left. The empty tables of each table's known columns are made once
    here and shared by the run sets (``known``)."""

    def __init__(self, *, threads: int, memory_limit: str, scratch: str, folders: Sequence[str]) -> None:
        self.allowed = allowed_names(folders)
        self.memory_limit = memory_limit
        self.clean = True
        """No run set's views or tables are left in it."""
        self.con = confined_connection(
            threads=threads, memory_limit=memory_limit, scratch=scratch, allowed=self.allowed
        )
        self.known: dict[str, pa.Table] = {}
        """``_sorl_known_<table>`` → its rows (none), for each table of the schema: in-memory tables that run
        sets read and never drop (emptied if a run set left the database unclean; ``Views`` makes its own)."""
        for table in TABLES:
            name, data = f"_sorl_known_{table}", empty_table(table)
            self.con.register("_sorl_incoming", data)
            self.con.execute(f"CREATE TABLE {name} AS SELECT * FROM _sorl_incoming")
            self.con.unregister("_sorl_incoming")
            self.known[name] = data

    def close(self) -> None:
        self.con.close()

    def __enter__(self) -> SharedDatabase:
        return self

    def __exit__(self, *_: Any) -> None:
        self.close()


def allowed_names(folders: Iterable[str]) -> list[str]:
    """``folders`` by name and as DuckDB patterns (``glob_literal``): DuckDB checks a part's name as given."""
    folders = list(folders)
    return sorted({*folders} | {glob_literal(d) for d in folders})


def confined_connection(
    *, threads: int, memory_limit: str, scratch: str, allowed: list[str]
) -> duckdb.DuckDBPyConnection:
    """A new in-memory DuckDB database locked to reading ``allowed`` (``sql.sandbox.confine``)."""
    con = duckdb.connect(config={"threads": threads})
    try:
        confine(con, memory_limit=memory_limit, temp_dir=scratch, allowed=allowed)
    except duckdb.Error as error:
        con.close()
        raise QueryError(f"bad memory limit {memory_limit!r}: {first_line(error)}") from None
    return con


def _drop_everything(con: duckdb.DuckDBPyConnection) -> None:
    """Drop every view and table of the database's ``main`` schema."""
    found = con.execute(
        "SELECT table_name, table_type FROM information_schema.tables WHERE table_schema = 'main'"
    ).fetchall()
    for name, kind in sorted(found, key=lambda row: row[1] != "VIEW"):  # views first
        con.execute(f'DROP {"VIEW" if kind == "VIEW" else "TABLE"} IF EXISTS "{name}"')


def default_memory_limit() -> str:
    """DuckDB's memory limit for a run set: a quarter of the machine's memory, at most 8 GiB (DuckDB's own
    default, 80 %, leaves a training process on the same machine little)."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return "4GiB"
    return f"{min(total // 4, 8 << 30) >> 20}MiB"


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
    if (refusal := _refusal(query)) is not None:
        raise QueryError(refusal)


@functools.lru_cache(maxsize=1024)
def _refusal(query: str) -> str | None:
    """Why ``query`` is refused (``sql.sandbox.check_read_only``), or ``None``: kept per text, since the
    package's own statements repeat (parsing one took ~10 % of a fleet's post-mortem)."""
    try:
        sandbox.check_read_only(query)
    except sandbox.RefusedStatement as error:
        return str(error)
    return None


def glob_literal(path: str) -> str:
    """``path`` as a DuckDB glob pattern that matches only itself: DuckDB reads every file name it is given
    as a pattern and has no escape character, so each of ``*``, ``?`` and ``[`` becomes a one-character
    class (``a[x]`` -> ``a[[]x]``, which does not match a sibling ``ax``)."""
    return "".join(f"[{char}]" if char in "*?[" else char for char in path)


def _sql_list(items: Iterable[str]) -> str:
    return "[" + ", ".join("'" + item.replace("'", "''") + "'" for item in items) + "]"
