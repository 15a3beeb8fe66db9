"""Post-mortem of one run: collapse label, alert timeline, lead time, and for a collapse its root cause and remedy.

    verdict = postmortem(open_runs("runs/"), "my-run")
    verdict.status, verdict.collapse_step, verdict.lead_time, verdict.root_cause, verdict.remedy

Collapse label (for evaluation, separate from alerts; windows in optimizer steps, on the detectors' blocks): the
reward moving average over ``collapse_ma_steps`` steps (fewer early in a run, with its blocks) falls below
``collapse_fraction`` of its running peak and is not back within ``collapse_recovery_steps`` steps — or the log
ends below it at least ``collapse_min_tail_steps`` steps after the drop — or the loss turns non-finite: the
label is *confirmed* there. The collapse step is where that fall *starts* (the moving average last left its
``peak_band``). Lead time = collapse step − the first critical alert of the alert streak that runs into the
fall (no dip the run recovered from in between). Shares of the peak are taken on the reward's own scale, above
its floor: 0 for a reward that is never negative, −1 for one within [−1, 1] (a signed score), else the lowest
value the run logged (``x − floor`` ÷ ``peak − floor``; never a ratio to a negative peak).

The end of a log is evidence: a log that ends with its reward moving average below ``collapse_fraction`` of its
peak, or an ``end_detectors`` critical alert in its last ``end_blocks`` blocks, is ``collapsing``; one that ends
with ``diverging`` critical (several families above their quiet levels together), ``diverging``. A run without a
finite ``reward_mean`` in any row and no non-finite loss is ``not_judged``: the label has nothing to judge it by,
and a note names what it lacks.

Any other run is ``healthy``: no root cause, no remedy; what the detectors saw is listed as notes. For a
collapse (or a collapsing log), the root cause comes from which detector family fired first in the streak,
and evidence over the ``root_cause_steps`` steps before it (``steps`` and ``turns`` rows):

* ``reward_hacking`` — the optimized reward held while the score fell (``reward_hacking`` fired);
* ``answer_collapse`` — the answers shrank (``length_collapse`` fired) before any ratio or KL alert;
* ``echo_trap`` — reward variance died (``echo_trap`` / ``reward_std_collapse``) before any ratio, KL,
  entropy or gradient alert;
* ``entropy_blowup`` — entropy exploded (``entropy_rise``) before any ratio or KL alert: the policy turned
  random, with degenerate generations when completions grew or ran to the length limit;
* ``entropy_collapse`` — the entropy fell (``entropy_collapse`` critical, or only the entropy family fired and
  its fall came first) before any ratio or KL alert;
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
import itertools
import json
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from sorl_monitor.diagnose.detectors.assembly import (
    bind,
    block_rows_sql,
    detect_params,
    fired_sql,
    over_blocks,
)
from sorl_monitor.diagnose.detectors.blocks import REUSE_COLUMNS, REUSED, block_start_sql, ma_span_sql
from sorl_monitor.diagnose.detectors.catalogue import DETECTORS, DIVERGING, DIVERGING_FAMILIES
from sorl_monitor.diagnose.detectors.config import OLD_NAMES, DetectorConfig, config_from_mapping
from sorl_monitor.diagnose.detectors.signals import OPTIONAL_SIGNALS, SIGNALS
from sorl_monitor.read.query import QueryError, RunSet
from sorl_monitor.settings import check_settings, parse_assignments, read_toml, replace_settings


@dataclass(frozen=True)
class PostmortemConfig:
    """The collapse label's and the root cause's settings (the detectors' own: ``DetectorConfig``).

    Windows count optimizer steps; thresholds are described with the rules that use them (module docstring).
    """

    # ---- collapse label (evaluation, not an alert)
    collapse_ma_steps: int = 32
    """Reward moving average of the collapse label, over this many steps once the detectors' blocks span
    ``smooth_steps``; early in a run, in proportion to its shorter blocks (4 steps while they span one)."""
    collapse_fraction: float = 0.5
    """Collapse: the reward moving average falls below this share of its running peak…"""
    collapse_recovery_steps: int = 64
    """…and is not back above it within this many steps (or the loss turns non-finite)…"""
    collapse_min_tail_steps: int = 16
    """…or the log ends below it at least this many steps after the drop ("the log ends collapsed")."""
    collapse_min_peak: float = 0.0
    """The running peak must exceed this for a drop to count (rewards near zero are noise)."""
    peak_band: float = 0.1
    """The moving average is *at its peak* within this share of its running peak: a fall starts where it leaves
    this band for the last time before the collapse, and a dip ends where it comes back into it."""
    end_detectors: tuple[str, ...] = (
        "entropy_rise", "entropy_collapse", "length_collapse", "reward_hacking", "nonfinite"
    )  # fmt: skip
    """Critical alerts of these in the log's last ``end_blocks`` blocks mean it ends in a collapse under way (the
    policy turning random or deterministic, answers shrinking to nothing, the score falling while the optimized
    reward climbs, non-finite values); KL and length blowing up count through ``diverging``."""
    end_blocks: int = 2
    """The end of a log: its last this many blocks. A log whose reward moving average ends below
    ``collapse_fraction`` of its peak, or with an ``end_detectors`` critical alert in them, is ``collapsing`` (not yet a confirmed
    collapse); with ``diverging`` critical there and the reward still up, ``diverging``."""
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


LABEL_COLUMNS = ("reward_mean", "loss", "pg_loss", *REUSE_COLUMNS)
"""The ``steps`` columns ``COLLAPSE_SQL`` reads (besides ``run_id, step``)."""

COLLAPSE_SQL = (
    """
