"""A verdict says what happened, the same way everywhere (issue 44, items 13–14; SYNTHETIC logs): a collapse the
run came back from says so in a field a script can read, and the demo's table, the CLI and the dashboard count
the lead time from the same alert."""

from __future__ import annotations

import json
from pathlib import Path

from sorl_monitor.cli.train import alarm_and_lead
from sorl_monitor.diagnose.postmortem import Verdict, postmortem
from sorl_monitor.read.query import open_runs


def jsonl(path: Path, rewards: list[float]) -> Path:
    path.write_text(
        "".join(json.dumps({"step": s, "reward": r, "loss": 0.1}) + "\n" for s, r in enumerate(rewards, 1))
    )
    return path


def test_a_collapse_the_run_came_back_from_says_where_and_how_it_ended(tmp_path):
    rewards = [0.55] * 349 + [0.07] * 70 + [min(0.92, 0.07 + 0.01 * k) for k in range(181)]
    with open_runs(jsonl(tmp_path / "back.jsonl", rewards)) as runs:
        verdict = postmortem(runs, "back")
    # guards against a verdict silent on the run coming back above the peak it fell from
    assert verdict.status == "collapsed" and 349 <= verdict.collapse_step <= 352
    assert verdict.came_back_step is not None and 470 <= verdict.came_back_step <= 490
    assert any("recovered" in note and "ending at 0.92" in note for note in verdict.notes), verdict.notes
    assert verdict.to_dict()["came_back_step"] == verdict.came_back_step


def test_a_collapse_that_stays_down_has_no_came_back_step(tmp_path):
    with open_runs(jsonl(tmp_path / "down.jsonl", [0.55] * 349 + [0.07] * 200)) as runs:
        verdict = postmortem(runs, "down")
    assert verdict.status == "collapsed" and verdict.came_back_step is None


def test_the_demo_table_counts_the_lead_from_the_alert_the_post_mortem_does():
    """Before: the table showed the run's first critical alert anywhere (183, an early blip) with no lead, where
    the post-mortem and the dashboard named the streak's alert (247, 41 steps before the fall at 288)."""
    verdict = Verdict("token_ppo", "ppo", 300, 300, "collapsed", 288, "reward_below_peak", False, 150, 183, 41,
                      "granularity_mismatch", None, None, {}, fall_step=288, streak_first_critical=247)  # fmt: skip
    assert alarm_and_lead(verdict) == ("247", "41")
    calm = Verdict(
        "so_ppo", "so_ppo", 300, 300, "healthy", None, None, False, 150, 183, None, None, None, None, {}
    )
    assert alarm_and_lead(calm) == ("183", "—")
