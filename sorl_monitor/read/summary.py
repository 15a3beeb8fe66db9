"""What ``sorl runs`` and ``sorl summary`` show of a run set: one row per run, and per metric of one run its
count, min, median, max and last value."""

from __future__ import annotations

import duckdb
import pyarrow as pa

from sorl_monitor.read.query import RunSet

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
``UNION ALL``, takes time that grows faster than the number of columns (docs/results.md, "Measurements behind
the code")."""
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
