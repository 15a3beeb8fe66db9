"""The detectors' firings on one run, summarised per detector, and the streak of them that runs into a fall."""

from __future__ import annotations

import itertools
from typing import Any

from sorl_monitor.diagnose.detectors.assembly import detect_params, fired_sql, over_blocks
from sorl_monitor.diagnose.detectors.catalogue import DETECTOR_FAMILY, DIVERGING, DIVERGING_FAMILIES
from sorl_monitor.diagnose.detectors.config import DetectorConfig
from sorl_monitor.read.query import RunSet

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


def first_firing(
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


def divergence(
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


def streak_gap(label_row: dict[str, Any], config: DetectorConfig) -> float:
    """The longest gap between firings that still continues a streak: two blocks, or two logged rows of a
    sparse log."""
    spacing = label_row["last_step"] / max(label_row["updates"], 1)
    return 2 * max(config.smooth_steps, spacing)


def streak_alarm(
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
