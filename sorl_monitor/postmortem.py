"""Post-mortem of one run: collapse label, alert timeline, lead time, root cause with evidence, remedy.

    verdict = postmortem(open_runs("runs/"), "my-run")
    verdict.collapse_step, verdict.lead_time, verdict.root_cause, verdict.remedy

Collapse label (for evaluation, separate from alerts): the reward moving average (``collapse_ma_steps``
updates) falls below ``collapse_fraction`` of its running peak and does not come back within
``collapse_recovery_steps`` updates (at least ``collapse_ma_steps`` updates must follow the drop: a dip
in a run's last updates is not yet a collapse), or the loss becomes non-finite. Lead time = collapse step − first
critical alert step (negative: the alarm came late).

Root cause, from the alerts up to the collapse (or the run's end) and evidence over the last
``root_cause_steps`` updates before it (``steps`` and the per-turn ``turns`` rows):

* ``echo_trap`` — reward variance collapses (``echo_trap`` / ``reward_std_collapse``) before any
  ratio alert and before any grad-norm spike;
* ``granularity_mismatch`` — token-level IS in a multi-turn run whose token-ratio tails are far
  wider than its turn ratios (token clip fraction ≥ ``mismatch_clip_ratio`` × turn clip fraction, or
  log-p99 tails ≥ ``mismatch_tail_ratio`` × as wide);
* ``off_policy_variance`` — clip fraction grows with the policy lag (the rollout's reuse) by at least
  ``off_policy_min_slope`` per update of lag, and ``off_policy_growth`` × as fast as at the run's start;
  or, with rollouts at least ``off_policy_min_lag`` updates old, the clip fraction has grown to
  ``off_policy_clip_growth`` × its level over the run's first ``root_cause_steps`` updates (drift that
  accumulates across stale rollout batches rather than within one);
* ``optimisation_blowup`` — grad-norm spikes, non-finite values, or ratio alerts with none of the above;
* ``unexplained`` — a collapse with no alert; ``none`` — a healthy run without critical alerts.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from sorl_monitor.detectors import DetectorConfig, detect_params, detect_sql
from sorl_monitor.query import QueryError, RunSet

COLLAPSE_SQL = """
WITH per_step AS (
    SELECT run_id, step,
           avg(reward_mean) FILTER (WHERE isfinite(reward_mean)) AS reward,
           avg(coalesce(loss, pg_loss)) AS loss
    FROM steps WHERE $run_id::VARCHAR IS NULL OR run_id = $run_id
    GROUP BY run_id, step
),
smoothed AS (
    SELECT run_id, step, loss,
           avg(reward) OVER (PARTITION BY run_id ORDER BY step
                             ROWS BETWEEN $collapse_ma_steps - 1 PRECEDING AND CURRENT ROW) AS reward_ma
    FROM per_step
),
peaked AS (
    SELECT *, max(reward_ma) OVER (PARTITION BY run_id ORDER BY step ROWS UNBOUNDED PRECEDING) AS peak
    FROM smoothed
),
flagged AS (
    SELECT *, peak > $collapse_min_peak AND reward_ma < $collapse_fraction * peak AS below FROM peaked
),
held AS (
    SELECT *, coalesce(bool_or(NOT below) OVER (PARTITION BY run_id ORDER BY step
                       ROWS BETWEEN 1 FOLLOWING AND $collapse_recovery_steps FOLLOWING), false) AS recovers,
              count(*) OVER (PARTITION BY run_id ORDER BY step
                       ROWS BETWEEN 1 FOLLOWING AND $collapse_recovery_steps FOLLOWING) AS seen_after
    FROM flagged
),
reward_collapse AS (
    SELECT run_id, min(step) AS step, arg_min(peak, step) AS peak, arg_min(reward_ma, step) AS reward_ma
    FROM held WHERE below AND NOT recovers AND seen_after >= least($collapse_ma_steps, $collapse_recovery_steps)
    GROUP BY run_id
),
nonfinite_loss AS (
    SELECT run_id, min(step) AS step FROM per_step
    WHERE loss IS NOT NULL AND NOT isfinite(loss) GROUP BY run_id
),
deepest_dip AS (
    SELECT run_id, min(reward_ma / peak) AS deepest_dip, arg_min(step, reward_ma / peak) AS deepest_dip_step
    FROM peaked WHERE peak > $collapse_min_peak AND peak > 0 GROUP BY run_id
),
runs_seen AS (SELECT run_id, max(step) AS last_step, count(*) AS updates FROM per_step GROUP BY run_id)
SELECT s.run_id, s.updates, s.last_step,
       least(r.step, n.step) AS collapse_step,
       CASE WHEN n.step IS NOT NULL AND (r.step IS NULL OR n.step <= r.step) THEN 'nonfinite_loss'
            WHEN r.step IS NOT NULL THEN 'reward_below_peak' END AS collapse_reason,
       r.peak AS reward_peak, r.reward_ma AS reward_at_collapse,
       d.deepest_dip, d.deepest_dip_step
