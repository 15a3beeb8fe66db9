"""The one place detector SQL is put together: the selected detectors as one query over ``steps``, its
parameters, and the pieces of it other queries reuse (the firings, the block aggregation)."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from sorl_monitor.diagnose.detectors.blocks import (
    HISTORY_BLOCKS,
    HISTORY_WINDOW,
    REUSE_COLUMNS,
    REUSED,
    SERIES,
    block_start_sql,
)
from sorl_monitor.diagnose.detectors.catalogue import DETECTORS, Detector
from sorl_monitor.diagnose.detectors.config import DetectorConfig
from sorl_monitor.diagnose.detectors.signals import SIGNALS

DETECT_SQL = """
WITH reuse AS ({reused}),
signals AS (
    SELECT run_id, rank, step, reused{signals} FROM steps JOIN reuse USING (run_id)
    WHERE ($run_id::VARCHAR IS NULL OR run_id = $run_id) AND {block_of_step} > {block_of_start}
),
blocks AS (
    SELECT run_id, rank, reused, {block_of_step} AS block, max(step) AS step{series},
           {history_blocks} AS history_blocks  -- (one window operator, one sort with the series' windows)
    FROM signals GROUP BY run_id, rank, reused, block
),
base_values AS (
    SELECT run_id, rank, step, {values} FROM blocks
    WINDOW {history_window}
),
detector_values AS (SELECT *{joint_values} FROM base_values),
firing AS (  -- a value above its warning level, else NULL (dropped by the unpivot): only firings meet the limits
    SELECT run_id, rank, step, {firing_values} FROM detector_values
),
fired AS (
    SELECT run_id, step, detector, value,
           CASE WHEN value > critical THEN 'critical' ELSE 'warning' END AS severity,
           CASE WHEN value > critical THEN critical ELSE warning END AS threshold, message
    FROM (UNPIVOT firing ON {names} INTO NAME detector VALUE value)
    JOIN (VALUES {thresholds}) AS limits(detector, warning, critical, message) USING (detector)
    WHERE value > warning AND NOT isnan(value) AND step > $after_step
)
SELECT run_id, step, detector, severity, value, threshold, printf(message, value, threshold, 100 * value, 100 * threshold) AS message
FROM fired
QUALIFY row_number() OVER (PARTITION BY run_id, step, detector
                           ORDER BY severity = 'critical' DESC, value DESC) = 1
ORDER BY run_id, step, detector
"""
"""All selected detectors in one pass. Each rank's rows are averaged per block (``block_start_sql``: up to
``smooth_steps`` steps; rows a trainer splits one step's scalars over are averaged with the rest); joint
detectors combine the others' values in the same block; each block's firing is reported at its last logged
step; ranks are merged last (the most severe firing wins). ``firing`` keeps a block's value only where it passes
its warning level (the ``fired`` filter, unchanged), so the ``limits`` join meets the firings, not every block's
value of every detector (docs/detectors.md, Cost).
This template is the only place detector SQL is put together."""


def used_series(detectors: Sequence[Detector]) -> list[str]:
    """The ``SERIES`` the detectors' values refer to."""
    return [name for name in SERIES if any(re.search(rf"\b{name}\b", d.value) for d in detectors)]


def used_signals(detectors: Sequence[Detector]) -> list[str]:
    """The ``SIGNALS`` the detectors and their series read."""
    wanted = {s for d in detectors for s in d.signals} | {SERIES[name][0] for name in used_series(detectors)}
    return [name for name in SIGNALS if name in wanted]


def _quote(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def detect_sql(detectors: Sequence[Detector] = DETECTORS) -> str:
    """The one query that runs ``detectors`` over a relation called ``steps``."""
    if not detectors:
        raise ValueError("no detectors selected")
    joint = [d for d in detectors if d.reads]
    wanted = {d.name for d in detectors if not d.reads} | {name for d in joint for name in d.reads}
    base = [d for d in DETECTORS if d.name in wanted]
    return DETECT_SQL.format(
        signals="".join(f", {SIGNALS[name].expression} AS {name}" for name in used_signals(base)),
        series="".join(f", {SERIES[name][1]} AS {name}" for name in used_series(base)),
        values=", ".join(f"({d.value}) AS {d.name}" for d in base),
        joint_values="".join(f", ({d.value})::DOUBLE AS {d.name}" for d in joint),
        reused=REUSED.strip(),
        block_of_step=block_start_sql("step"),
        block_of_start=block_start_sql("$after_step - $lookback"),
        history_blocks=HISTORY_BLOCKS,
        history_window=HISTORY_WINDOW.strip(),
        names=", ".join(d.name for d in detectors),
        firing_values=", ".join(
            f"CASE WHEN {d.name} > ${d.warning_key} THEN {d.name} END AS {d.name}" for d in detectors
        ),
        thresholds=", ".join(
            f"({_quote(d.name)}, ${d.warning_key}::DOUBLE, ${d.critical_key}::DOUBLE, {_quote(d.message)})"
            for d in detectors
        ),
    )  # fmt: skip


FIRED_END = "\nSELECT run_id, step, detector, severity, value, threshold, printf("
"""Where ``DETECT_SQL``'s final ``SELECT`` (ranks merged, messages formatted, rows ordered) begins."""


def fired_sql(detectors: Sequence[Detector] = DETECTORS) -> str:
    """``detect_sql(detectors)``'s ``WITH`` clause, up to ``fired``: one row per firing of each rank, its message a
    ``printf`` format not yet applied (for a summary that merges ranks and formats one message per detector)."""
    head, found, _ = detect_sql(detectors).rpartition(FIRED_END)
    if not found:
        raise AssertionError("DETECT_SQL's final SELECT no longer starts with FIRED_END")
    return head


BLOCKS_START, BLOCKS_END = "WITH reuse AS (", "\nbase_values AS ("
"""Where ``DETECT_SQL``'s block aggregation (``reuse``, ``signals``, ``blocks``) begins and ends."""
BLOCK_STEP = "max(step) AS step"
"""The ``blocks`` column after which ``block_rows_sql`` adds its extra aggregates."""


def block_rows_sql(detectors: Sequence[Detector] = DETECTORS, extra: str = "") -> str:
    """``detect_sql(detectors)``'s block aggregation alone: its ``blocks`` rows (one per run, rank and block, with
    ``reused``, ``step`` and the series), plus ``extra`` (``, <aggregate over signals' rows> AS <name>``…), for a
    reader that runs several queries over the same blocks (``over_blocks``; the post-mortem)."""
    head, found, _ = detect_sql(detectors).partition(BLOCKS_END)
    if not found or head.count(BLOCK_STEP) != 1 or not head.lstrip().startswith(BLOCKS_START):
        raise AssertionError("DETECT_SQL's block aggregation is no longer where block_rows_sql cuts it")
    return head.rstrip().rstrip(",").replace(BLOCK_STEP, BLOCK_STEP + extra) + "\nSELECT * FROM blocks"


def over_blocks(sql: str, table: str) -> str:
    """``sql`` (``detect_sql``'s or ``fired_sql``'s text, or a query around it) reading its blocks from ``table``
    (what ``block_rows_sql`` computed, with the same detectors, parameters and run) instead of aggregating ``steps``."""
    start, end = sql.find(BLOCKS_START), sql.find(BLOCKS_END)
    if start < 0 or end < start:
        raise AssertionError("over_blocks takes a query around DETECT_SQL's block aggregation")
    return f"{sql[:start]}WITH blocks AS (SELECT * FROM {table}),{sql[end:]}"


_PARAMETER = re.compile(r"\$([a-z_][a-z0-9_]*)")


def detect_params(
    sql: str,
    config: DetectorConfig,
    run_id: str | None = None,
    after_step: int | None = None,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The named parameters ``sql`` uses, from ``config`` (plus run filter, step range and ``extra`` values)."""
    values = {**config.to_dict(), **(extra or {})}
    values["smooth_full_step"] = config.smooth_full_step
    values.update(window_params(config, run_id, after_step))
    return bind(sql, values)


def bind(sql: str, values: Mapping[str, Any]) -> dict[str, Any]:
    """The named parameters (``$name``) ``sql`` uses, taken from ``values``."""
    return {name: values[name] for name in sorted(set(_PARAMETER.findall(sql)))}


def window_params(config: DetectorConfig, run_id: str | None, after_step: int | None) -> dict[str, Any]:
    """The run filter and the step range: every block after ``after_step`` (all when ``None``)."""
    if after_step is None:
        return {"run_id": run_id, "after_step": -(2**60), "lookback": 0}
    return {"run_id": run_id, "after_step": after_step, "lookback": config.lookback_steps}


def required_columns(detectors: Sequence[Detector] = DETECTORS) -> tuple[str, ...]:
    """``steps`` columns the detectors read (besides the keys ``run_id, rank, step``)."""
    return tuple(sorted({c for d in detectors for c in d.columns} | {c for s in used_signals(detectors)
                                                                      for c in SIGNALS[s].columns}
                        | set(REUSE_COLUMNS)))  # fmt: skip
