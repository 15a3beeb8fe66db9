"""The committed REAL runs of the bundled trainer (``sample_logs/``), read with the default detector settings.

What is checked for every run is structural: it gets a verdict, its status is its collapse label, and a
collapsed run is explained (root cause, remedy) while a healthy one is not. Which run collapses and how early
it is flagged depend on thresholds still being calibrated: that expectation is the lead engineer's, in
``test_sample_token_ppo_collapse_is_flagged_before_it`` alone.

Skipped until the trainer's ``sample_logs/`` is on this branch.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from sorl_monitor.diagnose.postmortem import CAUSES, label_collapse, postmortem
from sorl_monitor.read.query import open_runs

ROOT = Path(__file__).resolve().parents[2]
SAMPLE_LOGS = ROOT / "sample_logs"


@pytest.fixture(scope="module")
def verdicts() -> dict:
    with open_runs(SAMPLE_LOGS) as runs:
        labels = {row["run_id"]: row for row in label_collapse(runs).to_pylist()}
        found = [row["run_id"] for row in runs.sql("SELECT run_id FROM runs ORDER BY run_id").to_pylist()]
        return {
            "labels": labels,
            "runs": found,
            "verdicts": {run_id: postmortem(runs, run_id) for run_id in labels},
        }


def test_every_sample_run_gets_a_verdict(verdicts):
    assert verdicts["runs"], "sample_logs/ holds no run"
    assert sorted(verdicts["verdicts"]) == verdicts["runs"]
    assert all(v.updates > 0 for v in verdicts["verdicts"].values())


def test_each_sample_run_has_the_status_of_its_collapse_label(verdicts):
    for run_id, verdict in verdicts["verdicts"].items():
        label = verdicts["labels"][run_id]
        expected = "healthy" if label["collapse_step"] is None else "collapsed"
        assert (verdict.status, verdict.collapse_step) == (expected, label["collapse_step"]), run_id
        assert verdict.ends_collapsed == bool(label["ends_collapsed"]), run_id


def test_a_collapsed_sample_run_is_explained_and_a_healthy_one_is_not(verdicts):
    for run_id, verdict in verdicts["verdicts"].items():
        if verdict.status == "collapsed":
            assert verdict.root_cause in CAUSES, run_id
            assert (verdict.explanation, verdict.remedy) == CAUSES[verdict.root_cause], run_id
        else:
            assert (verdict.root_cause, verdict.explanation, verdict.remedy) == (None, None, None), run_id


def test_sample_token_ppo_collapse_is_flagged_before_it(verdicts):
    """The lead engineer's expectation, which may fail while thresholds are being calibrated: the token-level
    PPO sample run collapses, and its first critical alert comes at or before the collapse step."""
    verdict = verdicts["verdicts"].get("token-ppo")
    assert verdict is not None, "sample_logs/token-ppo is missing"
    assert verdict.status == "collapsed"
    assert verdict.first_critical is not None and verdict.first_critical <= verdict.collapse_step, (
        verdict.first_critical,
        verdict.collapse_step,
    )
