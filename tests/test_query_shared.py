"""Run sets opened for one job (a fleet task): views of some tables only, a table copied into memory, and
several run sets one after another in one shared DuckDB database, statements through DuckDB's DB-API. Each
reads what a plain run set reads.

The runs are synthetic: random batches logged through ``Monitor`` (``tests.helpers.runs.write_run``)."""

from __future__ import annotations

import math

import pytest

from sorl_monitor.read.query import QueryError, SharedDatabase, open_runs
from sorl_monitor.schema import TABLES
from tests.helpers.runs import write_run

ROWS_SQL = "SELECT * FROM {table} ORDER BY ALL"


def rows(runs, table: str) -> list[dict]:
    """The table's rows in one order, NaN as the text ``nan`` (so that equal rows compare equal)."""
    return [
        {
            key: "nan" if isinstance(value, float) and math.isnan(value) else value
            for key, value in row.items()
        }
        for row in runs.sql(ROWS_SQL.format(table=table)).to_pylist()
    ]


@pytest.fixture(scope="module")
def synthetic_runs(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("shared")
    return [write_run(root, name, updates=4, seed=seed) for seed, name in enumerate(["a", "b", "c"])]


def test_a_copied_table_and_a_run_set_in_a_shared_database_read_what_a_plain_run_set_reads(
    synthetic_runs, tmp_path
):
    plain = {}
    for run in synthetic_runs:
        with open_runs(run) as runs:
            plain[run.name] = {table: rows(runs, table) for table in (*TABLES, "runs")}
            plain[run.name]["columns"] = {table: runs.columns(table) for table in TABLES}
    folders = [str(run.resolve()) for run in synthetic_runs]
    with SharedDatabase(threads=1, memory_limit="1GiB", scratch=str(tmp_path), folders=folders) as database:
        for run in synthetic_runs:
            with open_runs(
                run, materialize=("steps", "turns"), database=database, interruptible=False
            ) as runs:
                got = {table: rows(runs, table) for table in (*TABLES, "runs")}
                got["columns"] = {table: runs.columns(table) for table in TABLES}
                assert got == plain[run.name]
                assert runs.user_sql("SELECT count(*) AS n FROM steps").column("n")[0].as_py() == 4


def test_a_table_left_out_has_no_view_so_a_query_of_it_fails_rather_than_reads_nothing(synthetic_runs):
    with open_runs(synthetic_runs[0], tables=("steps",)) as runs:
        assert len(rows(runs, "steps")) == 4
        with pytest.raises(QueryError, match="turns"):
            runs.sql("SELECT * FROM turns")
    with pytest.raises(QueryError, match="unknown table 'step'"):
        open_runs(synthetic_runs[0], tables=("step",))


def test_a_run_set_that_did_not_close_leaves_the_next_one_on_the_shared_database_unharmed(
    synthetic_runs, tmp_path
):
    folders = [str(run.resolve()) for run in synthetic_runs]
    with SharedDatabase(threads=1, memory_limit="1GiB", scratch=str(tmp_path), folders=folders) as database:
        left_open = open_runs(synthetic_runs[0], database=database)
        assert not database.clean
        with open_runs(synthetic_runs[1], database=database) as runs:
            assert {row["run_id"] for row in rows(runs, "steps")} == {"b"}
        left_open.close()


def test_a_run_the_shared_database_may_not_read_gets_a_database_of_its_own(synthetic_runs, tmp_path):
    allowed = [str(synthetic_runs[0].resolve())]
    with SharedDatabase(threads=1, memory_limit="1GiB", scratch=str(tmp_path), folders=allowed) as database:
        with open_runs(synthetic_runs[2], database=database) as runs:
            assert {row["run_id"] for row in rows(runs, "steps")} == {"c"}
            assert runs.views.con is not None and database.clean


def test_the_empty_tables_of_known_columns_are_made_once_per_shared_database_not_per_run_set(
    synthetic_runs, tmp_path
):
    folders = [str(run.resolve()) for run in synthetic_runs]
    oids_sql = (
        "SELECT table_name, table_oid FROM duckdb_tables() WHERE table_name LIKE '_sorl_known_%' ORDER BY 1"
    )
    with SharedDatabase(threads=1, memory_limit="1GiB", scratch=str(tmp_path), folders=folders) as database:
        made = database.con.execute(oids_sql).fetchall()
        assert [name for name, _ in made] == sorted(f"_sorl_known_{table}" for table in TABLES)
        for run in synthetic_runs:
            with open_runs(run, database=database, interruptible=False) as runs:
                assert runs.columns("alerts") and runs.columns("modules")
        assert database.con.execute(oids_sql).fetchall() == made
