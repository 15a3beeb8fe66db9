"""The DuckDB query layer: views over one or many runs, read-only user SQL, clear errors."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sorl_monitor.read.query import CorruptPartWarning, QueryError, open_runs
from sorl_monitor.read.summary import metric_summary, run_overview
from tests.helpers.runs import write_run


def test_views_span_several_runs_with_different_extra_columns(tmp_path):
    write_run(tmp_path, "a", updates=3, lr=1e-3)
    write_run(tmp_path, "b", updates=4, ctn_coef=0.5)
    with open_runs(tmp_path) as runs:
        per_run = runs.sql(
            "SELECT run_id, count(*) n, max(lr) lr, max(ctn_coef) c FROM steps GROUP BY 1 ORDER BY 1"
        )
        assert per_run.to_pylist() == [
            {"run_id": "a", "n": 3, "lr": 1e-3, "c": None},
            {"run_id": "b", "n": 4, "lr": None, "c": 0.5},
        ]
        assert runs.sql("SELECT count(*) FROM runs").column(0)[0].as_py() == 2


def test_one_run_folder_or_a_list_of_them_can_be_opened(tmp_path):
    a = write_run(tmp_path, "a", updates=2)
    b = write_run(tmp_path, "b", updates=2)
    with open_runs(a) as runs:
        assert runs.sql("SELECT DISTINCT run_id FROM steps").column(0).to_pylist() == ["a"]
    with open_runs([a, b]) as runs:
        assert runs.sql("SELECT count(DISTINCT run_id) FROM steps").column(0)[0].as_py() == 2


@pytest.mark.parametrize(
    "sql",
    [
        "COPY steps TO 'out.csv'",
        "CREATE TABLE x AS SELECT 1",
        "INSERT INTO runs VALUES (1)",
        "ATTACH 'other.db'",
        "INSTALL httpfs",
        "SET enable_external_access = true",
        "DROP VIEW steps",
        "PRAGMA show_tables",
    ],
)
def test_statements_that_write_attach_install_or_configure_are_refused(run_dir, sql):
    with open_runs(run_dir) as runs, pytest.raises(QueryError, match="only read-only"):
        runs.sql(sql)


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT * FROM read_csv('/etc/passwd')",
        "SELECT * FROM glob('/etc/*')",
        "SELECT * FROM read_text('/etc/hostname')",
    ],
)
def test_reads_outside_the_opened_folders_are_refused(run_dir, sql):
    with open_runs(run_dir) as runs, pytest.raises(QueryError, match="disabled by configuration"):
        runs.sql(sql)


@pytest.mark.parametrize(
    ("sql", "message"),
    [
        ("SELEC 1", "syntax error"),
        ("SELECT nope FROM steps", "nope"),
        ("", "empty"),
        ("SELECT 1; SELECT 2", "one statement"),
    ],
)
def test_bad_sql_gets_a_one_line_error(run_dir, sql, message):
    with open_runs(run_dir) as runs, pytest.raises(QueryError, match=message) as info:
        runs.sql(sql)
    assert "\n" not in str(info.value)


def test_missing_path_and_empty_folder_are_clear_errors(tmp_path):
    with pytest.raises(QueryError, match="no such file"):
        open_runs(tmp_path / "nope")
    with pytest.raises(QueryError, match="no runs found"):
        open_runs(tmp_path)
    (tmp_path / "file.txt").write_text("x")
    with pytest.raises(QueryError, match="not a directory"):
        open_runs(tmp_path / "file.txt")


def test_tables_a_run_has_not_written_are_empty_with_the_full_schema(tmp_path):
    folder = tmp_path / "r" / "steps" / "rank=0"
    folder.mkdir(parents=True)
    pq.write_table(pa.table({"run_id": ["r"], "step": [0]}), folder / "part-000000.parquet")
    with open_runs(tmp_path) as runs:
        assert runs.sql("SELECT count(*) FROM turns").column(0)[0].as_py() == 0
        assert "ratio_mean" in runs.columns("turns")
        assert runs.sql("SELECT status FROM runs").column(0).to_pylist() == ["unknown"]


def test_corrupt_part_is_skipped_with_a_warning_naming_it(run_dir):
    bad = run_dir / "steps" / "rank=0" / "part-999999.parquet"
    bad.write_bytes(b"PAR1 truncated")
    with pytest.warns(CorruptPartWarning, match="part-999999"), open_runs(run_dir) as runs:
        assert runs.sql("SELECT count(*) FROM steps").column(0)[0].as_py() == 6


def test_refresh_picks_up_new_runs_and_parts(tmp_path):
    write_run(tmp_path, "a", updates=2)
    with open_runs(tmp_path) as runs:
        assert runs.refresh() is False
        write_run(tmp_path, "b", updates=3)
        assert runs.refresh() is True
        assert runs.sql("SELECT count(*) FROM steps").column(0)[0].as_py() == 5


def test_overview_and_summary(tmp_path):
    write_run(tmp_path, "a", updates=4)
    with open_runs(tmp_path) as runs:
        overview = run_overview(runs).to_pylist()
        summary = {row["metric"]: row for row in metric_summary(runs, "a").to_pylist()}
        last = runs.sql("SELECT clip_frac FROM steps ORDER BY step DESC LIMIT 1").column(0)[0].as_py()
        clip = runs.sql("SELECT min(clip_frac), max(clip_frac) FROM steps").to_pylist()[0]
    assert (
        overview[0]["run_id"] == "a" and overview[0]["status"] == "finished" and overview[0]["updates"] == 4
    )
    assert summary["clip_frac"]["n"] == 4 and summary["clip_frac"]["last"] == last
    assert (summary["clip_frac"]["min"], summary["clip_frac"]["max"]) == tuple(clip.values())
    assert "kl_ref_k3" not in summary  # never logged: left out


INTERRUPTED_QUERY = """
import os, signal, sys, threading, time
from sorl_monitor.read.query import open_runs
runs = open_runs(sys.argv[1])
started = threading.Event()
def interrupt():  # Ctrl-C once the query runs, again every 2 s in case a slow machine had not reached it yet
    started.wait()
    while True:
        time.sleep(0.5 if not interrupt.sent else 2.0)
        interrupt.sent = True
        os.kill(os.getpid(), signal.SIGINT)
