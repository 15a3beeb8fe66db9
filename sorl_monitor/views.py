"""The run set's DuckDB views: ``runs, steps, turns, modules, alerts`` (and ``verdicts``) on one connection.

``Views`` owns a DuckDB connection confined to reading the opened folders (``sql_sandbox.confine``: no
writes, no other files, no extensions, a memory limit with spills in a private scratch folder). Each
table's view reads the part files the catalog listed (``read_parquet`` of an explicit list, every known
column included even where no part has it yet); the ``steps`` view adds other tools' runs' rows, held as an
in-memory table. Views and tables are replaced in one transaction (``swap``), so a query on another cursor
sees them before or after a refresh, never missing. The ``SELECT`` behind each view and each in-memory
table are kept (``snapshot``) so that a user's statement can rebuild them in its own process
(``user_sql``).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import duckdb
import pyarrow as pa

from sorl_monitor import sql_sandbox
from sorl_monitor.logs import ForeignRun
from sorl_monitor.query_errors import QueryError, first_line
from sorl_monitor.schema import conform, empty_table
from sorl_monitor.sql_sandbox import confine, memory_bytes

READ_PARTS_SQL = "SELECT * FROM read_parquet($files, union_by_name = true)"
"""Whole rows of the parts ``$files`` (``RunSet.read_new``'s default reader)."""


class Views:
    """A confined DuckDB connection and the views and in-memory tables on it (see module docstring)."""

    def __init__(self, *, threads: int, memory_limit: str, scratch: str, folders: Sequence[str]) -> None:
        self.con = duckdb.connect(config={"threads": threads})
        # DuckDB checks a part's name as given, so a folder's name as a pattern (``glob_literal``) too
        self.allowed = sorted({*folders} | {glob_literal(d) for d in folders})
        """What the connection may read: ``folders``, by name and as patterns."""
        self.memory_limit = memory_limit
        """DuckDB's memory limit (``4GiB``, ``500MB``): queries past it spill to ``scratch`` (as large as the
        limit at most), then fail."""
        try:
            confine(self.con, memory_limit=memory_limit, temp_dir=scratch, allowed=self.allowed)
        except duckdb.Error as error:
            self.con.close()
            raise QueryError(f"bad memory limit {memory_limit!r}: {first_line(error)}") from None
        (shown_limit,) = self.con.execute("SELECT current_setting('memory_limit')").fetchone() or ("",)
        self.memory_limit_bytes = memory_bytes(str(shown_limit))
        self._views: dict[str, str] = {}
        """The ``SELECT`` behind each view, as created (a user's statement rebuilds them in its child)."""
        self._tables: dict[str, tuple[pa.Table, int]] = {}
        """Each in-memory table and its serial number (its Arrow file for a child is named by it)."""
        self._serial = 0
        self._files: dict[str, tuple[str, ...]] = {}

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
        """``query`` on a new cursor, as an Arrow table (no check: ``check_read_only`` first)."""
        relation = self.con.cursor().sql(query, params=params or None)
        return relation.to_arrow_table() if relation is not None else pa.table({})

    @staticmethod
    def read_parts(cursor: duckdb.DuckDBPyConnection, sql: str, files: list[str]) -> pa.Table:
        """``sql`` (a query over ``read_parquet($files, …)``) over ``files``."""
        return cursor.sql(sql, params={"files": [glob_literal(f) for f in files]}).to_arrow_table()

    def _create_view(self, table: str, files: tuple[str, ...], foreign_runs: Sequence[ForeignRun]) -> None:
        foreign = table == "steps" and bool(foreign_runs)
        if foreign:
            self._store_table(FOREIGN_STEPS, foreign_steps(foreign_runs))
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

    def close(self) -> None:
        self.con.close()


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
    try:
        sql_sandbox.check_read_only(query)
    except sql_sandbox.RefusedStatement as error:
        raise QueryError(str(error)) from None


def glob_literal(path: str) -> str:
    """``path`` as a DuckDB glob pattern that matches only itself: DuckDB reads every file name it is given
    as a pattern and has no escape character, so each of ``*``, ``?`` and ``[`` becomes a one-character
    class (``a[x]`` -> ``a[[]x]``, which does not match a sibling ``ax``)."""
    return "".join(f"[{char}]" if char in "*?[" else char for char in path)


def _sql_list(items: Iterable[str]) -> str:
    return "[" + ", ".join("'" + item.replace("'", "''") + "'" for item in items) + "]"
