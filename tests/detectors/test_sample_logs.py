"""The committed REAL runs of the bundled trainer (``sample_logs/``), read with the detector settings
calibrated for stale rollouts (the bundled preset ``stale-rollouts``): the collapsing token-PPO run
gets a critical alert before its labelled collapse and an explained root cause; the stable turn-level
runs (SO-PPO, SO-GRPO) alarm later and on far fewer updates.

Skipped until the trainer's ``sample_logs/`` is on this branch. Runs are told apart by ``run.json``:
``algorithm`` (``ppo`` = token-level PPO; a turn-level algorithm of ``DetectorConfig.turn_level_algorithms``
= SO-PPO and kin) and the collapse label.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from sorl_monitor.detectors import DetectorConfig, detect, load_config
from sorl_monitor.postmortem import label_collapse, postmortem
from sorl_monitor.query import open_runs

ROOT = Path(__file__).resolve().parents[2]
SAMPLE_LOGS = ROOT / "sample_logs"
STALE = "stale-rollouts"  # the bundled preset
pytestmark = pytest.mark.skipif(
    not SAMPLE_LOGS.is_dir(),
    reason="sample_logs/ (the bundled trainer's real runs) is not on this branch yet",
)


def sample_runs(algorithms: tuple[str, ...], collapsed: bool) -> list[str]:
    with open_runs(SAMPLE_LOGS) as runs:
        labels = {r["run_id"]: r["collapse_step"] for r in label_collapse(runs).to_pylist()}
        found = runs.sql("SELECT run_id, algorithm FROM runs").to_pylist()
    return [
        r["run_id"]
        for r in found
        if (r["algorithm"] or "").lower().replace("-", "_") in algorithms
        and (labels.get(r["run_id"]) is not None) == collapsed
    ]


def test_collapsing_token_ppo_sample_run_gets_a_critical_alert_before_collapse_and_the_right_cause():
    run_ids = sample_runs(("ppo",), collapsed=True)
    assert run_ids, "no collapsing token-PPO run in sample_logs/"
    with open_runs(SAMPLE_LOGS) as runs:
        for run_id in run_ids:
            verdict = postmortem(runs, run_id, load_config(STALE))
            assert verdict.first_critical is not None and verdict.first_critical <= verdict.collapse_step, (
                run_id
            )
            assert verdict.root_cause not in ("none", "unexplained"), (run_id, verdict.evidence)


def critical_steps(runs, run_id: str) -> int:
    alerts = detect(runs, load_config(STALE)).to_pylist()
    return len({a["step"] for a in alerts if a["run_id"] == run_id and a["severity"] == "critical"})


def test_stable_turn_level_sample_runs_alarm_later_and_far_less_than_the_collapsing_token_ppo_run():
    """The detectors' false alarms on stable runs are real (about a third of stable sweep runs get one),
    but on the sample runs they come later and are rare next to the collapsing run's."""
    stable = sample_runs(DetectorConfig().turn_level_algorithms, collapsed=False)
    collapsing = sample_runs(("ppo",), collapsed=True)
    assert stable and collapsing, "sample_logs/ needs a stable turn-level run and a collapsing token-PPO run"
    with open_runs(SAMPLE_LOGS) as runs:
        token_ppo = postmortem(runs, collapsing[0], load_config(STALE))
        token_ppo_steps = critical_steps(runs, collapsing[0])
        for run_id in stable:
            verdict = postmortem(runs, run_id, load_config(STALE))
            assert verdict.first_critical is None or verdict.first_critical > token_ppo.first_critical, run_id
            assert critical_steps(runs, run_id) * 20 < token_ppo_steps, run_id