interrupt.sent = False
threading.Thread(target=interrupt, daemon=True).start()
try:
    started.set()
    runs.sql("SELECT sum(i * i) FROM range(20000000000) t(i)")  # minutes of work: the signal lands inside
except KeyboardInterrupt:
    print("KeyboardInterrupt")
"""


def test_ctrl_c_during_a_query_is_a_keyboard_interrupt_not_a_crash(tmp_path):
    write_run(tmp_path, "r")
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(INTERRUPTED_QUERY), str(tmp_path)],
        cwd=Path(__file__).resolve().parents[1], capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.stdout.strip() == "KeyboardInterrupt", done.stdout + done.stderr


@pytest.mark.parametrize("interruptible", [True, False])
def test_a_scratch_table_holds_a_query_s_rows_until_its_block_ends(tmp_path, interruptible):
    write_run(tmp_path, "a", updates=5)
    with open_runs(tmp_path, interruptible=interruptible) as runs:
        query = "SELECT run_id, step, reward_mean FROM steps WHERE step >= $from"
        with (
            runs.scratch_table(query, {"from": 2}) as first,
            runs.scratch_table(query, {"from": 4}) as second,
        ):
            assert first != second
            counts = runs.sql(f"SELECT (SELECT count(*) FROM {first}) a, (SELECT count(*) FROM {second}) b")
            assert counts.to_pylist() == [{"a": 3, "b": 1}]
            assert runs.sql(f"SELECT * FROM {first} ORDER BY step") == runs.sql(
                query + " ORDER BY step", {"from": 2}
            )
        with pytest.raises(QueryError, match="does not exist"):
            runs.sql(f"SELECT * FROM {first}")


def test_a_scratch_table_takes_only_read_only_sql_and_its_mistakes_are_one_line_errors(tmp_path):
    write_run(tmp_path, "a", updates=2)
    with open_runs(tmp_path) as runs:
        with pytest.raises(QueryError), runs.scratch_table("DROP VIEW steps"):
            pass
        with (
            pytest.raises(QueryError, match="bad SQL"),
            runs.scratch_table("SELECT no_such_column FROM steps"),
        ):
            pass
        assert runs.sql("SELECT count(*) n FROM steps").to_pylist() == [{"n": 2}]
