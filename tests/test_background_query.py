"""``BackgroundQuery``: a user's statement in the background, stopped by its time limit or on cancel."""

from __future__ import annotations

import time

import pytest

from sorl_monitor.read.query import QueryError, open_runs
from sorl_monitor.read.sql.background import BackgroundQuery
from tests.helpers.runs import write_run

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
        # the limit plus a child's kill on a machine 3× slower and busy; unlimited, the join runs for hours
        assert query.elapsed_s < 0.5 + 9.5


def test_cancel_stops_a_runaway_statement_at_once_and_other_queries_never_wait_for_it(tmp_path):
    write_run(tmp_path, "run", updates=6)
    with open_runs(tmp_path) as runs:
        query = BackgroundQuery(runs, RUNAWAY, timeout_s=120, max_rows=10)
        started = time.monotonic()
        assert runs.sql("SELECT count(*) AS n FROM steps").column("n")[0].as_py() == 6
        assert not query.done(wait_s=0.3)  # the other query answered while the runaway still ran
        query.cancel()
        assert query.done(wait_s=5)  # stopped within seconds of the cancel, not at its 120 s limit
        with pytest.raises(QueryError, match="query stopped"):
            query.result()
    # far below the 120 s limit: no step above waited for the runaway statement to end on its own
    assert time.monotonic() - started < 120 / 4
