"""Post-mortem of one run: collapse label, alert timeline, lead time, and for a collapse its root cause and remedy.

    verdict = postmortem(open_runs("runs/"), "my-run")
    verdict.status, verdict.collapse_step, verdict.lead_time, verdict.root_cause, verdict.remedy

Collapse label (for evaluation, separate from alerts; windows in optimizer steps): the reward moving
average over ``collapse_ma_steps`` steps falls below ``collapse_fraction`` of its running peak and is
not back within ``collapse_recovery_steps`` steps — or the log ends below it at least
``collapse_min_tail_steps`` steps after the drop ("the log ends collapsed") — or the loss turns
non-finite. Lead time = collapse step − the first critical alert at or before it, in steps.

A run that did not collapse is ``healthy``: no root cause, no remedy; what the detectors saw is listed
as notes. A run without a finite ``reward_mean`` in any row and no non-finite loss is ``not_judged``: the
label has nothing to judge it by, and a note names what it lacks. For a collapse, the root cause comes
from which detector family fired first up to the collapse, and evidence over the ``root_cause_steps``
steps before it (``steps`` and ``turns`` rows):

* ``echo_trap`` — reward variance died (``echo_trap`` / ``reward_std_collapse``) before any ratio, KL,
  entropy or gradient alert;
* ``entropy_blowup`` — entropy exploded (``entropy_rise``) before any ratio or KL alert: the policy turned
  random, with degenerate generations when completions grew or ran to the length limit;
* ``granularity_mismatch`` — token-level IS in a multi-turn run whose token-ratio tails are far
  wider than its turn ratios (token clip fraction ≥ ``mismatch_clip_ratio`` × turn clip fraction, or
  log-p99 tails ≥ ``mismatch_tail_ratio`` × as wide);
* ``off_policy_variance`` — clip fraction grows with the policy lag (the rollout's reuse) by at least
  ``off_policy_min_slope`` per update of lag, and ``off_policy_growth`` × as fast as at the run's start;
  or, with rollouts at least ``off_policy_min_lag`` updates old, the clip fraction has grown to
  ``off_policy_clip_growth`` × its level over the run's first ``root_cause_steps`` steps;
* ``optimisation_blowup`` — grad-norm spikes, non-finite values, or ratio / KL alerts with none of the above;
* ``unexplained`` — a collapse no detector saw; the verdict names the inputs the run lacked.

The names above are fields of ``PostmortemConfig``; the detectors' are ``DetectorConfig``'s. ``load_configs``
reads both from one TOML file and ``--set name=value`` overrides, as the CLI and the dashboard do.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from sorl_monitor.detectors import (
    DETECTORS,
    OLD_NAMES,
    SIGNALS,
    DetectorConfig,
    bind,
    config_from_mapping,
    detect_params,
    detect_sql,
)
from sorl_monitor.query import QueryError, RunSet
from sorl_monitor.settings import check_settings, parse_assignments, read_toml, replace_settings


@dataclass(frozen=True)
class PostmortemConfig:
    """The collapse label's and the root cause's settings (the detectors' own: ``DetectorConfig``).

    Windows count optimizer steps; thresholds are described with the rules that use them (module docstring).
    """

    # ---- collapse label (evaluation, not an alert)
    collapse_ma_steps: int = 32
    """Reward moving average of the collapse label, in steps."""
    collapse_fraction: float = 0.5
    """Collapse: the reward moving average falls below this share of its running peak…"""
    collapse_recovery_steps: int = 64
    """…and is not back above it within this many steps (or the loss turns non-finite)…"""
    collapse_min_tail_steps: int = 16
    """…or the log ends below it at least this many steps after the drop ("the log ends collapsed")."""
    collapse_min_peak: float = 0.0
    """The running peak must exceed this for a drop to count (rewards near zero are noise)."""

    # ---- root cause
    root_cause_steps: int = 128
    """The post-mortem's evidence window: this many steps up to the collapse (or the run's end)."""
    turn_ratio_eps: float = 0.2
    """ε of the post-mortem's turn-tail evidence: share of turns with |w̄_k − 1| > ε."""
    mismatch_clip_ratio: float = 2.0
    """Granularity mismatch: token clip fraction at least this many times the turn clip fraction…"""
    mismatch_min_clip: float = 0.1
    """…and at least this high (a tenth of the tokens outside the trust region)…"""
    mismatch_tail_ratio: float = 2.0
    """…or token-ratio tail (log p99) at least this many times as wide as the turn-ratio tail."""
    off_policy_min_slope: float = 0.02
    """Off-policy variance: clip fraction grows by at least this per update of policy lag in the window…"""
    off_policy_growth: float = 2.0
    """…and at least this many times as fast as over the run's first root_cause_steps steps."""
    off_policy_min_lag: int = 8
    """Or stale / reused rollouts (the behaviour policy at least this many updates old in the window)…"""
    off_policy_clip_growth: float = 1.5
    """…whose token clip fraction grew to this many times its level over the run's first root_cause_steps steps."""
    degenerate_length_rise: float = 1.25
    """Entropy blow-up with degenerate generations: completions grew to this many times their early length…"""
    degenerate_truncation: float = 0.5
    """…or at least this share of them hits the length limit."""
    turn_level_algorithms: tuple[str, ...] = ("turn_ppo", "st_ppo", "so_ppo", "so_grpo")
    """Algorithms that already use turn-level IS: granularity mismatch is not blamed on them."""

    def __post_init__(self) -> None:
        check_settings(self, "post-mortem setting")

    def replace(self, **changes: Any) -> PostmortemConfig:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def load_configs(
    toml_path: str | Path | None = None, overrides: Iterable[str] = ()
) -> tuple[DetectorConfig, PostmortemConfig]:
    """The detectors' and the post-mortem's settings: defaults, then the TOML file (top level or a
    ``[detectors]`` table), then ``name=value``s; each name goes to the dataclass that has it."""
    detectors, settings = DetectorConfig(), PostmortemConfig()
    own = PostmortemConfig.__dataclass_fields__
    known = sorted({*DetectorConfig.__dataclass_fields__, *own})
    for values in (
        _without_log_tables(read_toml(toml_path, "detectors")) if toml_path is not None else {},
        parse_assignments(overrides),
    ):
        unknown = sorted(set(values) - set(known) - set(OLD_NAMES))
        if unknown:
            raise ValueError(f"unknown detector setting {unknown[0]!r}; known settings: {', '.join(known)}")
        detectors = config_from_mapping({k: v for k, v in values.items() if k not in own}, detectors)
        settings = replace_settings(
            settings, {k: v for k, v in values.items() if k in own}, "post-mortem setting"
        )
    return detectors, settings


