"""Verdicts on the run's own clock, the end of a log as evidence, and families judged together.

SYNTHETIC streams (``tests/helpers/synthetic.py``, labelled so in each test's name) check the diverging score
and the statuses; the bundled trainer's REAL sample run (``sample_logs/token-ppo``) checks that the same run
logged per update, every 5 steps and per rollout batch gets the same status, and that a log ending in its fall
is not healthy.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from sorl_monitor.cli.diagnose import EXIT_CODES
from sorl_monitor.cli.main import app
from sorl_monitor.diagnose.detectors import DetectorConfig, detect
from sorl_monitor.diagnose.detectors.catalogue import DIVERGING_FAMILIES
from sorl_monitor.diagnose.postmortem import PostmortemConfig, postmortem
from sorl_monitor.read.query import open_runs
from tests.helpers.synthetic import (
    ONSET,
    RISING,
    as_table,
    collapse_reward,
    families_rising,
    stable_rows,
    verdict_of,
)

SAMPLE_RUN = Path(__file__).resolve().parents[2] / "sample_logs" / "token-ppo"
runner = CliRunner()


# ---------------------------------------------------------------------------------------- the run's own clock
def test_blocks_grow_with_the_run_from_single_steps_to_smooth_steps():
    config = DetectorConfig()
    assert [config.block_start(s) for s in (0, 1, 63)] == [0, 1, 63]  # single steps
    assert [config.block_start(s) for s in (64, 65, 66)] == [64, 64, 66]  # pairs
    assert [config.block_start(s) for s in (255, 256, 263, 264)] == [252, 256, 256, 264]
    assert (
        config.block_start(37, reused=True) == 32
    )  # a log of reused rollouts' updates: full blocks throughout


def test_a_one_row_rise_late_in_a_short_per_step_log_is_seen_on_that_row_synthetic():
    """A 60-row log, one row per step: the entropy jumps on its last row and is flagged there, not a block later."""
    rows = [{k: v for k, v in row.items() if k not in ("ppo_epoch", "policy_lag")} for row in stable_rows(60)]
    rows[-1]["entropy"] *= 20
    alerts = detect(as_table(rows), detectors=["entropy_rise"]).to_pylist()
    assert [(a["step"], a["severity"]) for a in alerts] == [(59, "critical")]


# ---------------------------------------------------------------------------------------- families together
@pytest.mark.parametrize("count", [1, 2, 3, 4])
def test_the_diverging_score_counts_the_families_rising_together_synthetic(tmp_path, count):
    config = DetectorConfig()
    verdict = verdict_of(tmp_path, families_rising(count))
    expected = [family for family in DIVERGING_FAMILIES if family in {"ratio", "kl", "entropy", "length"}][
        :count
    ]
    if count <= config.diverging_warning:  # too few families to count as diverging
        assert verdict.diverging_score is None and verdict.status == "healthy"
        return
    assert verdict.families_rising == expected
    assert verdict.diverging_score.startswith(
        f"{count} of {len(DIVERGING_FAMILIES)} families rising since step"
    )
    assert ONSET <= verdict.divergence_step <= ONSET + 20
    assert verdict.status == ("diverging" if count > config.diverging_critical else "healthy")


def test_the_synthetic_families_are_one_of_each():
    from sorl_monitor.diagnose.detectors import get_detectors

    assert len({d.family for d in get_detectors(RISING)}) == len(RISING)


def test_a_diverging_log_exits_5_and_a_healthy_one_0_synthetic(tmp_path):
    diverging = verdict_of(tmp_path / "a", families_rising(4))
    healthy = verdict_of(tmp_path / "b", families_rising(1))
    for verdict, run in ((diverging, tmp_path / "a"), (healthy, tmp_path / "b")):
        result = runner.invoke(app, ["postmortem", str(run)])
        assert result.exit_code == EXIT_CODES[verdict.status]
    assert (EXIT_CODES["diverging"], EXIT_CODES["healthy"]) == (5, 0)
    assert "diverging when the log ends" in runner.invoke(app, ["postmortem", str(tmp_path / "a")]).output


# ---------------------------------------------------------------------------------------- the end of a log
def test_a_log_that_ends_just_after_its_reward_fell_is_collapsing_not_healthy_synthetic(tmp_path):
    """The fall at step 300 is under collapse_min_tail_steps old when the log ends: too soon to confirm, but not
    healthy."""
    rows = collapse_reward(stable_rows(310), at=290)
    verdict = verdict_of(tmp_path, rows)
    assert verdict.status == "collapsing" and verdict.collapse_step is None
    assert verdict.fall_step is not None and 280 <= verdict.fall_step <= 300
    assert any("reward moving average ends" in sign for sign in verdict.end_signs)
    result = runner.invoke(app, ["postmortem", str(tmp_path / rows[0]["run_id"])])
    assert result.exit_code == EXIT_CODES["collapsing"] == 4
    assert "collapsing when the log ends" in result.output


def test_a_log_ending_in_non_finite_values_is_collapsing_synthetic(tmp_path):
    rows = stable_rows(300)
    rows[-1]["grad_norm"] = float("inf")
    verdict = verdict_of(tmp_path, rows)
    assert verdict.status == "collapsing"
    assert any(sign.startswith("nonfinite critical") for sign in verdict.end_signs)


def test_a_stable_log_is_healthy_at_every_cut_synthetic(tmp_path):
    rows = stable_rows(300)
    for cut in (40, 120, 300):
        assert verdict_of(tmp_path / str(cut), rows[:cut]).status == "healthy"


# ---------------------------------------------------------------------------------------- a bundled run, reshaped
def reshaped(tmp_path: Path, name: str, change) -> Path:
    """A copy of the REAL sample run with each ``steps`` part rewritten by ``change``."""
    run = tmp_path / name / SAMPLE_RUN.name
    shutil.copytree(SAMPLE_RUN, run)
    for part in (run / "steps").glob("rank=*/part-*.parquet"):
        pq.write_table(change(pq.read_table(part)), part)
    return run


def every_5(table: pa.Table) -> pa.Table:
    return table.filter(pc.equal(pc.subtract(table["step"], pc.multiply(pc.divide(table["step"], 5), 5)), 0))


def per_rollout(table: pa.Table) -> pa.Table:
    """One row per rollout batch, the mean of its updates (as verl logs a step), at its last update's step."""
    keys = {"run_id", "rank", "step", "iteration", "ppo_epoch", "minibatch", "policy_lag"}
    metrics = [f.name for f in table.schema if f.name not in keys and pa.types.is_floating(f.type)]
    con = duckdb.connect()
    con.register("t", table)
    averaged = ", ".join(f'avg("{c}") AS "{c}"' for c in metrics)
    out = con.sql(
        f"SELECT any_value(run_id) AS run_id, any_value(rank) AS rank, max(step) AS step, {averaged} "
        "FROM t GROUP BY iteration ORDER BY step"
    ).to_arrow_table()
    return out.cast(pa.schema([table.schema.field(name) for name in out.column_names]))


