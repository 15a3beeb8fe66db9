"""``BackgroundQuery``: a user's statement in the background, stopped by its time limit or on cancel."""

from __future__ import annotations

import os
import sys
import threading
import time
from unittest import mock

import pytest

from sorl_monitor.background_query import NICE, BackgroundQuery
from sorl_monitor.query import QueryError, RunSet, open_runs
from tests.conftest import write_run

RUNAWAY = (
    "SELECT sum(a.step * b.step * c.step * d.step * e.step) FROM turns a, turns b, turns c, turns d, turns e"
)


def test_the_rows_of_a_statement_come_back_at_most_max_rows(tmp_path):
    write_run(tmp_path, "run", updates=6)
    with open_runs(tmp_path) as runs:
        query = BackgroundQuery(runs, "SELECT step FROM steps ORDER BY step", timeout_s=30, max_rows=4)
        assert query.result().column("step").to_pylist() == [0, 1, 2, 3]
        assert query.done()


def test_a_runaway_statement_stops_at_its_time_limit(tmp_path):
    write_run(tmp_path, "run", updates=6)
    with open_runs(tmp_path) as runs:
        query = BackgroundQuery(runs, RUNAWAY, timeout_s=0.5, max_rows=10)
        with pytest.raises(QueryError, match="time limit of 0.5 s"):
            query.result()
        assert query.elapsed_s < 10


def test_cancel_stops_a_runaway_statement_at_once_and_other_queries_never_wait_for_it(tmp_path):
    write_run(tmp_path, "run", updates=6)
    with open_runs(tmp_path) as runs:
        query = BackgroundQuery(runs, RUNAWAY, timeout_s=120, max_rows=10)
        started = time.monotonic()
        assert runs.sql("SELECT count(*) AS n FROM steps").column("n")[0].as_py() == 6
        assert not query.done(wait_s=0.3)
        query.cancel()
        assert query.done(wait_s=5)
        with pytest.raises(QueryError, match="query stopped"):
            query.result()
    assert time.monotonic() - started < 10


def test_user_sql_threads_give_users_a_database_of_their_own_that_follows_refresh(tmp_path):
    """DuckDB's thread count is per database: with ``user_sql_threads`` a user's statement runs on a second
    one of that many threads, whose views and tables change with the run set's (new runs and parts)."""
    write_run(tmp_path, "a", updates=2)
    threads = "SELECT current_setting('threads') AS n"
    with open_runs(tmp_path, user_sql_threads=1) as runs:
        assert runs.user_sql(threads).column("n").to_pylist() == [1]
        write_run(tmp_path, "b", updates=3)
        assert runs.refresh()
        counts = "SELECT (SELECT count(*) FROM steps) AS steps, (SELECT count(*) FROM runs) AS runs"
        assert runs.user_sql(counts).to_pylist() == runs.sql(counts).to_pylist() == [{"steps": 5, "runs": 2}]
        with pytest.raises(QueryError, match="disabled by configuration"):
            runs.user_sql("SELECT * FROM read_text('/etc/hostname')")
    with open_runs(tmp_path) as runs:
        assert runs.user_sql(threads).column("n").to_pylist() == [max(1, os.cpu_count() or 1)]
    with pytest.raises(QueryError, match="user_sql_threads"):
        open_runs(tmp_path, user_sql_threads=0)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a thread's own nice value is Linux's")
def test_a_background_statement_runs_at_a_lower_priority_than_the_threads_that_started_it(tmp_path):
    write_run(tmp_path, "a", updates=2)
    seen: dict[str, int] = {}
    original = RunSet.user_sql

    def spy(self, *args, **kwargs):
        seen["statement"] = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
        return original(self, *args, **kwargs)

    with open_runs(tmp_path) as runs, mock.patch.object(RunSet, "user_sql", spy):
        BackgroundQuery(runs, "SELECT 1", timeout_s=30, max_rows=1).result()
    caller = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    assert seen["statement"] == min(19, caller + NICE)
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == caller