FROM runs_seen s LEFT JOIN reward_collapse r USING (run_id) LEFT JOIN nonfinite_loss n USING (run_id)
     LEFT JOIN deepest_dip d USING (run_id)
ORDER BY s.run_id
"""
"""One row per run: ``run_id, updates, last_step, collapse_step, collapse_reason, reward_peak,
reward_at_collapse`` (collapse columns null for a run without collapse), and ``deepest_dip``, the lowest
``reward_ma / running peak`` of the run (1 = never below its peak; below ``collapse_fraction`` = a dip as
deep as a collapse, recovered from or not), at ``deepest_dip_step``."""

STEP_EVIDENCE_SQL = """
SELECT avg(clip_frac) AS token_clip_frac,
       avg(clip_frac_turn) AS turn_clip_frac,
       median(ratio_p99) AS token_ratio_p99,
       max(ratio_max) AS token_ratio_max,
       max(turn_ratio_max) AS turn_ratio_max,
       max(kl_old_k3) AS kl_old_max,
       max(grad_norm) AS grad_norm_max,
       max(policy_lag) AS max_policy_lag,
       max(ppo_epoch) + 1 AS ppo_epochs,
       regr_slope(clip_frac, policy_lag) AS clip_frac_per_lag,
       regr_slope(kl_old_k3, policy_lag) AS kl_per_lag,
       avg(CASE WHEN ctn_active THEN 1.0 WHEN ctn_active IS NOT NULL THEN 0.0 END) AS ctn_on_share
FROM steps WHERE run_id = $run_id AND step BETWEEN $start AND $end
"""
"""Step-level evidence over the window ``[start, end]`` of one run."""

EARLY_LAG_SQL = """
SELECT regr_slope(clip_frac, policy_lag) AS clip_frac_per_lag_early, avg(clip_frac) AS clip_frac_early
FROM (SELECT clip_frac, policy_lag FROM steps WHERE run_id = $run_id ORDER BY step LIMIT $root_cause_steps)
"""
"""How fast clip fraction grows with policy lag at the start of the run, and its level (the healthy reference)."""

TURN_EVIDENCE_SQL = """
SELECT count(*) AS turn_rows,
       avg(CASE WHEN abs(ratio_mean - 1) > $turn_ratio_eps THEN 1.0 ELSE 0.0 END) AS turn_tail_share,
       quantile_cont(ratio_mean, 0.99) AS turn_ratio_p99,
       avg(clip_frac) AS token_clip_frac_in_turns
FROM turns WHERE run_id = $run_id AND step BETWEEN $start AND $end AND isfinite(ratio_mean)
"""
"""Turn-level evidence (the ``turns`` table) over the same window: share of turns with
``|w̄_k − 1| > ε`` and the 99th percentile of ``w̄_k``."""

ALERT_SUMMARY_SQL = """
WITH fired AS ({detect_sql})
SELECT detector,
       CASE WHEN bool_or(severity = 'critical') THEN 'critical' ELSE 'warning' END AS severity,
       min(step) AS first_step,
       min(step) FILTER (WHERE severity = 'critical') AS first_critical_step,
       count(*) AS count,
       max(value) AS max_value,
       arg_max(message, value) AS message
FROM fired GROUP BY detector
ORDER BY first_critical_step NULLS LAST, first_step, detector
"""
"""The detectors' firings on one run summarised per detector, most urgent first (``{detect_sql}`` is
``detectors.detect_sql()``): aggregated inside DuckDB, so a long run's many firing rows never leave it."""

FAMILIES = {
    "ratio": (
        "clip_frac_level", "clip_frac_trend", "turn_ratio_tail", "turn_ratio_max",
        "token_ratio_p99", "token_ratio_max", "kl_spike",
    ),
    "echo": ("echo_trap", "reward_std_collapse"),
    "blowup": ("grad_norm_spike", "nonfinite"),
}  # fmt: skip
"""Detector families the attribution reasons about."""

