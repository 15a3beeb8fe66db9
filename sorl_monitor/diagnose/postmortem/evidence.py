"""The evidence a root cause is read from: step and turn numbers over the window before the fall, the run's early
levels, and which detector inputs the run logs."""

from __future__ import annotations

import math
from typing import Any

from sorl_monitor.diagnose.detectors.catalogue import DETECTORS
from sorl_monitor.diagnose.detectors.signals import OPTIONAL_SIGNALS, SIGNALS
from sorl_monitor.diagnose.postmortem.config import PostmortemConfig
from sorl_monitor.read.query import RunSet

RUN_ROWS_SQL = (
    "SELECT count(*) FILTER (WHERE isfinite(reward_mean)) AS n, min(step) AS first_step FROM steps"
    " WHERE run_id = $run_id"
)
"""How many rows of the run have a reward the collapse label can use (none: the run is ``not_judged``), and its
first step (``EARLY_SQL``'s)."""
INPUTS_SQL = "SELECT {counts} FROM steps WHERE run_id = $run_id"
"""How many rows of the run carry each detector input column."""

RUN_ROWS_OVER_BLOCKS = "SELECT coalesce(sum(reward_rows), 0) AS n, min(first_step) AS first_step FROM {table}"
"""``RUN_ROWS_SQL`` over ``SHARED_BLOCKS_SQL``'s table."""


def count_run_rows(runs: RunSet, run_id: str, blocks: str | None = None) -> dict[str, Any]:
    """``run_id``'s rows with a finite reward (``n``) and its first step (``RUN_ROWS_SQL``; with ``blocks``, from
    that table of ``SHARED_BLOCKS_SQL``'s rows)."""
    if blocks is None:
        return runs.sql(RUN_ROWS_SQL, {"run_id": run_id}).to_pylist()[0]
    return runs.sql(RUN_ROWS_OVER_BLOCKS.format(table=blocks)).to_pylist()[0]


STEP_EVIDENCE_SQL = """
SELECT avg(coalesce(clip_frac, clip_frac_active)) AS token_clip_frac,
       avg(clip_frac_turn) AS turn_clip_frac,
       median(ratio_p99) AS token_ratio_p99,
       max(ratio_max) AS token_ratio_max,
       max(turn_ratio_max) AS turn_ratio_max,
       max(coalesce(kl_old_k3, kl_old_k2, kl_old, abs(kl_old_k1))) AS kl_old_max,
       max(grad_norm) AS grad_norm_max,
       max(entropy) AS entropy_max,
       avg(coalesce(response_len_mean, completion_len_mean)) AS length_mean,
       max(completion_truncated_frac) AS truncated_share_max,
       max(policy_lag) AS max_policy_lag,
       max(ppo_epoch) + 1 AS ppo_epochs,
       regr_slope(clip_frac, policy_lag) AS clip_frac_per_lag,
       regr_slope(kl_old_k3, policy_lag) AS kl_per_lag,
       avg(CASE WHEN ctn_active THEN 1.0 WHEN ctn_active IS NOT NULL THEN 0.0 END) AS ctn_on_share
FROM steps WHERE run_id = $run_id AND step BETWEEN $start AND $end
"""
"""Step-level evidence over the window ``[start, end]`` of one run."""

EARLY_SQL = """
SELECT regr_slope(clip_frac, policy_lag) AS clip_frac_per_lag_early,
       avg(coalesce(clip_frac, clip_frac_active)) AS clip_frac_early,
       min(entropy) AS entropy_early,
       avg(coalesce(response_len_mean, completion_len_mean)) AS length_early
FROM steps WHERE run_id = $run_id AND step < $first_step + $root_cause_steps
"""
"""The run's first ``root_cause_steps`` steps from its ``first_step`` (the healthy reference): how fast clip
fraction grows with policy lag, its level, the entropy and the response length. (The first step as a value, not a
subquery: DuckDB then filters the scan by it.)"""

TURN_EVIDENCE_SQL = """
SELECT count(*) AS turn_rows,
       avg(CASE WHEN abs(ratio_mean - 1) > $turn_ratio_eps THEN 1.0 ELSE 0.0 END) AS turn_tail_share,
       quantile_cont(ratio_mean, 0.99) AS turn_ratio_p99,
       avg(clip_frac) AS token_clip_frac_in_turns
FROM turns WHERE run_id = $run_id AND step BETWEEN $start AND $end AND isfinite(ratio_mean)
"""
"""Turn-level evidence (the ``turns`` table) over the same window: share of turns with
``|w̄_k − 1| > ε`` and the 99th percentile of ``w̄_k``."""


def _ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or denominator is None or denominator <= 0:
        return None
    return numerator / denominator


def gather_evidence(
    runs: RunSet,
    run_id: str,
    start: int,
    end: int,
    config: PostmortemConfig,
    first_step: int | None = None,
) -> dict[str, Any]:
    """Evidence numbers over ``[start, end]``: token vs turn tails, growth with policy lag, CTN share (and the
    run's early levels from its ``first_step``, read from ``steps`` when not given)."""
    params = {"run_id": run_id, "start": start, "end": end}
    evidence: dict[str, Any] = {"window_start": start, "window_end": end}
    evidence.update(runs.sql(STEP_EVIDENCE_SQL, params).to_pylist()[0])
    if first_step is None:
        first_step = count_run_rows(runs, run_id)["first_step"]
    early = {"run_id": run_id, "root_cause_steps": config.root_cause_steps, "first_step": first_step}
    evidence.update(runs.sql(EARLY_SQL, early).to_pylist()[0])
    evidence.update(
        runs.sql(TURN_EVIDENCE_SQL, {**params, "turn_ratio_eps": config.turn_ratio_eps}).to_pylist()[0]
    )
    token_tail = evidence["token_ratio_p99"]
    turn_tail = evidence["turn_ratio_p99"]
    evidence["tail_width_ratio"] = (
        _ratio(math.log(token_tail), math.log(turn_tail))
        if token_tail and turn_tail and token_tail > 0 and turn_tail > 0
        else None
    )
    evidence["token_turn_clip_ratio"] = _ratio(evidence["token_clip_frac"], evidence["turn_clip_frac"])
    evidence["lag_growth"] = _ratio(evidence["clip_frac_per_lag"], evidence["clip_frac_per_lag_early"])
    evidence["clip_frac_growth"] = _ratio(evidence["token_clip_frac"], evidence["clip_frac_early"])
    evidence["entropy_growth"] = _ratio(evidence["entropy_max"], evidence["entropy_early"])
    evidence["length_growth"] = _ratio(evidence["length_mean"], evidence["length_early"])
    return evidence


def run_inputs(runs: RunSet, run_id: str) -> tuple[dict[str, list[str]], list[str]]:
    """Per detector family, the input columns ``run_id`` logs; and the detectors it has no input for."""
    columns = sorted({c for d in DETECTORS for c in d.columns})
    counts = runs.sql(
        INPUTS_SQL.format(counts=", ".join(f'count("{c}") AS "{c}"' for c in columns)), {"run_id": run_id}
    ).to_pylist()[0]
    present = {c for c, n in counts.items() if n}
    families: dict[str, list[str]] = {}
    for detector in (d for d in DETECTORS if not d.reads):  # a joint detector reads the others' inputs
        families.setdefault(detector.family, [])
        families[detector.family] += [
            c for c in detector.columns if c in present and c not in families[detector.family]
        ]
    missing = [
        d.name
        for d in DETECTORS
        if any(not present & set(SIGNALS[s].columns) for s in d.signals)
        and not set(d.signals) & set(OPTIONAL_SIGNALS)
    ]
    return families, missing
