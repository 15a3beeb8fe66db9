"""The collapse label: where a run's reward collapsed, where its fall started, and how its log ends (``COLLAPSE_SQL``).

For evaluation and for the verdict, apart from the alerts; windows in optimizer steps, on the detectors' blocks."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from sorl_monitor.diagnose.detectors.assembly import bind, block_rows_sql
from sorl_monitor.diagnose.detectors.blocks import REUSE_COLUMNS, REUSED, block_start_sql, ma_span_sql
from sorl_monitor.diagnose.detectors.catalogue import DETECTORS
from sorl_monitor.diagnose.detectors.config import DetectorConfig
from sorl_monitor.diagnose.postmortem.config import PostmortemConfig
from sorl_monitor.read.query import RunSet

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
              AS band_seg  -- (a sum, not a running count(*) FILTER, which is quadratic in DuckDB 2.0)
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
    WINDOW after_drop AS (  -- the next steps, as PRECEDING in DESC order: DuckDB 2.0 runs the same RANGE …
        PARTITION BY run_id ORDER BY step DESC  -- FOLLOWING frame far slower
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

Shares and ratios are of the reward above its floor (``floors``: 0 for a reward never negative, −1 for one within
[−1, 1], else its lowest block); ``reward_peak`` and
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


def collapse_sql_over(table: str) -> str:
    """``COLLAPSE_SQL`` reading its blocks from ``table`` (``SHARED_BLOCKS_SQL``'s rows) instead of ``steps``."""
    return LABEL_BLOCKS.format(table=table) + COLLAPSE_SQL[COLLAPSE_SQL.index(LABEL_BLOCKS_END) :]


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