CAUSES: dict[str, tuple[str, str]] = {
    "granularity_mismatch": (
        "granularity mismatch: token-level importance ratios are far wider than the turn-level ratios "
        "the multi-turn reward is assigned at, so token-level clipping and IS variance explode",
        "Use turn-level importance sampling (Turn-PPO / SO-PPO: w̄_k = mean of the turn's token ratios) "
        "and turn on Clipping-Triggered Normalization (CTN).",
    ),
    "off_policy_variance": (
        "off-policy variance accumulation: clip fraction and KL grow with each reuse of a rollout "
        "(PPO epochs × mini-batches, stale rollouts)",
        "Reuse each rollout less (fewer PPO epochs or mini-batches, fresher rollouts) and turn on CTN.",
    ),
    "echo_trap": (
        "Echo Trap: reward variance (and entropy) collapsed before any ratio or gradient blow-up; "
        "groups with identical rewards give no learning signal",
        "Keep reward variance: drop zero-variance groups, keep exploration (temperature or entropy "
        "bonus), and lower the learning rate; CTN limits the damage meanwhile.",
    ),
    "optimisation_blowup": (
        "optimisation blow-up: gradient-norm spikes or non-finite values without a token/turn or "
        "off-policy signature",
        "Lower the learning rate (and tighten gradient clipping).",
    ),
    "unexplained": (
        "collapse without a preceding alert: no detector saw it coming",
        "Inspect the run's curves (sorl report) and consider lowering the detectors' thresholds.",
    ),
    "none": ("no collapse and no critical alert", "Nothing to do."),
}
"""Each root cause: what it means, and the remedy the paper (arXiv 2511.20718) suggests."""


