"""The post-mortem's faster execution gives the verdict of its reference formulation, on REAL runs.

The reference: the collapse label's recovery window as ``RANGE … FOLLOWING`` in step order, the log's last blocks
numbered by a ``row_number()`` window and the dips the run recovered from found by two windows (a dip's segment,
then the block before each return to the peak band), and the alert summary over ``detect_sql()``'s own output (every firing's message
formatted, ranks merged by its ``QUALIFY``) with every block's value of every detector unpivoted and joined to its
limits (not only the values above their warning level), each history aggregate over its own ``RANGE`` frame (not
the blocks counted once and found by position); the label, the alert summary and the count of reward rows (and the first step) each
aggregating ``steps`` into blocks of its own (not reading one table of blocks computed once,
``postmortem.SHARED_BLOCKS_SQL``). Both are computed fresh here and compared with what ``postmortem`` returns:
whole verdicts, field by field.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from sorl_monitor.diagnose.detectors import DetectorConfig, detect
from sorl_monitor.diagnose.detectors.assembly import detect_params, detect_sql
from sorl_monitor.diagnose.detectors.blocks import HISTORY_WINDOW, ma_span_sql
from sorl_monitor.diagnose.postmortem import judge
from sorl_monitor.diagnose.postmortem.alert_summary import STREAK_ROWS
from sorl_monitor.diagnose.postmortem.config import PostmortemConfig
from sorl_monitor.diagnose.postmortem.evidence import RUN_ROWS_SQL
from sorl_monitor.diagnose.postmortem.label import COLLAPSE_SQL, collapse_params
from sorl_monitor.read.query import open_runs

ROOT = Path(__file__).resolve().parents[2]
REAL_9B_COLLAPSE = (
    ROOT.parent / "shared" / "real_logs" / "trl-grpo-qwen3.5-9b-rho-sweep" / "rho0.70_seed44.step_logs.json"
)

FAST_WINDOW = """    WINDOW after_drop AS (  -- the next steps, as PRECEDING in DESC order: DuckDB 2.0 runs the same RANGE …
        PARTITION BY run_id ORDER BY step DESC  -- FOLLOWING frame far slower
        RANGE BETWEEN $collapse_recovery_steps PRECEDING AND CURRENT ROW EXCLUDE CURRENT ROW)"""
REFERENCE_WINDOW = """    WINDOW after_drop AS (PARTITION BY run_id ORDER BY step
                          RANGE BETWEEN CURRENT ROW AND $collapse_recovery_steps FOLLOWING EXCLUDE CURRENT ROW)"""

FAST_END = (
    "RANGE BETWEEN {ma_span} PRECEDING AND CURRENT ROW) AS reward_ma\n",
    "list_min(arg_max(step, block, $end_blocks)) AS end_step",
)
REFERENCE_END = (
    "RANGE BETWEEN {ma_span} PRECEDING AND CURRENT ROW) AS reward_ma,\n"
    "           row_number() OVER (PARTITION BY run_id ORDER BY block DESC) AS from_end\n",
    "min(step) FILTER (WHERE from_end <= $end_blocks) AS end_step",
)
FAST_RECOVERIES = COLLAPSE_SQL[COLLAPSE_SQL.index("segments AS (") : COLLAPSE_SQL.index("held AS (")]
REFERENCE_RECOVERIES = """segments AS (  -- an in-band block and the blocks out of the band after it: did they dip below?
    SELECT *, bool_or(below AND NOT in_band) OVER (PARTITION BY run_id, band_seg) AS seg_dipped FROM banded
),
recoveries AS (  -- back in the band after a segment that dipped below collapse_fraction of the peak
    SELECT run_id, step FROM (
        SELECT run_id, step, in_band, lag(seg_dipped) OVER (PARTITION BY run_id ORDER BY block) AS after_dip
        FROM segments
    ) WHERE in_band AND after_dip
),
"""
FAST_FIRED = "FROM (UNPIVOT firing ON "
REFERENCE_FIRED = "FROM (UNPIVOT detector_values ON "
REFERENCE_HISTORY = (  # the history as a RANGE frame of every aggregate, its length and start as aggregates
    (
        HISTORY_WINDOW.strip(),
        """history AS (PARTITION BY run_id, rank ORDER BY block
                RANGE BETWEEN $history_steps PRECEDING AND CURRENT ROW EXCLUDE CURRENT ROW)""",
    ),
    ("history_blocks >= $min_history_blocks", "count(*) OVER history >= $min_history_blocks"),
    ("first_value(step) OVER history", "min(step) OVER history"),
)


def reference_collapse_sql() -> str:
    """``COLLAPSE_SQL`` with the reference recovery window and the reference end of the log."""
    ma_span = ma_span_sql("block", "$collapse_ma_steps")
    sql = COLLAPSE_SQL.replace(FAST_WINDOW, REFERENCE_WINDOW).replace(FAST_RECOVERIES, REFERENCE_RECOVERIES)
    assert "lag(seg_dipped)" in sql
    for fast, reference in zip(FAST_END, REFERENCE_END, strict=True):
        fast, reference = fast.replace("{ma_span}", ma_span), reference.replace("{ma_span}", ma_span)
        assert fast in sql
        sql = sql.replace(fast, reference)
    return sql


def reference_detect_sql() -> str:
    """``detect_sql()`` with every block's value of every detector joined to its limits, and the history of each
    detector's aggregates a ``RANGE`` frame of its own (``REFERENCE_HISTORY``)."""
    sql = detect_sql()
    assert FAST_FIRED in sql
    for fast, reference in REFERENCE_HISTORY:
        assert fast in sql
        sql = sql.replace(fast, reference)
    return sql.replace(FAST_FIRED, REFERENCE_FIRED)


