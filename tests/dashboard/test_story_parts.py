"""The pieces behind the page's story, without a browser: the URL's choice, a verdict in words, the lane's marks,
the notes on what the curves show. Inputs are small synthetic tables and alert rows (labelled so), except the
9B TRL log of ``real_logs`` where it is present."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from sorl_monitor.dashboard import links
from sorl_monitor.dashboard.overview_view import most_urgent
from sorl_monitor.dashboard.verdict_line import status_words, verdict_line, warning_alert
from sorl_monitor.diagnose.live import LiveRunState
from sorl_monitor.diagnose.postmortem import Verdict
from sorl_monitor.diagnose.timeline import alert_onsets
from sorl_monitor.figures.notes import flat_range, flat_value, length_note, log_zero_notes
from sorl_monitor.figures.overview import lane_marks
from sorl_monitor.figures.panels import OVERVIEW_PANELS
from tests.helpers.paths import NINE_B

DEFAULTS = links.Choice(("b",), "Overview", "step", 0, ("KL",), ("ratio", "kl"))
ALLOWED = {
    "views": ["Overview", "Turns"], "x_axes": ["step", "iteration"], "smoothing": [0, 8, 32],
    "panels": ["KL", "reward"], "families": ["ratio", "kl"],
}  # fmt: skip


def test_a_choice_written_to_the_url_reads_back_the_same():
    choice = links.Choice(("a", "c"), "Turns", "iteration", 32, (), ("kl",))
    params = links.link_params(choice, DEFAULTS)
    assert params == {"runs": ["a", "c"], "view": ["Turns"], "x": ["iteration"], "smooth": ["32"],
                      "log": ["none"], "alerts": ["kl"]}  # fmt: skip
    assert links.read_link(params, DEFAULTS, **ALLOWED) == choice


def test_a_default_choice_still_names_its_runs_and_view_and_unknown_values_fall_back():
    assert links.link_params(DEFAULTS, DEFAULTS) == {"runs": ["b"], "view": ["Overview"]}
    odd = {"view": ["Nope"], "x": ["sideways"], "smooth": ["7"], "runs": ["z", "z"]}
    read = links.read_link(odd, DEFAULTS, **ALLOWED)
    assert read == links.Choice(("z",), "Overview", "step", 0, ("KL",), ("ratio", "kl"))


def _info(run_id: str, collapse: int | None, idle: float) -> LiveRunState:
    return LiveRunState(run_id, "", "ppo", "finished", 10, 9, 0.5, collapse, idle)


def test_the_first_page_opens_on_the_most_urgent_run():
    infos = [_info("calm", None, 1.0), _info("fell", 40, 50.0), _info("falling", None, 90.0)]
    assert most_urgent(infos) == ["fell"]  # a collapse label counts as collapsed
    assert most_urgent(infos, {"falling": "collapsing"}) == ["falling"]  # collapsing comes first
    assert most_urgent(infos[:1]) == ["calm"] and most_urgent([]) == []


def _verdict(status: str, collapse: int | None, cause: str | None = None) -> Verdict:
    return Verdict("r", "ppo", 100, 400, status, collapse, None, False, 10, 20, None, cause,
                   "off-policy variance accumulation: the clip fraction grows" if cause else None, None, {})  # fmt: skip


def test_a_verdict_in_words_names_the_alert_the_post_mortem_counts_its_lead_from():
    """Synthetic onsets that would tell another story (kl_rise at 310 still firing): the line tells the verdict's
    (issue 44, item 14: `sorl demo` said "alarm 183, lead —" where the dashboard said "turn_clip_rise at 247")."""
    onsets = [
        {"step": 50, "detector": "kl_rise", "severity": "critical", "last": 80, "message": "early"},
        {"step": 310, "detector": "kl_rise", "severity": "critical", "last": 360, "message": "later"},
    ]
    verdict = _verdict("collapsed", 351, "off_policy_variance")
    verdict.lead_time, verdict.streak_first_critical = 51, 300
    verdict.warned_by = {"detector": "clip_rise", "step": 300, "message": "5× ($x)"}
    line = verdict_line(verdict, onsets, 8)
    assert line.startswith(":red[**collapsed at step 351**]")
    assert "first critical: clip_rise at step 300 (51 steps before; 5× (\\$x))" in line
    assert "root cause: off-policy variance accumulation" in line
    verdict.warned_by = verdict.lead_time = None
    assert "no critical alert before it" in verdict_line(verdict, onsets, 8)
    assert warning_alert(onsets[:1], 351, 8)["step"] == 50  # a divergence's line: the last one before


def test_a_status_the_verdict_adds_later_shows_in_words():
    assert status_words("not_judged") == "not judged"
    assert verdict_line(_verdict("not_judged", None), [], 8).startswith(":gray[**not judged**]")
    assert "collapsed" not in verdict_line(_verdict("healthy", None), [], 8)


def test_onsets_carry_their_streaks_count_and_last_step_and_close_streaks_share_a_lane_mark():
    """Synthetic alert rows: a streak over blocks 1-3, a gap, a streak over blocks 6-7."""
    rows = [{"step": s, "detector": "kl_rise", "severity": "warning"} for s in (8, 16, 24, 48, 56)]
    onsets = alert_onsets(rows, list(range(0, 64, 8)), block_steps=8)
    assert [(o["step"], o["count"], o["last"]) for o in onsets] == [(8, 3, 24), (48, 2, 56)]
    assert [(m["step"], m["count"], m["last"]) for m in lane_marks(onsets, merge_gap=30)] == [(8, 5, 56)]
    assert len(lane_marks(onsets, merge_gap=10)) == 2


def _steps(**columns: list[float]) -> pa.Table:
    return pa.table({name: pa.array(values, pa.float64()) for name, values in columns.items()})


def test_zeros_on_a_log_axis_and_the_length_across_a_collapse_are_said_as_the_data_shows():
    """Synthetic steps: half the grad norms exactly 0; lengths falling after step 3, then rising."""
    table = _steps(step=[0, 1, 2, 3, 4, 5], grad_norm=[0, 0.1, 0, 0.2, 0, 0.3],
                   completion_len_mean=[500, 500, 500, 500, 300, 280])  # fmt: skip
    assert log_zero_notes(table, OVERVIEW_PANELS, {"grad norm"}) == [
        "grad norm (pre-clip): 3 of 6 values are exactly 0, left as gaps on the log axis"
    ]
    assert log_zero_notes(table, OVERVIEW_PANELS, set()) == []
    assert "completion length fell across the collapse (500 → 290 tokens" in length_note(table, 3)
    rising = _steps(step=[0, 1, 2, 3], completion_len_mean=[100, 100, 300, 320])
    assert "completion length rose" in length_note(rising, 1)
    assert length_note(table, None) is None
    assert length_note(_steps(step=[0, 1, 2, 3], completion_len_mean=[100, 100, 105, 110]), 1) is None
    lone = _steps(step=list(range(100)), grad_norm=[0.0] + [0.5] * 99)
    assert log_zero_notes(lone, OVERVIEW_PANELS, {"grad norm"}) == []  # one gap in 100 is not worth a line


def test_a_flat_panel_gets_a_range_that_shows_its_value():
    assert flat_value([np.zeros(4), np.array([0.0, np.nan])]) == 0.0
    assert flat_value([np.array([0.0, 0.1])]) is None
    assert flat_range(0.0) == [-0.05, 1.0]
    assert flat_range(2.0) == pytest.approx([1.8, 2.2])


@pytest.mark.skipif(not NINE_B.is_file(), reason="the real 9B TRL log is not on this machine")
def test_the_9b_collapse_reads_as_its_log_shows(tmp_path):
    """The real TRL log: 24 of 40 grad norms exactly 0; completions fell after the collapse."""
    from sorl_monitor.diagnose.live import LiveRuns

    (tmp_path / NINE_B.name).write_bytes(NINE_B.read_bytes())
    live = LiveRuns(str(tmp_path))
    try:
        live.refresh()
        (run_id,) = live.run_ids()
        steps = live.steps(run_id)
        zeros = log_zero_notes(steps, OVERVIEW_PANELS, {"grad norm"})
        length = length_note(steps, live.collapse_step(run_id))
        verdict = live.verdict(run_id)
    finally:
        live.close()
    assert zeros and zeros[0].startswith("grad norm") and "of 40 values are exactly 0" in zeros[0]
    assert "length fell across the collapse" in length
    messages = " ".join(row["message"] for row in verdict.top_alerts)
    assert "longer completions" not in verdict.explanation
    assert " % of " in messages and " 1 of " not in messages