def verdict_at(run: Path):
    with open_runs(run) as runs:
        return postmortem(runs, SAMPLE_RUN.name)


@pytest.mark.skipif(not SAMPLE_RUN.is_dir(), reason="sample_logs/token-ppo is not on this branch")
def test_the_sample_run_logged_per_update_every_5_steps_and_per_rollout_gets_the_same_status(tmp_path):
    """REAL (the bundled trainer's sample run): one row per update, every 5th row, and one row per rollout batch."""
    dense = verdict_at(SAMPLE_RUN)
    sparse = verdict_at(reshaped(tmp_path, "every5", every_5))
    batches = verdict_at(reshaped(tmp_path, "rollouts", per_rollout))
    assert dense.status == sparse.status == batches.status == "collapsed"
    assert abs(dense.collapse_step - sparse.collapse_step) <= DetectorConfig().smooth_steps


@pytest.mark.skipif(not SAMPLE_RUN.is_dir(), reason="sample_logs/token-ppo is not on this branch")
def test_the_sample_run_cut_after_its_reward_fell_below_half_is_not_healthy(tmp_path):
    """REAL: the run stopped a few updates after its reward moving average fell below half its peak (before the
    label can be confirmed) is ``collapsing``, exit 4."""
    confirmed = verdict_at(SAMPLE_RUN).confirmed_step
    cut = confirmed + PostmortemConfig().collapse_min_tail_steps // 2
    run = reshaped(tmp_path, "cut", lambda t: t.filter(pc.less_equal(t["step"], cut)))
    verdict = verdict_at(run)
    assert verdict.status == "collapsing" and verdict.fall_step is not None
    assert runner.invoke(app, ["postmortem", str(run)]).exit_code == EXIT_CODES["collapsing"]