REFERENCE_SUMMARY_SQL = """
WITH fired AS ({detect_sql})
SELECT detector,
       CASE WHEN bool_or(severity = 'critical') THEN 'critical' ELSE 'warning' END AS severity,
       min(step) AS first_step,
       min(step) FILTER (WHERE severity = 'critical') AS first_critical_step,
       min(step) FILTER (WHERE step >= $streak_from) AS streak_first_step,
       min(step) FILTER (WHERE severity = 'critical' AND step >= $streak_from) AS streak_critical_step,
       max(step) AS last_step,
       max(step) FILTER (WHERE severity = 'critical') AS last_critical_step,
       CASE WHEN detector = 'diverging' THEN list(step ORDER BY step DESC)[1:$streak_rows] END AS recent_steps,
       list(step ORDER BY step DESC) FILTER (WHERE step <= $streak_to)[1:$streak_rows] AS steps_to_fall,
       list(step ORDER BY step DESC) FILTER (WHERE step <= $streak_to AND severity = 'critical')[1:$streak_rows]
           AS criticals_to_fall,
       count(*) AS count,
       max(value) AS max_value,
       arg_max(message, value) AS message
FROM fired GROUP BY detector
ORDER BY first_critical_step NULLS LAST, first_step, detector
"""
"""The alert summary as first written: over ``detect_sql()``'s rows (ranks merged, each message formatted)."""


def reference_label(runs, config=None, run_id=None, postmortem_config=None, blocks=None):
    """The collapse label as ``reference_collapse_sql()`` gives it over ``steps`` (not over the shared ``blocks``)."""
    params = collapse_params(config or DetectorConfig(), postmortem_config or PostmortemConfig(), run_id)
    return runs.sql(reference_collapse_sql(), params)


def reference_run_rows(runs, run_id, blocks=None):
    return runs.sql(RUN_ROWS_SQL, {"run_id": run_id}).to_pylist()[0]


def reference_summary(runs, run_id, config=None, streak_from=None, streak_to=None, blocks=None):
    config = config or DetectorConfig()
    sql = REFERENCE_SUMMARY_SQL.format(detect_sql=reference_detect_sql())
    extra = {
        "streak_from": -(2**62) if streak_from is None else streak_from,
        "streak_to": 2**62 if streak_to is None else streak_to,
        "streak_rows": STREAK_ROWS,
    }
    return runs.sql(sql, detect_params(sql, config, run_id, extra=extra)).to_pylist()


