"""Timeline helpers (alert onsets over logged updates, CTN-on spans from ctn_active or from guard actions) and the
HTML verdict."""

from __future__ import annotations

import html

from sorl_monitor.dashboard.report import verdict_html
from sorl_monitor.diagnose.postmortem import postmortem
from sorl_monitor.diagnose.timeline import alert_onsets, ctn_spans
from sorl_monitor.notify import OnsetFilter
from sorl_monitor.read.query import open_runs
from tests.helpers.synthetic import pattern_rows, write_rows


def alert(step: int, detector: str = "kl_rise", severity: str = "warning") -> dict:
    return {"step": step, "detector": detector, "severity": severity}


def test_a_streak_over_consecutive_logged_updates_is_one_onset_even_when_steps_skip():
    steps = [0, 10, 20, 30, 40, 50]
    onsets = alert_onsets([alert(10), alert(20), alert(30), alert(50)], steps)
    assert [a["step"] for a in onsets] == [10, 50]


def test_escalation_to_critical_is_a_new_onset():
    onsets = alert_onsets([alert(1), alert(2, severity="critical"), alert(3, severity="critical")], [1, 2, 3])
    assert [(a["step"], a["severity"]) for a in onsets] == [(1, "warning"), (2, "critical")]


def test_detectors_have_separate_streaks():
    onsets = alert_onsets([alert(1), alert(2, "grad_norm_spike"), alert(2)], [1, 2])
    assert [(a["step"], a["detector"]) for a in onsets] == [(1, "kl_rise"), (2, "grad_norm_spike")]


def test_alerts_of_a_detector_within_one_block_are_one_streak():
    onsets = alert_onsets([alert(1), alert(3), alert(9)], list(range(16)), block_steps=8)
    assert [a["step"] for a in onsets] == [1]


def test_an_alert_in_a_block_nothing_was_logged_in_joins_the_streak_into_the_next_logged_block():
    onsets = alert_onsets([alert(10), alert(20), alert(30)], [0, 10, 30], block_steps=10)
    assert [a["step"] for a in onsets] == [10]


def test_the_timeline_and_the_webhook_share_one_definition_of_onset():
    fired = [(0, "warning"), (1, "warning"), (2, "critical"), (3, "critical"), (5, "warning")]
    webhook = OnsetFilter(gap_steps=1)
    expected = [step for step, severity in fired if webhook.is_onset("kl_rise", step, severity)]
    onsets = alert_onsets([alert(step, severity=severity) for step, severity in fired], range(6))
    assert [a["step"] for a in onsets] == expected == [0, 2, 5]


def test_ctn_spans_follow_the_logged_ctn_active_column():
    assert ctn_spans([0, 1, 2, 3, 4, 5], [False, True, True, False, True, True], []) == [(1, 3), (4, 5)]


def test_ctn_spans_fall_back_to_guard_actions_when_ctn_active_was_not_logged():
    spans = ctn_spans([0, 1, 2, 3, 4, 5], [None] * 6, [(1, "ctn_on"), (3, "ctn_off"), (4, "ctn_on")])
    assert spans == [(1, 3), (4, 5)]


def test_each_onset_carries_its_detectors_family():
    onsets = alert_onsets(
        [alert(1), alert(2, "grad_norm_spike"), alert(3, "a_trainers_own_alert")], [1, 2, 3]
    )
    assert [a["family"] for a in onsets] == ["kl", "gradient", "other"]


def test_the_html_verdict_of_a_healthy_synthetic_run_lists_its_notes_but_no_root_cause_or_remedy(tmp_path):
    run = write_rows(tmp_path, "alarmed", pattern_rows("clip_rise", 400))
    with open_runs(run) as runs:
        verdict = postmortem(runs, "alarmed")
    page = verdict_html(verdict)
    assert verdict.notes and all(html.escape(note) in page for note in verdict.notes)
    assert "root cause" not in page and "remedy" not in page and "none: healthy" in page