@dataclass
class Verdict:
    """The post-mortem of one run (``to_dict()`` for JSON)."""

    run_id: str
    algorithm: str | None
    updates: int
    last_step: int | None
    collapse_step: int | None
    collapse_reason: str | None
    first_warning: int | None
    first_critical: int | None
    lead_time: int | None
    root_cause: str
    explanation: str
    evidence: dict[str, Any]
    remedy: str
    top_alerts: list[dict[str, Any]] = field(default_factory=list)

    @property
    def collapsed(self) -> bool:
        return self.collapse_step is not None

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready values (NaN and ±Inf become ``None``)."""
        return _json_safe({**dataclasses.asdict(self), "collapsed": self.collapsed})


def _json_safe(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    return value


def label_collapse(runs: RunSet, config: DetectorConfig | None = None, run_id: str | None = None) -> pa.Table:
    """The collapse label of every run (or of ``run_id``): see ``COLLAPSE_SQL``."""
    config = config or DetectorConfig()
    return runs.sql(COLLAPSE_SQL, detect_params(COLLAPSE_SQL, config, run_id))


def summarise_alerts(runs: RunSet, run_id: str, config: DetectorConfig | None = None) -> list[dict[str, Any]]:
    """Per detector that fired on ``run_id``: severity, first step, first critical step, count, strongest firing."""
    config = config or DetectorConfig()
    sql = ALERT_SUMMARY_SQL.format(detect_sql=detect_sql())
    return runs.sql(sql, detect_params(sql, config, run_id)).to_pylist()


def _first(
    summary: list[dict[str, Any]],
    end: int | None,
    names: tuple[str, ...] | None = None,
    critical: bool = False,
) -> int | None:
    """First step ``≤ end`` at which one of ``names`` (any detector when ``None``) fired (critically)."""
    key = "first_critical_step" if critical else "first_step"
    steps = [
        row[key] for row in summary if row[key] is not None and (names is None or row["detector"] in names)
    ]
    first = min(steps, default=None)
    return first if first is None or end is None or first <= end else None


def _ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or denominator is None or denominator <= 0:
        return None
    return numerator / denominator


def gather_evidence(
    runs: RunSet, run_id: str, start: int, end: int, config: DetectorConfig
) -> dict[str, Any]:
    """Evidence numbers over ``[start, end]``: token vs turn tails, growth with policy lag, CTN share."""
    params = {"run_id": run_id, "start": start, "end": end}
    evidence: dict[str, Any] = {"window_start": start, "window_end": end}
    evidence.update(runs.sql(STEP_EVIDENCE_SQL, params).to_pylist()[0])
    evidence.update(
        runs.sql(EARLY_LAG_SQL, {"run_id": run_id, "root_cause_steps": config.root_cause_steps}).to_pylist()[
            0
        ]
    )
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
    return evidence


def _at_least(value: float | None, threshold: float) -> bool:
    return value is not None and math.isfinite(value) and value >= threshold


def attribute(
    summary: list[dict[str, Any]],
    evidence: dict[str, Any],
    end: int | None,
    collapsed: bool,
    turn_level: bool,
    config: DetectorConfig,
) -> str:
    """The root cause (a key of ``CAUSES``) from the alerts up to ``end`` and the evidence numbers."""
    echo = _first(summary, end, FAMILIES["echo"])
    ratio_alert = _first(summary, end, FAMILIES["ratio"])
    ratio_critical = _first(summary, end, FAMILIES["ratio"], critical=True)
    blowup = _first(summary, end, FAMILIES["blowup"])
    any_critical = _first(summary, end, critical=True)
    if not collapsed and any_critical is None:
        return "none"
    if echo is not None and all(
        other is None or echo < other for other in (ratio_alert, ratio_critical, blowup)
    ):
        return "echo_trap"
    if ratio_alert is not None:
        token_clip = evidence.get("token_clip_frac")
        mismatch = not turn_level and (
            (
                _at_least(evidence.get("token_turn_clip_ratio"), config.mismatch_clip_ratio)
                and _at_least(token_clip, 0.1)
            )
            or _at_least(evidence.get("tail_width_ratio"), config.mismatch_tail_ratio)
        )
        if mismatch:
            return "granularity_mismatch"
        slope, early = evidence.get("clip_frac_per_lag"), evidence.get("clip_frac_per_lag_early")
        if _at_least(slope, config.off_policy_min_slope) and _at_least(
            slope, config.off_policy_growth * max(early or 0.0, 0.0)
        ):
            return "off_policy_variance"
        # stale or reused rollouts whose drift accumulates across iterations rather than within one
        if _at_least(evidence.get("max_policy_lag"), config.off_policy_min_lag) and _at_least(
            evidence.get("clip_frac_growth"), config.off_policy_clip_growth
        ):
            return "off_policy_variance"
        return "optimisation_blowup"
    if blowup is not None:
        return "optimisation_blowup"
    return "unexplained" if collapsed else "none"


def _run_info(runs: RunSet, run_id: str) -> dict[str, Any]:
    rows = runs.sql("SELECT algorithm FROM runs WHERE run_id = $run_id", {"run_id": run_id}).to_pylist()
    if not rows:
        known = [r["run_id"] for r in runs.sql("SELECT run_id FROM runs ORDER BY run_id").to_pylist()]
        raise QueryError(f"no run {run_id!r} here (runs: {', '.join(known[:8])})")
    return rows[0]


def postmortem(runs: RunSet, run_id: str, config: DetectorConfig | None = None) -> Verdict:
    """Label, time, and explain one run (see module docstring)."""
    config = config or DetectorConfig()
    algorithm = _run_info(runs, run_id)["algorithm"]
    label = label_collapse(runs, config, run_id).to_pylist()
    if not label:
        raise QueryError(f"run {run_id!r} has no steps logged yet")
    label_row = label[0]
    summary = summarise_alerts(runs, run_id, config)
    collapse_step = label_row["collapse_step"]
    end = collapse_step if collapse_step is not None else label_row["last_step"]
    first_warning = _first(summary, None)
    first_critical = _first(summary, None, critical=True)
    evidence = gather_evidence(runs, run_id, max(0, end - config.root_cause_steps), end, config)
    evidence["reward_peak"] = label_row["reward_peak"]
    evidence["reward_at_collapse"] = label_row["reward_at_collapse"]
    evidence["deepest_dip"] = label_row["deepest_dip"]
    evidence["deepest_dip_step"] = label_row["deepest_dip_step"]
    evidence["ctn_switches"] = runs.sql(
        "SELECT count(*) AS n FROM alerts WHERE run_id = $run_id AND kind = 'action'", {"run_id": run_id}
    ).to_pylist()[0]["n"]
    turn_level = algorithm is not None and algorithm.lower().replace("-", "_") in config.turn_level_algorithms
    cause = attribute(summary, evidence, end, collapse_step is not None, turn_level, config)
    explanation, remedy = CAUSES[cause]
    lead_time = (
        collapse_step - first_critical if collapse_step is not None and first_critical is not None else None
    )
    return Verdict(
        run_id=run_id,
        algorithm=algorithm,
        updates=label_row["updates"],
        last_step=label_row["last_step"],
        collapse_step=collapse_step,
        collapse_reason=label_row["collapse_reason"],
        first_warning=first_warning,
        first_critical=first_critical,
        lead_time=lead_time,
        root_cause=cause,
        explanation=explanation,
        evidence=evidence,
        remedy=remedy,
        top_alerts=summary[:10],
    )