def rounded(value):
    """``value`` with every float to 12 significant digits: DuckDB's multi-threaded sums may differ in their last
    bits between two runs of the same query (seen with two CPU hogs on 2 cores)."""
    if isinstance(value, float):
        return float(f"{value:.12g}")
    if isinstance(value, dict):
        return {key: rounded(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(rounded(item) for item in value)
    return value


def verdicts(path: Path, run_id: str, monkeypatch) -> tuple[dict, dict]:
    """``run_id``'s verdict as ``postmortem`` gives it, and through the reference formulation (floats to 12
    significant digits)."""
    with open_runs(path) as runs:
        fast = judge.postmortem(runs, run_id).to_dict()
        assert FAST_WINDOW in COLLAPSE_SQL
        with monkeypatch.context() as patch:  # each over steps, not over the blocks computed once
            patch.setattr(judge, "label_collapse", reference_label)
            patch.setattr(judge, "summarise_alerts", reference_summary)
            patch.setattr(judge, "count_run_rows", reference_run_rows)
            reference = judge.postmortem(runs, run_id).to_dict()
    return rounded(fast), rounded(reference)


@pytest.mark.parametrize("run", ["token-ppo", "grpo"])
def test_sample_run_verdict_is_the_reference_verdict(run, monkeypatch):
    fast, reference = verdicts(ROOT / "sample_logs" / run, run, monkeypatch)
    assert fast == reference
    if run == "token-ppo":
        assert fast["status"] == "collapsed" and fast["top_alerts"]


def test_real_9b_collapse_verdict_is_the_reference_verdict(monkeypatch):
    if not REAL_9B_COLLAPSE.is_file():
        pytest.skip("../shared/real_logs is not here (it lives beside the repo)")
    with open_runs(REAL_9B_COLLAPSE) as runs:
        run_id = runs.sql("SELECT run_id FROM runs").to_pylist()[0]["run_id"]
    fast, reference = verdicts(REAL_9B_COLLAPSE, run_id, monkeypatch)
    assert fast == reference
    assert fast["status"] != "healthy"


def test_two_rank_run_verdict_is_the_reference_verdict(tmp_path, monkeypatch):
    """The sample run's rows as rank 0, and a SYNTHETIC rank 1 (the same rows, clip fraction and KL × 1.6): the
    ranks' firings at the same steps are merged alike."""
    source = ROOT / "sample_logs" / "token-ppo"
    run = tmp_path / "token-ppo"
    shutil.copytree(source, run)
    for part in sorted((run / "steps" / "rank=0").glob("part-*.parquet")):
        table = pq.read_table(part)
        for name in ("clip_frac", "kl_old_k3"):
            if name in table.column_names:
                index = table.schema.get_field_index(name)
                table = table.set_column(index, name, pc.multiply(table.column(name), 1.6))
        (run / "steps" / "rank=1").mkdir(exist_ok=True)
        pq.write_table(table, run / "steps" / "rank=1" / part.name)
    info = json.loads((run / "run.json").read_text())
    info["world_size"] = 2
    (run / "run.json").write_text(json.dumps(info))
    fast, reference = verdicts(run, info.get("run_id", "token-ppo"), monkeypatch)
    assert fast == reference
    assert fast["top_alerts"]


@pytest.mark.parametrize("run", ["token-ppo", "grpo"])
def test_detect_rows_are_the_reference_rows(run):
    """Every firing ``detect`` returns on a real sample run is the reference's (every block's value of every
    detector joined to its limits), row for row."""
    with open_runs(ROOT / "sample_logs" / run) as runs:
        fast = detect(runs).to_pylist()
        sql = reference_detect_sql()
        reference = runs.sql(sql, detect_params(sql, DetectorConfig())).to_pylist()
    assert rounded(fast) == rounded(reference)
    if run == "token-ppo":
        assert len(fast) > 100