def _without_log_tables(values: dict) -> dict:
    """A config's top level less the tables the log readers take (``[map]``, ``[logs]``: ``logs.options``)."""
    return {k: v for k, v in values.items() if k not in ("map", "logs")}


COLLAPSE_SQL = """
WITH blocks AS (
    SELECT run_id, step // $smooth_steps AS block, max(step) AS step, count(*) AS rows_logged,
           avg(reward_mean) FILTER (WHERE isfinite(reward_mean)) AS reward
    FROM steps WHERE $run_id::VARCHAR IS NULL OR run_id = $run_id
    GROUP BY run_id, block
),
smoothed AS (
    SELECT run_id, block, step, rows_logged,
           avg(reward) OVER (PARTITION BY run_id ORDER BY block
                             RANGE BETWEEN $collapse_ma_blocks - 1 PRECEDING AND CURRENT ROW) AS reward_ma
    FROM blocks
),
peaked AS (
    SELECT *, max(reward_ma) OVER (PARTITION BY run_id ORDER BY block ROWS UNBOUNDED PRECEDING) AS peak
    FROM smoothed
),
flagged AS (
    SELECT *, peak > $collapse_min_peak AND reward_ma < $collapse_fraction * peak AS below FROM peaked
),
held AS (
    SELECT *, coalesce(bool_or(NOT below) OVER after_drop, false) AS recovers,
              max(step) OVER (PARTITION BY run_id) AS last_step
    FROM flagged
    WINDOW after_drop AS (PARTITION BY run_id ORDER BY step
                          RANGE BETWEEN CURRENT ROW AND $collapse_recovery_steps FOLLOWING EXCLUDE CURRENT ROW)
),
reward_collapse AS (
    SELECT run_id, min(step) AS step, arg_min(peak, step) AS peak, arg_min(reward_ma, step) AS reward_ma,
           arg_min(step + $collapse_recovery_steps > last_step, step) AS at_log_end
    FROM held
    WHERE below AND NOT recovers
          AND (step + $collapse_recovery_steps <= last_step OR last_step - step >= $collapse_min_tail_steps)
    GROUP BY run_id
),
nonfinite_loss AS (
    SELECT run_id, min(step) AS step FROM steps
    WHERE ($run_id::VARCHAR IS NULL OR run_id = $run_id) AND NOT isfinite(coalesce(loss, pg_loss))
    GROUP BY run_id
),
deepest_dip AS (
    SELECT run_id, min(reward_ma / peak) AS deepest_dip, arg_min(step, reward_ma / peak) AS deepest_dip_step
    FROM peaked WHERE peak > $collapse_min_peak AND peak > 0 GROUP BY run_id
),
runs_seen AS (
    SELECT run_id, max(step) AS last_step, sum(rows_logged)::BIGINT AS updates,
           coalesce(arg_max(below, step), false) AS ends_below
    FROM flagged GROUP BY run_id
)
SELECT s.run_id, s.updates, s.last_step, s.ends_below,
       least(r.step, n.step) AS collapse_step,
       CASE WHEN n.step IS NOT NULL AND (r.step IS NULL OR n.step <= r.step) THEN 'nonfinite_loss'
            WHEN r.step IS NOT NULL THEN 'reward_below_peak' END AS collapse_reason,
       coalesce(r.at_log_end AND (n.step IS NULL OR r.step < n.step), false) AS ends_collapsed,
       r.peak AS reward_peak, r.reward_ma AS reward_at_collapse,
       d.deepest_dip, d.deepest_dip_step
FROM runs_seen s LEFT JOIN reward_collapse r USING (run_id) LEFT JOIN nonfinite_loss n USING (run_id)
     LEFT JOIN deepest_dip d USING (run_id)
ORDER BY s.run_id
"""
"""One row per run: ``run_id, updates, last_step, ends_below`` (its last block's reward moving average is below
``collapse_fraction`` of the peak, collapse or not), ``collapse_step, collapse_reason, ends_collapsed, reward_peak,
reward_at_collapse`` (collapse columns null for a run without collapse; ``ends_collapsed``: the drop came
less than ``collapse_recovery_steps`` before the log's end, which it reaches still below), and
``deepest_dip``, the lowest ``reward_ma / running peak`` of the run (1 = never below its peak; below
``collapse_fraction`` = a dip as deep as a collapse, recovered from or not), at ``deepest_dip_step``.
Windows are in steps: rewards are averaged per block of ``smooth_steps`` steps (the detectors' blocks), the
moving average spans ``collapse_ma_steps`` of them, and a collapse is reported at its block's last logged
step; the same run logged every step or every 5 steps gets the same label."""

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
FROM steps WHERE run_id = $run_id AND step < (SELECT min(step) FROM steps WHERE run_id = $run_id) + $root_cause_steps
"""
"""The run's first ``root_cause_steps`` steps (the healthy reference): how fast clip fraction grows with
policy lag, its level, the entropy and the response length."""

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
    "entropy_blowup": (
        "entropy blow-up: the policy's entropy exploded before any ratio or KL alert (the note on "
        "completion lengths says whether the generations degenerated)",
        "Lower the learning rate, keep a KL penalty to the reference policy (or raise it), lower the "
        "sampling temperature, and resume from a checkpoint before the entropy rose.",
    ),
    "optimisation_blowup": (
        "optimisation blow-up: gradient-norm spikes, non-finite values or ratio / KL alerts without a "
        "token/turn, off-policy, entropy or reward-variance signature",
        "Lower the learning rate (and tighten gradient clipping).",
    ),
    "unexplained": (
        "collapse without a preceding critical alert: no detector saw it coming",
        "Inspect the run's curves (sorl report); log the missing inputs listed below so more detectors can run.",
    ),
}
"""Each root cause of a collapse: what it means, and the remedy (the paper's, arXiv 2511.20718, where it
has one)."""

TRAINER_SWITCHES = {
    "trl": "TRL: use `SORLGRPOTrainer(..., ctn='auto')` with `SORLGRPOConfig(loss_type='so_grpo')` "
    "(sorl_monitor.integrations.trl_so_grpo).",
    "verl": "verl: call `register_sorl_loss()` (sorl_monitor.integrations.verl_so_ppo) in each worker and set "
    "`actor.policy_loss.loss_mode=so_ppo` (so_grpo with GRPO advantages).",
}
"""The switch that applies the remedy in the trainer a run came from (turn-level IS and auto-CTN as a loss)."""
SWITCHED_CAUSES = ("granularity_mismatch", "off_policy_variance")
"""The root causes whose remedy is turn-level IS and CTN."""


def trainer_family(algorithm: str | None, config: dict[str, Any]) -> str | None:
    """``bundled`` | ``trl`` | ``verl`` | None: the trainer a run came from, by its config's keys (the bundled
    ``TrainConfig``'s ``warmstart_steps``; TRL's ``num_generations``; verl's actor ``ppo_mini_batch_size``) or
    its algorithm (``verl``)."""
    if "warmstart_steps" in config:
        return "bundled"
    if algorithm == "verl" or "ppo_mini_batch_size" in config or "clip_ratio_c" in config:
        return "verl"
    if "num_generations" in config or (
        "per_device_train_batch_size" in config and (algorithm or "").endswith("grpo")
    ):
        return "trl"
    return None


def remedy_for(cause: str, family: str | None) -> str:
    """``cause``'s remedy, with the switch of the run's trainer (``TRAINER_SWITCHES``) where one applies."""
    remedy = CAUSES[cause][1]
    switch = TRAINER_SWITCHES.get(family or "") if cause in SWITCHED_CAUSES else None
    return remedy if switch is None else f"{remedy} {switch}"


DETECTOR_FAMILY = {d.name: d.family for d in DETECTORS}

REWARD_ROWS_SQL = (
    "SELECT count(*) FILTER (WHERE isfinite(reward_mean)) AS n FROM steps WHERE run_id = $run_id"
)
"""How many rows of the run have a reward the collapse label can use (none: the run is ``not_judged``)."""
INPUTS_SQL = "SELECT {counts} FROM steps WHERE run_id = $run_id"
"""How many rows of the run carry each detector input column."""


@dataclass
class Verdict:
    """The post-mortem of one run (``to_dict()`` for JSON). ``root_cause``/``explanation``/``remedy`` are
    ``None`` for a healthy run; ``inputs`` maps each detector family to the columns the run logs for it,
    ``not_evaluated`` lists the detectors it has no inputs for."""

    run_id: str
    algorithm: str | None
    updates: int
    last_step: int | None
    status: str
    collapse_step: int | None
    collapse_reason: str | None
    ends_collapsed: bool
    first_warning: int | None
    first_critical: int | None
    lead_time: int | None
    root_cause: str | None
    explanation: str | None
    remedy: str | None
    evidence: dict[str, Any]
    notes: list[str] = field(default_factory=list)
    inputs: dict[str, list[str]] = field(default_factory=dict)
    not_evaluated: list[str] = field(default_factory=list)
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


def collapse_params(
    config: DetectorConfig, postmortem_config: PostmortemConfig, run_id: str | None = None
) -> dict[str, Any]:
    """``COLLAPSE_SQL``'s parameters: the detectors' blocks (``smooth_steps``), the label's settings."""
    values = {
        **postmortem_config.to_dict(),
        "smooth_steps": config.smooth_steps,
        "collapse_ma_blocks": max(1, postmortem_config.collapse_ma_steps // config.smooth_steps),
        "run_id": run_id,
    }
    return bind(COLLAPSE_SQL, values)


def label_collapse(
    runs: RunSet,
    config: DetectorConfig | None = None,
    run_id: str | None = None,
    postmortem_config: PostmortemConfig | None = None,
) -> pa.Table:
    """The collapse label of every run (or of ``run_id``): see ``COLLAPSE_SQL``."""
    params = collapse_params(config or DetectorConfig(), postmortem_config or PostmortemConfig(), run_id)
    return runs.sql(COLLAPSE_SQL, params)


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
    runs: RunSet, run_id: str, start: int, end: int, config: PostmortemConfig
) -> dict[str, Any]:
    """Evidence numbers over ``[start, end]``: token vs turn tails, growth with policy lag, CTN share."""
    params = {"run_id": run_id, "start": start, "end": end}
    evidence: dict[str, Any] = {"window_start": start, "window_end": end}
    evidence.update(runs.sql(STEP_EVIDENCE_SQL, params).to_pylist()[0])
    evidence.update(
        runs.sql(EARLY_SQL, {"run_id": run_id, "root_cause_steps": config.root_cause_steps}).to_pylist()[0]
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
    evidence["entropy_growth"] = _ratio(evidence["entropy_max"], evidence["entropy_early"])
    evidence["length_growth"] = _ratio(evidence["length_mean"], evidence["length_early"])
    return evidence


def _at_least(value: float | None, threshold: float) -> bool:
    return value is not None and math.isfinite(value) and value >= threshold


def _first_of_family(summary: list[dict[str, Any]], end: int | None) -> dict[str, int]:
    """Per detector family, the first step ``≤ end`` at which any of its detectors fired."""
    first: dict[str, int] = {}
    for row in summary:
        family, step = DETECTOR_FAMILY[row["detector"]], row["first_step"]
        if step is not None and (end is None or step <= end):
            first[family] = min(step, first.get(family, step))
    return first


def attribute(
    summary: list[dict[str, Any]],
    evidence: dict[str, Any],
    end: int,
    turn_level: bool,
    config: PostmortemConfig,
) -> str:
    """The root cause of a collapse at ``end`` (a key of ``CAUSES``) from the alerts and the evidence."""
    first = _first_of_family(summary, end)

    def before_all(family: str, others: tuple[str, ...]) -> bool:
        return family in first and all(first[family] < first.get(other, math.inf) for other in others)

    if _first(summary, end, critical=True) is None and not first:
        return "unexplained"
    if before_all("reward_variance", ("ratio", "kl", "entropy", "gradient", "blowup")):
        return "echo_trap"
    entropy_critical = _first(summary, end, ("entropy_rise",), critical=True)
    if entropy_critical is not None and entropy_critical < min(
        first.get("ratio", math.inf), first.get("kl", math.inf)
    ):
        return "entropy_blowup"
    if "ratio" in first or "kl" in first:
        token_clip = evidence.get("token_clip_frac")
        mismatch = not turn_level and (
            (
                _at_least(evidence.get("token_turn_clip_ratio"), config.mismatch_clip_ratio)
                and _at_least(token_clip, config.mismatch_min_clip)
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
    if "gradient" in first or "blowup" in first:
        return "optimisation_blowup"
    if "entropy" in first:
        return "entropy_blowup"
    return "unexplained"


def _run_info(runs: RunSet, run_id: str) -> dict[str, Any]:
    rows = runs.sql(
        "SELECT algorithm, config FROM runs WHERE run_id = $run_id", {"run_id": run_id}
    ).to_pylist()
    if not rows:
        known = [r["run_id"] for r in runs.sql("SELECT run_id FROM runs ORDER BY run_id").to_pylist()]
        raise QueryError(f"no run {run_id!r} here (runs: {', '.join(known[:8])})")
    return rows[0]


def _config(info: dict[str, Any]) -> dict[str, Any]:
    try:
        config = json.loads(info.get("config") or "{}")
    except ValueError:
        return {}
    return config if isinstance(config, dict) else {}


def run_inputs(runs: RunSet, run_id: str) -> tuple[dict[str, list[str]], list[str]]:
    """Per detector family, the input columns ``run_id`` logs; and the detectors it has no input for."""
    columns = sorted({c for d in DETECTORS for c in d.columns})
    counts = runs.sql(
        INPUTS_SQL.format(counts=", ".join(f'count("{c}") AS "{c}"' for c in columns)), {"run_id": run_id}
    ).to_pylist()[0]
    present = {c for c, n in counts.items() if n}
    families: dict[str, list[str]] = {}
    for detector in DETECTORS:
        families.setdefault(detector.family, [])
        families[detector.family] += [
            c for c in detector.columns if c in present and c not in families[detector.family]
        ]
    missing = [d.name for d in DETECTORS if any(not present & set(SIGNALS[s].columns) for s in d.signals)]
    return families, missing


def _notes(
    summary: list[dict[str, Any]], evidence: dict[str, Any], ends_below: bool, config: PostmortemConfig
) -> list[str]:
    """What a healthy run showed: its critical alerts, and a deep dip it came back from or its log ends in."""
    notes = [
        f"{row['detector']} critical from step {row['first_critical_step']} ({row['message']})"
        for row in summary
        if row["first_critical_step"] is not None
    ]
    dip = evidence.get("deepest_dip")
    if ends_below:
        notes.append(
            "the log ends with the reward moving average below half its running peak, too recently to call a "
            f"collapse (it needs {config.collapse_min_tail_steps} steps below)"
        )
    elif dip is not None and dip < config.collapse_fraction:
        notes.append(
            f"the reward moving average dipped to {dip:.0%} of its running peak at step "
            f"{evidence.get('deepest_dip_step')} and recovered"
        )
    return notes


def _degeneration(evidence: dict[str, Any], config: PostmortemConfig) -> str:
    """Whether the generations degenerated as the entropy blew up, from the length evidence."""
    growth, truncated = evidence.get("length_growth"), evidence.get("truncated_share_max")
    if growth is None and truncated is None:
        return "the run logs no completion length, so degenerate generations could not be checked"
    seen = []
    if _at_least(growth, config.degenerate_length_rise):
        seen.append(f"completions grew to {growth:.2g}× their early length")
    elif growth is not None and 0 < growth <= 1 / config.degenerate_length_rise:
        seen.append(f"completions shrank to {growth:.2g}× their early length")
    if _at_least(truncated, config.degenerate_truncation):
        seen.append(f"up to {truncated:.0%} of them hit the length limit")
    return (
        "degenerate generations: " + "; ".join(seen)
        if seen
        else "completion lengths stayed near their early level"
    )


def postmortem(
    runs: RunSet,
    run_id: str,
    config: DetectorConfig | None = None,
    postmortem_config: PostmortemConfig | None = None,
) -> Verdict:
    """Label, time, and (for a collapse) explain one run (see module docstring) with the detectors' ``config``
    and the post-mortem's own settings."""
    config = config or DetectorConfig()
    settings = postmortem_config or PostmortemConfig()
    info = _run_info(runs, run_id)
    algorithm = info["algorithm"]
    label = label_collapse(runs, config, run_id, settings).to_pylist()
    if not label:
        raise QueryError(f"run {run_id!r} has no steps logged yet")
    label_row = label[0]
    summary = summarise_alerts(runs, run_id, config)
    collapse_step = label_row["collapse_step"]
    end = collapse_step if collapse_step is not None else label_row["last_step"]
    evidence = gather_evidence(runs, run_id, max(0, end - settings.root_cause_steps), end, settings)
    for key in ("reward_peak", "reward_at_collapse", "deepest_dip", "deepest_dip_step"):
        evidence[key] = label_row[key]
    evidence["ctn_switches"] = runs.sql(
        "SELECT count(*) AS n FROM alerts WHERE run_id = $run_id AND kind = 'action'", {"run_id": run_id}
    ).to_pylist()[0]["n"]
    inputs, not_evaluated = run_inputs(runs, run_id)
    first_critical = _first(summary, None, critical=True)
    judged = (
        collapse_step is not None or runs.sql(REWARD_ROWS_SQL, {"run_id": run_id}).to_pylist()[0]["n"] > 0
    )
    if collapse_step is None:
        cause = explanation = remedy = None
        notes = _notes(summary, evidence, label_row["ends_below"], settings)
        if not judged:
            notes.insert(0, "not judged: no row has a reward (reward_mean), which the collapse label needs")
    else:
        turn_level = (
            algorithm is not None and algorithm.lower().replace("-", "_") in settings.turn_level_algorithms
        )
        cause = attribute(summary, evidence, collapse_step, turn_level, settings)
        explanation = CAUSES[cause][0]
        remedy = remedy_for(cause, trainer_family(algorithm, _config(info)))
        notes = []
        if label_row["ends_collapsed"]:
            notes.append(
                f"the log ends collapsed, {label_row['last_step'] - collapse_step} steps after the drop"
            )
        if cause == "entropy_blowup":
            notes.append(_degeneration(evidence, settings))
        if cause == "unexplained" and not_evaluated:
            notes.append(f"this run logs no input for {', '.join(not_evaluated)}")
    alarm = _first(summary, collapse_step, critical=True) if collapse_step is not None else None
    lead_time = collapse_step - alarm if alarm is not None else None
    return Verdict(
        run_id=run_id,
        algorithm=algorithm,
        updates=label_row["updates"],
        last_step=label_row["last_step"],
        status="collapsed" if collapse_step is not None else "healthy" if judged else "not_judged",
        collapse_step=collapse_step,
        collapse_reason=label_row["collapse_reason"],
        ends_collapsed=bool(label_row["ends_collapsed"]),
        first_warning=_first(summary, None),
        first_critical=first_critical,
        lead_time=lead_time,
        root_cause=cause,
        explanation=explanation,
        remedy=remedy,
        evidence=evidence,
        notes=notes,
        inputs=inputs,
        not_evaluated=not_evaluated,
        top_alerts=summary[:10],
    )
