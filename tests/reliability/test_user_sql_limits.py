"""A user's SQL (``RunSet.user_sql``, ``sorl query``) runs outside the run set's lock, under a time limit and
a memory limit, and cannot read DuckDB's temp folder under the current directory."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest

from sorl_monitor.read.query import QueryError, open_runs
from tests.helpers.paths import ROOT
from tests.helpers.runs import write_run

ENDLESS = "SELECT sum(i) FROM range(5000000000000) t(i)"  # minutes of work, on any machine
SLACK_S = 3.0
"""Seconds on top of a time limit for the child to be killed and the error to come back, on a machine 3×
slower and busy (~0.1 s here idle)."""
HUGE_LIST = "SELECT list(i) AS l FROM range(700000000) t(i)"  # 5.6 GB of integers in one cell


@pytest.fixture
def run(tmp_path):
    return write_run(tmp_path / "logs", "run", updates=2)


def test_a_slow_query_is_stopped_at_its_time_limit_with_one_line(run):
    with open_runs(run) as runs:
        started = time.monotonic()
        with pytest.raises(QueryError, match=r"^query stopped at its time limit of 0.5 s$"):
            runs.user_sql(ENDLESS, timeout_s=0.5)
        assert time.monotonic() - started < 0.5 + SLACK_S
        assert runs.user_sql("SELECT count(*) AS n FROM steps").column("n")[0].as_py() == 2


def test_a_refresh_does_not_wait_for_a_users_query(run, tmp_path, record_measurement):
    with open_runs(tmp_path / "logs") as runs:
        errors: list[BaseException] = []
        cancel = threading.Event()

        def endless() -> None:  # runs until the test cancels it (or its 60 s limit, if the refresh waited)
            try:
                runs.user_sql(ENDLESS, timeout_s=60, cancel=cancel)
            except QueryError as error:
                errors.append(error)

        worker = threading.Thread(target=endless)
        worker.start()
        time.sleep(0.5)
        write_run(tmp_path / "logs", "second", updates=1)  # a new run: the refresh rebuilds every view
        started = time.monotonic()
        assert runs.refresh()
        refresh_s = time.monotonic() - started
        # before, the refresh waited for the whole query (23.6 s for range(5e12)); now it is done while the
        # query still runs: a yes or no, not a speed
        running_after_refresh = worker.is_alive() and not errors
        counted = runs.user_sql("SELECT count(DISTINCT run_id) AS n FROM steps").column("n")[0].as_py()
        cancel.set()
        worker.join()
    record_measurement(refresh_s_during_a_users_query=round(refresh_s, 3))
    assert running_after_refresh, (refresh_s, errors)
    assert counted == 2
    assert len(errors) == 1 and str(errors[0]) == "query stopped"


SORL_MEASURING_PEAK = """
import pathlib, resource, sys
from sorl_monitor.cli.main import app
try:
    app(sys.argv[2:])
finally:
    pathlib.Path(sys.argv[1]).write_text(str(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss))
"""


def sorl_peak_mib(tmp_path, *args: str) -> tuple[subprocess.CompletedProcess, float]:
    """Run ``sorl ARGS`` in a fresh process; its result and its peak resident memory (MiB)."""
    peak = tmp_path / "peak_kib"
    result = subprocess.run([sys.executable, "-c", SORL_MEASURING_PEAK, str(peak), *args], capture_output=True,
                            text=True, timeout=120, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})  # fmt: skip
    return result, int(peak.read_text()) / 1024


def test_a_query_past_the_memory_limit_fails_with_one_line_and_the_process_stays_small(
    run, tmp_path, record_measurement
):
    _, idle_mib = sorl_peak_mib(tmp_path, "query", str(run), "SELECT 1")  # the CLI's own imports
    result, peak_mib = sorl_peak_mib(tmp_path, "query", str(run), HUGE_LIST, "--memory-limit", "256MB")
    record_measurement(memory_limit="256MB", peak_rss_mib=round(peak_mib), select_1_rss_mib=round(idle_mib))
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stderr.strip().splitlines()[-1] == "error: query stopped at its memory limit of 256MB"
    assert peak_mib - idle_mib < 640, (
        peak_mib,
        idle_mib,
    )  # guards against a statement whose memory is not bounded


def test_the_time_limit_is_a_cli_option(run):
    command = [sys.executable, "-m", "sorl_monitor.cli.main", "query", str(run), ENDLESS, "--timeout", "0.5"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=60, cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})  # fmt: skip
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == "error: query stopped at its time limit of 0.5 s"


def test_duckdbs_temp_folder_under_the_current_directory_is_not_readable(run, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / ".tmp").mkdir()
    (tmp_path / ".tmp" / "secret.csv").write_text("token\nhunter2\n")
    with open_runs(run) as runs:
        for query in (runs.user_sql, runs.sql):
            with pytest.raises(QueryError, match="disabled by configuration"):
                query("SELECT * FROM read_csv('.tmp/secret.csv')")


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("SELECT to_timestamp(1e18)", "bad SQL: Conversion Error"),
        ("COPY steps TO 'x.csv'", "only read-only"),
        ("SELECT 1; SELECT 2", "one statement"),
    ],
)
def test_mistakes_in_user_sql_are_one_line(run, query, message):
    with open_runs(run) as runs, pytest.raises(QueryError, match=message) as info:
        runs.user_sql(query)
    assert "\n" not in str(info.value)


def test_max_rows_fetches_at_most_that_many_rows(run):
    with open_runs(run) as runs:
        assert runs.user_sql("SELECT * FROM range(1000000000) t(i)", max_rows=3).num_rows == 3


def test_a_bad_memory_limit_is_one_line(run):
    with pytest.raises(QueryError, match="bad memory limit 'lots'"):
        open_runs(run, memory_limit="lots")
