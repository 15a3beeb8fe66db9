"""SQL that tries to write, or to read outside the opened folders, is refused; reads of the runs still work."""

from __future__ import annotations

import pytest

from sorl_monitor.read.query import QueryError, open_runs
from tests.helpers.runs import write_run


@pytest.fixture
def two_runs(tmp_path):
    logs = tmp_path / "logs"
    return write_run(logs, "a", updates=2), write_run(logs, "b", updates=2)


@pytest.mark.parametrize(
    "template",
    [
        "EXPLAIN ANALYZE COPY (SELECT 42 AS x) TO '{target}' (FORMAT parquet)",
        "EXPLAIN /* a comment */ analyze COPY (SELECT 42 AS x) TO '{target}' (FORMAT parquet)",
        "explain (analyze) COPY (SELECT 42 AS x) TO '{target}' (FORMAT parquet)",
        "EXPLAIN ANALYZE CREATE TABLE t AS SELECT 1",
        "EXPLAIN ANALYZE INSERT INTO runs (run_id) VALUES ('forged')",
    ],
)
def test_explain_analyze_of_a_write_is_refused_and_writes_nothing(two_runs, template):
    run, _ = two_runs
    target = run / "steps" / "rank=0" / "part-999999.parquet"
    with open_runs(run) as runs, pytest.raises(QueryError, match="only read-only"):
        runs.sql(template.format(target=target))
    assert not target.exists()


@pytest.mark.parametrize(
    "query",
    [
        "EXPLAIN SELECT count(*) FROM steps",
        "EXPLAIN ANALYZE SELECT count(*) FROM steps",
        "EXPLAIN (FORMAT json) SELECT step FROM steps",
        "WITH s AS (SELECT step FROM steps) SELECT max(step) FROM s",
    ],
)
def test_explain_of_a_select_and_ctes_still_run(two_runs, query):
    run, _ = two_runs
    with open_runs(run) as runs:
        assert runs.sql(query).num_rows >= 1


@pytest.mark.parametrize(
    "template",
    [
        "SELECT * FROM read_parquet('{run}/../b/steps/*/*.parquet')",  # a sibling run, by ..
        "SELECT * FROM read_parquet('{sibling}/steps/*/*.parquet')",  # a sibling run, by its path
        "SELECT * FROM read_csv('{run}/../../outside.csv')",
        "SELECT * FROM parquet_metadata('{run}/../../outside.parquet')",
        "SELECT * FROM read_blob('/etc/hostname')",
        "SELECT * FROM sniff_csv('/etc/passwd')",
    ],
)
def test_reads_beside_or_above_the_opened_run_are_refused(two_runs, tmp_path, template):
    run, sibling = two_runs
    (tmp_path / "outside.csv").write_text("secret\nhunter2\n")
    with open_runs(run) as runs, pytest.raises(QueryError, match="disabled by configuration"):
        runs.sql(template.format(run=run, sibling=sibling))


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("SELECT 1; COPY steps TO '/tmp/x.csv'", "one statement"),
        ("SELECT getenv('HOME')", "bad SQL"),
        ("SELECT " + "1 + " * 20_000 + "1", "bad SQL"),
    ],
)
def test_hostile_or_huge_queries_get_a_one_line_error(two_runs, query, message):
    run, _ = two_runs
    with open_runs(run) as runs, pytest.raises(QueryError, match=message) as info:
        runs.sql(query)
    assert "\n" not in str(info.value)


def test_huge_literals_are_answered_not_crashed_on(two_runs):
    run, _ = two_runs
    with open_runs(run) as runs:
        counted = runs.sql(
            "SELECT count(*) AS n FROM steps WHERE step < 1e999999 AND step > -9223372036854775808"
        ).to_pylist()
        huge = runs.sql("SELECT 1e308 * 10 AS inf, 170141183460469231731687303715884105727 AS h").to_pylist()
    assert counted == [{"n": 2}]
    assert huge[0]["inf"] == float("inf") and huge[0]["h"] == 2**127 - 1
