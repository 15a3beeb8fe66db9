"""Multi-rank runs: one metric aggregated across ranks per step, and each rank's skew from the others.

Every rank writes its own partition (``<table>/rank=R/``) under one run id (rank 0's, broadcast by
``Monitor``); the ``steps`` view holds all ranks, with a ``rank`` column. Skew of rank ``r`` at step
``s``: ``v[r, s] − mean_r' v[r', s]``.
"""

from __future__ import annotations

import pyarrow as pa

from sorl_monitor.read.query import QueryError, RunSet

ACROSS_RANKS_SQL = """
WITH per_rank AS (
    SELECT run_id, step, rank, avg({column}) AS value
    FROM steps WHERE {column} IS NOT NULL AND ($run IS NULL OR run_id = $run)
    GROUP BY run_id, step, rank
)
SELECT run_id, step, count(*) AS ranks, avg(value) AS mean, min(value) AS min, max(value) AS max,
       max(value) - min(value) AS spread, arg_min(rank, value) AS min_rank, arg_max(rank, value) AS max_rank
FROM per_rank GROUP BY run_id, step ORDER BY run_id, step
"""
"""Per step: how many ranks logged the metric, its mean, min, max and spread, and which rank is lowest/highest."""

RANK_SKEW_SQL = """
WITH per_rank AS (
    SELECT run_id, step, rank, avg({column}) AS value
    FROM steps WHERE {column} IS NOT NULL AND ($run IS NULL OR run_id = $run)
    GROUP BY run_id, step, rank
), per_step AS (
    SELECT run_id, step, avg(value) AS step_mean FROM per_rank GROUP BY run_id, step
)
SELECT run_id, rank, count(*) AS steps, avg(value) AS mean, avg(value - step_mean) AS mean_skew,
       max(abs(value - step_mean)) AS max_abs_skew
FROM per_rank JOIN per_step USING (run_id, step)
GROUP BY run_id, rank ORDER BY run_id, rank
"""
"""Per rank: steps logged, the metric's mean, and its mean and largest deviation from the cross-rank mean."""


def _column(runs: RunSet, metric: str) -> str:
    """``metric`` as a quoted identifier, if it is a column of ``steps`` (``QueryError`` otherwise)."""
    if metric not in runs.columns("steps"):
        raise QueryError(f"no column {metric!r} in steps")
    return '"' + metric.replace('"', '""') + '"'


def metric_across_ranks(runs: RunSet, metric: str, run_id: str | None = None) -> pa.Table:
    """One row per (run, step): ``metric`` aggregated over ranks (see ``ACROSS_RANKS_SQL``)."""
    return runs.sql(ACROSS_RANKS_SQL.format(column=_column(runs, metric)), {"run": run_id})


def rank_skew(runs: RunSet, metric: str, run_id: str | None = None) -> pa.Table:
    """One row per (run, rank): how far the rank's ``metric`` sits from the cross-rank mean (``RANK_SKEW_SQL``)."""
    return runs.sql(RANK_SKEW_SQL.format(column=_column(runs, metric)), {"run": run_id})