WITH reuse AS ({reused}),
blocks AS (
    SELECT run_id, reused, {block} AS block, max(step) AS step, min(step) AS first_step, count(*) AS rows_logged,
           avg(reward_mean) FILTER (WHERE isfinite(reward_mean)) AS reward
    FROM steps JOIN reuse USING (run_id) WHERE $run_id::VARCHAR IS NULL OR run_id = $run_id
    GROUP BY run_id, reused, block
),
floors AS (  -- the scale's floor: 0 for a reward that is never negative, -1 for one in [-1, 1], else its lowest block
    SELECT run_id, CASE WHEN min(reward) >= 0 THEN 0.0 WHEN min(reward) >= -1 AND max(reward) <= 1 THEN -1.0
                        ELSE min(reward) END AS floor
    FROM blocks GROUP BY run_id
),
smoothed AS (
    SELECT run_id, reused, block, step, first_step, rows_logged, floor,
           avg(reward - floor) OVER (PARTITION BY run_id ORDER BY block
                                     RANGE BETWEEN {ma_span} PRECEDING AND CURRENT ROW) AS reward_ma
    FROM blocks JOIN floors USING (run_id)
),
peaked AS (
    SELECT *, max(reward_ma) OVER (PARTITION BY run_id ORDER BY block ROWS UNBOUNDED PRECEDING) AS peak
    FROM smoothed
),
flagged AS (
    SELECT *, peak > $collapse_min_peak AND reward_ma < $collapse_fraction * peak AS below,
              coalesce(reward_ma >= (1 - $peak_band) * peak, false) AS in_band
    FROM peaked
),
banded AS (
    SELECT *, sum(in_band::INTEGER) OVER (PARTITION BY run_id ORDER BY block ROWS UNBOUNDED PRECEDING)
              AS band_seg  -- (a running count(*) FILTER is quadratic in DuckDB 2.0: 24 s on 250 k blocks)
    FROM flagged
),
segments AS (  -- an in-band block and the blocks out of the band after it: did they dip below?
    SELECT run_id, band_seg, bool_or(below AND NOT in_band) AS seg_dipped FROM banded GROUP BY run_id, band_seg
),
recoveries AS (  -- back in the band after a segment that dipped below collapse_fraction of the peak (an in-band
                 -- block starts a segment: the one before it is band_seg − 1; a join, not two windows)
    SELECT b.run_id, b.step FROM banded b JOIN segments s ON s.run_id = b.run_id AND s.band_seg = b.band_seg - 1
    WHERE b.in_band AND s.seg_dipped
),
held AS (
    SELECT *, coalesce(bool_or(NOT below) OVER after_drop, false) AS recovers,
              max(step) OVER (PARTITION BY run_id) AS last_step
    FROM flagged
    WINDOW after_drop AS (  -- the next steps, as PRECEDING in DESC order: DuckDB 2.0 ran the same RANGE …
        PARTITION BY run_id ORDER BY step DESC  -- FOLLOWING frame ~10× slower (2.8 s on 250 k blocks)
        RANGE BETWEEN $collapse_recovery_steps PRECEDING AND CURRENT ROW EXCLUDE CURRENT ROW)
),
reward_collapse AS (
    SELECT run_id, min(step) AS step, arg_min(peak + floor, step) AS peak, arg_min(reward_ma + floor, step) AS reward_ma,
           arg_min(peak, step) AS peak_above_floor,
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
confirmed AS (
    SELECT s.run_id, least(r.step, n.step) AS step, r.step AS reward_step, n.step AS nonfinite_step,
           r.peak, r.reward_ma, r.at_log_end, r.peak_above_floor
    FROM (SELECT DISTINCT run_id FROM blocks) s
         LEFT JOIN reward_collapse r USING (run_id) LEFT JOIN nonfinite_loss n USING (run_id)
),
comebacks AS (  -- after a confirmed reward collapse: back in the peak band of the peak it fell from
    SELECT c.run_id, min(f.step) AS step
    FROM confirmed c JOIN flagged f USING (run_id)
    WHERE c.reward_step IS NOT NULL AND f.step > c.reward_step AND f.reward_ma >= (1 - $peak_band) * c.peak_above_floor
    GROUP BY c.run_id
),
falls AS (
    SELECT c.run_id,
           max(b.step) FILTER (WHERE b.in_band AND b.step < c.step) AS last_at_peak,
           max(b.step) FILTER (WHERE b.in_band) AS last_at_peak_in_log
    FROM confirmed c JOIN banded b USING (run_id) GROUP BY c.run_id
),
fall_starts AS (
    SELECT f.run_id,
           min(b.first_step) FILTER (WHERE b.step > f.last_at_peak AND b.step <= c.step) AS fall_step,
           min(b.first_step) FILTER (WHERE b.step > f.last_at_peak_in_log) AS ending_fall_step
    FROM falls f JOIN confirmed c USING (run_id) JOIN banded b USING (run_id) GROUP BY f.run_id
),
deepest_dip AS (
    SELECT run_id, min(reward_ma / peak) AS deepest_dip, arg_min(step, reward_ma / peak) AS deepest_dip_step
    FROM peaked WHERE peak > $collapse_min_peak AND peak > 0 GROUP BY run_id
),
runs_seen AS (
    SELECT run_id, max(step) AS last_step, sum(rows_logged)::BIGINT AS updates,
           coalesce(arg_max(below, step), false) AS ends_below,
           arg_max(reward_ma / nullif(peak, 0), step) AS end_reward_share,
           arg_max(reward_ma + floor, step) AS end_reward,
           list_min(arg_max(step, block, $end_blocks)) AS end_step  -- the last blocks: a top-n, not a sort
    FROM flagged GROUP BY run_id
)
SELECT s.run_id, s.updates, s.last_step, s.ends_below, s.end_reward_share, s.end_reward, s.end_step,
       CASE WHEN c.step IS NOT NULL THEN coalesce(least(fs.fall_step, c.step), c.step) END AS collapse_step,
       c.step AS confirmed_step,
       CASE WHEN c.nonfinite_step IS NOT NULL AND (c.reward_step IS NULL OR c.nonfinite_step <= c.reward_step)
            THEN 'nonfinite_loss' WHEN c.reward_step IS NOT NULL THEN 'reward_below_peak' END AS collapse_reason,
       coalesce(c.at_log_end AND (c.nonfinite_step IS NULL OR c.reward_step < c.nonfinite_step), false)
           AS ends_collapsed,
       fs.ending_fall_step,
       (SELECT max(r.step) FROM recoveries r
        WHERE r.run_id = s.run_id AND r.step <= coalesce(least(fs.fall_step, c.step), fs.ending_fall_step, s.last_step))
           AS recovered_step,
       c.peak AS reward_peak, c.reward_ma AS reward_at_collapse,
       d.deepest_dip, d.deepest_dip_step, cb.step AS came_back_step
FROM runs_seen s LEFT JOIN confirmed c USING (run_id) LEFT JOIN fall_starts fs USING (run_id)
     LEFT JOIN deepest_dip d USING (run_id) LEFT JOIN comebacks cb USING (run_id)
ORDER BY s.run_id
""".replace("{block}", block_start_sql("step"))
    .replace("{reused}", REUSED.strip())
    .replace("{ma_span}", ma_span_sql("block", "$collapse_ma_steps"))
)
"""One row per run (windows on the detectors' blocks, ``detectors.block_start_sql``: the same run logged every step or
every 5 steps gets the same label):

* ``updates, last_step``; ``ends_below`` (the last block's reward moving average is below ``collapse_fraction``
  of its running peak), ``end_reward_share`` (that moving average ÷ the peak; ``end_reward``: the moving average
  itself, on the reward's scale), ``end_step`` (the first step of
  the log's last ``end_blocks`` blocks: "the end of the log");
* ``confirmed_step``: where the label is confirmed (the moving average over ``collapse_ma_steps`` steps is
  below ``collapse_fraction`` of its running peak and not back within ``collapse_recovery_steps``, or the log
  ends there ``collapse_min_tail_steps`` later; or the loss turns non-finite), ``collapse_reason``;
* ``collapse_step``: where that fall *starts*, the first logged step of the first block after the moving average
  was last within ``peak_band`` of its running peak (``ending_fall_step``: the same for the log's end, collapse or not);
* ``recovered_step``: the last step before the fall at which the moving average came back to its peak band
  after a dip below ``collapse_fraction`` of it (alerts before it belong to a dip the run recovered from);
* ``ends_collapsed`` (confirmed by the log's end, not by ``collapse_recovery_steps``), ``reward_peak``,
  ``reward_at_collapse``, ``deepest_dip`` (the lowest moving average ÷ running peak), ``deepest_dip_step``;
* ``came_back_step``: after a confirmed reward collapse, the first step its moving average is back within
  ``peak_band`` of the peak it fell from (a collapse the run recovered from; null otherwise).

Shares and ratios are of the reward above its floor (module docstring: ``floors``); ``reward_peak`` and
``reward_at_collapse`` are on the reward's own scale. Collapse columns are null for a run without one."""

LABEL_BLOCK_COLUMNS = ", min(step) AS first_step, count(*) AS rows_logged, sum(reward) AS reward_sum, count(reward) AS reward_rows"
"""What the collapse label needs of each detector block besides its series (``reward`` is the finite
``reward_mean``, as the label's ``avg(reward_mean) FILTER (WHERE isfinite(reward_mean))`` reads it)."""

SHARED_BLOCKS_SQL = block_rows_sql(DETECTORS, LABEL_BLOCK_COLUMNS)
"""The detectors' blocks of one run with the label's columns: computed once (``RunSet.scratch_table``), then
read by the label, the alert summary and the count of reward rows (one scan and grouping of ``steps``, not three)."""

LABEL_BLOCKS = """WITH blocks AS (  -- COLLAPSE_SQL's blocks from the detectors' (ranks merged: sums, not averages)
    SELECT run_id, reused, block, max(step) AS step, min(first_step) AS first_step,
           sum(rows_logged) AS rows_logged, sum(reward_sum) / nullif(sum(reward_rows), 0) AS reward
    FROM {table} GROUP BY run_id, reused, block
),
"""
LABEL_BLOCKS_END = "floors AS ("
"""Where ``COLLAPSE_SQL``'s own block aggregation (``reuse``, ``blocks``) ends."""

RUN_ROWS_OVER_BLOCKS = "SELECT coalesce(sum(reward_rows), 0) AS n, min(first_step) AS first_step FROM {table}"
"""``RUN_ROWS_SQL`` over ``SHARED_BLOCKS_SQL``'s table."""


def count_run_rows(runs: RunSet, run_id: str, blocks: str | None = None) -> dict[str, Any]:
    """``run_id``'s rows with a finite reward (``n``) and its first step (``RUN_ROWS_SQL``; with ``blocks``, from
    that table of ``SHARED_BLOCKS_SQL``'s rows)."""
    if blocks is None:
        return runs.sql(RUN_ROWS_SQL, {"run_id": run_id}).to_pylist()[0]
    return runs.sql(RUN_ROWS_OVER_BLOCKS.format(table=blocks)).to_pylist()[0]


def collapse_sql_over(table: str) -> str:
    """``COLLAPSE_SQL`` reading its blocks from ``table`` (``SHARED_BLOCKS_SQL``'s rows) instead of ``steps``."""
    return LABEL_BLOCKS.format(table=table) + COLLAPSE_SQL[COLLAPSE_SQL.index(LABEL_BLOCKS_END) :]


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
subquery: DuckDB then filters the scan by it, 0.06 → 0.025 s CPU on 2 M rows.)"""

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
{fired_sql},
merged AS (  -- ranks merged as detect_sql merges them: the most severe firing at a step has the largest value
    SELECT step, detector, bool_or(severity = 'critical') AS critical, max(value) AS value,
           arg_max(threshold, value) AS threshold, any_value(message) AS message
    FROM fired GROUP BY run_id, step, detector
)
SELECT detector,
       CASE WHEN bool_or(critical) THEN 'critical' ELSE 'warning' END AS severity,
       min(step) AS first_step,
       min(step) FILTER (WHERE critical) AS first_critical_step,
       min(step) FILTER (WHERE step >= $streak_from) AS streak_first_step,
       min(step) FILTER (WHERE critical AND step >= $streak_from) AS streak_critical_step,
       max(step) AS last_step,
       max(step) FILTER (WHERE critical) AS last_critical_step,
       CASE WHEN detector = 'diverging' THEN list(step ORDER BY step DESC)[1:$streak_rows] END AS recent_steps,
       list(step ORDER BY step DESC) FILTER (WHERE step <= $streak_to)[1:$streak_rows] AS steps_to_fall,
       list(step ORDER BY step DESC) FILTER (WHERE step <= $streak_to AND critical)[1:$streak_rows]
           AS criticals_to_fall,
       count(*) AS count,
       max(value) AS max_value,
       printf(any_value(message), max(value), arg_max(threshold, value), 100 * max(value),
              100 * arg_max(threshold, value)) AS message
FROM merged GROUP BY detector
ORDER BY first_critical_step NULLS LAST, first_step, detector
"""
"""The detectors' firings on one run summarised per detector, most urgent first (``{fired_sql}`` is
``detectors.fired_sql()``): aggregated inside DuckDB, so a long run's many firing rows never leave it. Ranks are
merged with a hash aggregate and the strongest firing's message is formatted once per detector (what
``detect_sql()``'s final ``SELECT`` does per row).
``streak_first_step``, ``streak_critical_step``: the first (critical) firing from ``$streak_from`` on (the end of
the last dip the run recovered from); ``recent_steps``: ``diverging``'s last ``$streak_rows`` firing steps, newest first;
``steps_to_fall``, ``criticals_to_fall``: the last ``$streak_rows`` (critical) firing steps at or before
``$streak_to`` (the fall's start), newest first."""

CAUSES: dict[str, tuple[str, str]] = {
    "granularity_mismatch": (
        "granularity mismatch: token-level importance ratios are far wider than the turn-level ratios "
        "the multi-turn reward is assigned at, so token-level clipping and IS variance explode",
        "Use turn-level importance sampling (Turn-PPO / SO-PPO: one ratio w̄_k per turn, a mean of its token ratios) "
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
    "reward_hacking": (
        "reward hacking: the reward the trainer optimizes held or climbed while the score the run is for fell "
        "(the policy found a way to earn the reward without doing the task)",
        "Fix the reward so it cannot be earned without the task (tie it to the score, cap or drop the part that "
        "climbs), keep a KL penalty to the reference policy, and resume from a checkpoint before the score fell.",
    ),
    "answer_collapse": (
        "answer collapse: the responses shrank to a small share of their length before any ratio or KL alert "
        "(the policy stopped answering: a few tokens, or the end-of-sequence token at once)",
        "Check the reward for a shortcut that short answers earn (a format or length term), add a length floor "
        "or penalty, keep an entropy bonus or KL to the reference, and resume from before the answers shrank.",
    ),
    "entropy_collapse": (
        "entropy collapse: the policy's entropy fell to a small share of its level before any ratio or KL alert "
        "(it stopped exploring; its groups then score alike)",
        "Keep exploration: an entropy bonus, a higher sampling temperature or a higher upper clip (DAPO's "
        "clip-higher), and a lower learning rate; resume from before the entropy fell.",
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

RUN_ROWS_SQL = (
    "SELECT count(*) FILTER (WHERE isfinite(reward_mean)) AS n, min(step) AS first_step FROM steps"
    " WHERE run_id = $run_id"
)
"""How many rows of the run have a reward the collapse label can use (none: the run is ``not_judged``), and its
first step (``EARLY_SQL``'s)."""
INPUTS_SQL = "SELECT {counts} FROM steps WHERE run_id = $run_id"
"""How many rows of the run carry each detector input column."""


@dataclass
class Verdict:
    """The post-mortem of one run (``to_dict()`` for JSON; docs/detectors.md lists the fields).

    ``status``: ``healthy``, ``collapsed`` (the label confirmed), ``collapsing`` (the log ends in a fall, not yet
    confirmed: ``end_signs`` say why) or ``diverging`` (the log ends with several families above their quiet
    levels, ``diverging_score``, the reward still up). ``collapse_step``: where a confirmed collapse's fall
    started (``confirmed_step``: where the label was confirmed); ``fall_step``: the same for a collapsing log.
    ``lead_time`` = the fall's start − ``streak_first_critical``, the first critical alert after the last dip the
    run recovered from. ``root_cause``/``explanation``/``remedy`` are ``None`` for a healthy or diverging run;
    ``inputs`` maps each detector family to the columns the run logs for it, ``not_evaluated`` lists the
    detectors it has no inputs for."""

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
    confirmed_step: int | None = None
    fall_step: int | None = None
    streak_first_critical: int | None = None
    judged_by: dict[str, Any] | None = None
    """For another tool's log: the column the run is judged by (``column``), ``why``, the ``optimized`` reward
    beside a task score, the ``others`` that might have been (``logs.judged``); ``None`` for the monitor's runs."""
    warned_by: dict[str, Any] | None = None
    """The alert the lead time counts from (``streak_first_critical``): ``detector``, ``step``, ``message``. The
    CLI, the dashboard and ``sorl demo`` all tell this one story."""
    last_critical_before_fall: dict[str, Any] | None = None
    """The last critical alert at or before the fall's start, in the streak or not (``detector``, ``step``,
    ``message``): what a fall with no lead was last warned by, told the same way everywhere."""
    came_back_step: int | None = None
    """For a collapse the run recovered from: the first step its reward moving average was back within
    ``peak_band`` of the peak it fell from (the status stays ``collapsed``; ``notes`` say where it ended)."""
    divergence_step: int | None = None
    diverging_score: str | None = None
    families_rising: list[str] = field(default_factory=list)
    end_signs: list[str] = field(default_factory=list)

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
    """``COLLAPSE_SQL``'s parameters: the detectors' blocks, the label's settings."""
    values = {
        **postmortem_config.to_dict(),
        "smooth_steps": config.smooth_steps,
        "smooth_growth_steps": config.smooth_growth_steps,
        "smooth_full_step": config.smooth_full_step,
        "run_id": run_id,
    }
    return bind(COLLAPSE_SQL, values)


def label_collapse(
    runs: RunSet,
    config: DetectorConfig | None = None,
    run_id: str | None = None,
    postmortem_config: PostmortemConfig | None = None,
    blocks: str | None = None,
) -> pa.Table:
    """The collapse label of every run (or of ``run_id``): see ``COLLAPSE_SQL``; with ``blocks``, over that table
    of ``SHARED_BLOCKS_SQL``'s rows (of ``run_id``, with the same ``config``)."""
    params = collapse_params(config or DetectorConfig(), postmortem_config or PostmortemConfig(), run_id)
    if blocks is None:
        return runs.sql(COLLAPSE_SQL, params)
    sql = collapse_sql_over(blocks)
    return runs.sql(sql, bind(sql, params))


STREAK_ROWS = 256
"""How many of ``diverging``'s last firings the summary keeps to find where its final streak began."""


def summarise_alerts(
    runs: RunSet,
    run_id: str,
    config: DetectorConfig | None = None,
    streak_from: int | None = None,
    streak_to: int | None = None,
    blocks: str | None = None,
) -> list[dict[str, Any]]:
    """Per detector that fired on ``run_id``: severity, first step, first critical step (and the first from
    ``streak_from`` on), last (critical) step, count, strongest firing, last firings up to ``streak_to``
    (``ALERT_SUMMARY_SQL``); with ``blocks``, over that table of ``SHARED_BLOCKS_SQL``'s rows."""
    config = config or DetectorConfig()
    sql = ALERT_SUMMARY_SQL.format(fired_sql=fired_sql())
    sql = sql if blocks is None else over_blocks(sql, blocks)
    extra = {
        "streak_from": -(2**62) if streak_from is None else streak_from,
        "streak_to": 2**62 if streak_to is None else streak_to,
        "streak_rows": STREAK_ROWS,
    }
    return runs.sql(sql, detect_params(sql, config, run_id, extra=extra)).to_pylist()


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
    during: int | None = None,
) -> str:
    """The root cause of a collapse at ``end`` (a key of ``CAUSES``) from the alerts and the evidence. Signs that
    are the fall itself rather than its precursors (the score falling under a held reward, answers shrinking,
    entropy dying) count up to ``during`` (where the collapse is confirmed; default ``end``)."""
    first = _first_of_family(summary, end)
    during = end if during is None else max(end, during)
    first_during = _first_of_family(summary, during)

    def before_all(family: str, others: tuple[str, ...]) -> bool:
        return family in first and all(first[family] < first.get(other, math.inf) for other in others)

    if _first(summary, during, critical=True) is None and not first_during:
        return "unexplained"
    if _first(summary, during, ("reward_hacking",)) is not None:
        return "reward_hacking"
    ratio_or_kl = min(first_during.get("ratio", math.inf), first_during.get("kl", math.inf))
    shrank = _first(summary, during, ("length_collapse",))
    if shrank is not None and shrank < ratio_or_kl:
        return "answer_collapse"
    if before_all("reward_variance", ("ratio", "kl", "entropy", "gradient", "blowup")):
        return "echo_trap"
    entropy_fell = _first(summary, during, ("entropy_collapse",), critical=True)
    if entropy_fell is not None and entropy_fell < ratio_or_kl:
        return "entropy_collapse"
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
        rose = _first(summary, end, ("entropy_rise",))
        fell = _first(summary, end, ("entropy_collapse",))
        return "entropy_collapse" if fell is not None and (rose is None or fell < rose) else "entropy_blowup"
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
    if dip is not None and dip < config.collapse_fraction:
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


STATUSES = ("healthy", "collapsed", "collapsing", "diverging")
"""What a verdict's ``status`` can be (docs/detectors.md; ``sorl postmortem`` exits 0, 3, 4, 5 on them)."""


def _end_signs(
    label_row: dict[str, Any], summary: list[dict[str, Any]], settings: PostmortemConfig
) -> list[str]:
    """Why a log ends in a fall: its reward moving average far below its peak, ``end_detectors`` critical in its
    last ``end_blocks`` blocks."""
    signs = []
    if label_row["ends_below"]:
        share = label_row["end_reward_share"]
        signs.append(
            f"the reward moving average ends at {share:.0%} of its running peak"
            if share is not None
            else "the reward moving average ends below half its running peak"
        )
    end = label_row["end_step"]
    signs += [
        f"{row['detector']} critical at the end ({row['message']})"
        for row in summary
        if row["detector"] in settings.end_detectors and row["last_critical_step"] is not None
        and end is not None and row["last_critical_step"] >= end
    ]  # fmt: skip
    return signs


def _divergence(
    summary: list[dict[str, Any]],
    label_row: dict[str, Any],
    inputs: dict[str, list[str]],
    config: DetectorConfig,
) -> tuple[int | None, str | None, list[str], bool]:
    """``diverging``'s final streak: where it began, the score ("4 of 6 families rising since step 63"), the
    families above their quiet levels at the log's end, and whether it is critical there."""
    row = next((r for r in summary if r["detector"] == DIVERGING.name), None)
    end = label_row["end_step"]
    if row is None or end is None or row["last_step"] < end:
        return None, None, [], False
    steps = row["recent_steps"] or []
    spacing = max(1.0, label_row["last_step"] / max(label_row["updates"], 1))
    since = steps[0]
    for newer, older in itertools.pairwise(steps):
        if newer - older > 2 * max(config.smooth_steps, spacing):
            break
        since = older
    rising = sorted(
        {DETECTOR_FAMILY[r["detector"]] for r in summary if r["last_step"] >= end} & set(DIVERGING_FAMILIES),
        key=DIVERGING_FAMILIES.index,
    )
    logged = [f for f in DIVERGING_FAMILIES if inputs.get(f)]
    score = f"{len(rising)} of {len(logged)} families rising since step {since} ({', '.join(rising)})"
    critical = row["last_critical_step"] is not None and row["last_critical_step"] >= end
    runaway = next((r for r in summary if r["detector"] == "kl_runaway"), None)
    if (
        runaway is not None
        and runaway["last_critical_step"] is not None
        and runaway["last_critical_step"] >= end
    ):
        critical = (
            True  # the reference drift accelerating with the lengths: diverging, with fewer families up
        )
    return since, score, rising, critical


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
    judged_by = _config(info).get("judged")
    shared = detect_params(SHARED_BLOCKS_SQL, config, run_id)
    with runs.scratch_table(SHARED_BLOCKS_SQL, shared) as blocks:  # one block aggregation for all three
        label = label_collapse(runs, config, run_id, settings, blocks=blocks).to_pylist()
        if not label:
            raise QueryError(f"run {run_id!r} has no steps logged yet")
        label_row = label[0]
        fall_guess = (
            label_row["collapse_step"]
            if label_row["collapse_step"] is not None
            else label_row["ending_fall_step"]
        )
        summary = summarise_alerts(
            runs, run_id, config, label_row["recovered_step"], fall_guess, blocks=blocks
        )
        collapse_step = label_row["collapse_step"]
        run_rows = count_run_rows(runs, run_id, blocks)
        judged = collapse_step is not None or run_rows["n"] > 0
    inputs, not_evaluated = run_inputs(runs, run_id)
    end_signs = [] if collapse_step is not None else _end_signs(label_row, summary, settings)
    divergence_step, diverging_score, rising, diverging_at_end = _divergence(
        summary, label_row, inputs, config
    )
    if collapse_step is not None:
        status = "collapsed"
    elif end_signs:
        status = "collapsing"
    elif diverging_at_end:
        status = "diverging"
    elif not judged:
        status = "not_judged"
    else:
        status = "healthy"
    fall_step = collapse_step if collapse_step is not None else (
        label_row["ending_fall_step"] if status == "collapsing" else None
    )  # fmt: skip
    end = fall_step if fall_step is not None else label_row["last_step"]
    evidence = gather_evidence(
        runs, run_id, max(0, end - settings.root_cause_steps), end, settings, run_rows["first_step"]
    )
    for key in ("reward_peak", "reward_at_collapse", "deepest_dip", "deepest_dip_step", "end_reward_share"):
        evidence[key] = label_row[key]
    evidence["ctn_switches"] = runs.sql(
        "SELECT count(*) AS n FROM alerts WHERE run_id = $run_id AND kind = 'action'", {"run_id": run_id}
    ).to_pylist()[0]["n"]
    first_critical = _first(summary, None, critical=True)
    cause = explanation = remedy = None
    notes: list[str] = []
    if status == "collapsed" and label_row["came_back_step"] is not None:
        ended = label_row["end_reward"]
        fell_from = label_row["reward_peak"]
        notes.append(
            f"recovered: back within {settings.peak_band:.0%} of the peak it fell from ({fell_from:.3g}) from step "
            f"{label_row['came_back_step']}, ending at {ended:.3g} (came_back_step)"
        )
    if status in ("collapsed", "collapsing"):
        turn_level = (
            algorithm is not None and algorithm.lower().replace("-", "_") in settings.turn_level_algorithms
        )
        streak = [
            {
                **row,
                "first_step": row["streak_first_step"],
                "first_critical_step": row["streak_critical_step"],
            }
            for row in summary
            if row["streak_first_step"] is not None
        ]  # the alerts of the streak that runs into the fall, not of a dip the run recovered from
        cause = attribute(streak, evidence, end if status == "collapsed" else label_row["last_step"],
                          turn_level, settings, during=label_row["confirmed_step"] or label_row["last_step"])  # fmt: skip
        explanation = CAUSES[cause][0]
        remedy = remedy_for(cause, trainer_family(algorithm, _config(info)))
        if label_row["ends_collapsed"]:
            notes.append(
                f"the log ends collapsed, {label_row['last_step'] - label_row['confirmed_step']} steps after"
                " the label was confirmed"
            )
        if status == "collapsing":
            notes.append("the log ends in a fall, too soon to confirm a collapse: " + "; ".join(end_signs))
        if cause == "entropy_blowup":
            notes.append(_degeneration(evidence, settings))
        if cause == "unexplained" and not_evaluated:
            notes.append(f"this run logs no input for {', '.join(not_evaluated)}")
    else:
        notes = _notes(summary, evidence, label_row["ends_below"], settings)
        if not judged:
            candidates = (judged_by or {}).get("candidates")
            named = (
                f"; columns it does log: {', '.join(candidates)} (--map reward=NAME)" if candidates else ""
            )
            notes.insert(
                0, f"not judged: no row has a reward (reward_mean), which the collapse label needs{named}"
            )
        share, falling = label_row["end_reward_share"], label_row["ending_fall_step"]
        if falling is not None and share is not None:
            notes.append(
                f"the log ends with the reward moving average at {share:.0%} of its running peak, out of its peak"
                f" band since step {falling}: not yet low enough to call it collapsing"
            )
    if diverging_score is not None:
        notes.append(f"diverging: {diverging_score}")
    streak_alarm = _streak_alarm(summary, label_row["recovered_step"], fall_step, _gap(label_row, config))
    lead_time = fall_step - streak_alarm if streak_alarm is not None and fall_step is not None else None
    warned_by = next(
        (
            {"detector": row["detector"], "step": streak_alarm, "message": row["message"]}
            for row in summary
            if streak_alarm is not None and streak_alarm in (row["criticals_to_fall"] or [])
        ),
        None,
    )
    before_fall = max(
        (
            {"detector": row["detector"], "step": row["criticals_to_fall"][0], "message": row["message"]}
            for row in summary
            if fall_step is not None and row["criticals_to_fall"]
        ),
        key=lambda alert: alert["step"],
        default=None,
    )
    return Verdict(
        run_id=run_id,
        algorithm=algorithm,
        updates=label_row["updates"],
        last_step=label_row["last_step"],
        status=status,
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
        top_alerts=[
            {k: v for k, v in row.items() if k not in ("recent_steps", "steps_to_fall", "criticals_to_fall")}
            for row in summary[:10]
        ],
        confirmed_step=label_row["confirmed_step"],
        fall_step=fall_step,
        streak_first_critical=streak_alarm,
        divergence_step=divergence_step,
        diverging_score=diverging_score,
        families_rising=rising,
        end_signs=end_signs,
        came_back_step=label_row["came_back_step"] if status == "collapsed" else None,
        warned_by=warned_by,
        last_critical_before_fall=before_fall,
        judged_by=judged_by if isinstance(judged_by, dict) else None,
    )


def _gap(label_row: dict[str, Any], config: DetectorConfig) -> float:
    """The longest gap between firings that still continues a streak: two blocks, or two logged rows of a
    sparse log."""
    spacing = label_row["last_step"] / max(label_row["updates"], 1)
    return 2 * max(config.smooth_steps, spacing)


def _streak_alarm(
    summary: list[dict[str, Any]], recovered: int | None, fall: int | None, gap: float
) -> int | None:
    """The first critical alert of the streak that runs into the fall: firings (any detector, any severity) no
    more than ``gap`` apart, the last of them within ``gap`` of ``fall``, none before the last dip the run
    recovered from (``recovered``); the first critical one among them."""
    if fall is None:
        return None
    fired = sorted({step for row in summary for step in (row["steps_to_fall"] or [])}, reverse=True)
    start = None
    for step in fired:
        if (start if start is not None else fall) - step > gap or (
            recovered is not None and step < recovered
        ):
            break
        start = step
    if start is None:
        return None
    criticals = [
        step for row in summary for step in (row["criticals_to_fall"] or []) if start <= step <= fall
    ]
    return min(criticals, default=None)
