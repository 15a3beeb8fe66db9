"""Post-mortem on SYNTHETIC runs written through the real Monitor: collapse label, lead time, root cause."""

from __future__ import annotations

import json

import pytest

from sorl_monitor.detectors import DetectorConfig
from sorl_monitor.postmortem import CAUSES, label_collapse, postmortem
from sorl_monitor.query import QueryError, open_runs
from tests.detectors.synthetic import ONSET, PATTERNS, pattern_rows, stable_rows, write_rows
from tests.detectors.tiny_pg import train

COLLAPSE_AT = 300


def collapse_rows(rows: list[dict], at: int = COLLAPSE_AT, until: int | None = None) -> list[dict]:
    """SYNTHETIC: the reward falls to 0.05 from step ``at`` (back to normal from ``until``, if given)."""
    for row in rows[at:until]:
        row["reward_mean"] = 0.05
    return rows


def verdict_of(tmp_path, rows, algorithm="ppo", config=None):
    run = write_rows(tmp_path, rows[0]["run_id"], rows, algorithm)
    with open_runs(run) as runs:
        return postmortem(runs, rows[0]["run_id"], config)


def test_sustained_synthetic_reward_fall_is_labelled_a_collapse_near_its_start(tmp_path):
    verdict = verdict_of(tmp_path, collapse_rows(stable_rows(420)))
    assert verdict.collapsed and verdict.collapse_reason == "reward_below_peak"
    assert COLLAPSE_AT <= verdict.collapse_step <= COLLAPSE_AT + DetectorConfig().collapse_ma_steps


def test_synthetic_dip_that_recovers_within_the_window_is_not_a_collapse(tmp_path):
    verdict = verdict_of(tmp_path, collapse_rows(stable_rows(420), until=COLLAPSE_AT + 20))
    assert not verdict.collapsed and verdict.collapse_step is None


def test_deepest_dip_reports_a_recovered_dip_that_the_collapse_label_leaves_out_synthetic(tmp_path):
    dipped = verdict_of(tmp_path / "dip", collapse_rows(stable_rows(420), until=COLLAPSE_AT + 40))
    calm = verdict_of(tmp_path / "calm", stable_rows(420))

    assert not dipped.collapsed
    # the 32-update reward average fell from ~0.49 to ~0.05 for 40 updates: far below half its peak
    assert dipped.evidence["deepest_dip"] < 0.25
    assert COLLAPSE_AT <= dipped.evidence["deepest_dip_step"] <= COLLAPSE_AT + 40
    assert calm.evidence["deepest_dip"] > 0.8  # noisy but rising: never far below its running peak


def test_non_finite_loss_is_a_collapse_at_that_step_synthetic(tmp_path):
    verdict = verdict_of(tmp_path, pattern_rows("nonfinite", 300))
    assert verdict.collapse_step == ONSET and verdict.collapse_reason == "nonfinite_loss"


def test_lead_time_is_collapse_step_minus_first_critical_alert_synthetic(tmp_path):
    verdict = verdict_of(tmp_path, collapse_rows(pattern_rows("clip_frac_level", 420)))
    assert ONSET <= verdict.first_critical < COLLAPSE_AT
    assert verdict.lead_time == verdict.collapse_step - verdict.first_critical > 0


def test_healthy_synthetic_run_has_no_collapse_no_alert_and_cause_none(tmp_path):
    verdict = verdict_of(tmp_path, stable_rows(300))
    assert (verdict.collapsed, verdict.first_warning, verdict.root_cause) == (False, None, "none")
    assert verdict.remedy == CAUSES["none"][1]


def mismatch_rows() -> list[dict]:
    """SYNTHETIC granularity mismatch: token clip fraction 0.6 while turn clip fraction stays 0.05."""
    return collapse_rows(pattern_rows("clip_frac_level", 420))


def test_token_clip_far_above_turn_clip_is_a_granularity_mismatch_synthetic(tmp_path):
    verdict = verdict_of(tmp_path, mismatch_rows())
    assert verdict.root_cause == "granularity_mismatch"
    assert verdict.evidence["token_turn_clip_ratio"] >= DetectorConfig().mismatch_clip_ratio
    assert "turn-level importance sampling" in verdict.remedy and "CTN" in verdict.remedy


def test_turn_level_algorithms_are_not_blamed_for_granularity_synthetic(tmp_path):
    verdict = verdict_of(tmp_path, mismatch_rows(), algorithm="so_ppo")
    assert verdict.root_cause != "granularity_mismatch"


def test_clip_fraction_growing_with_policy_lag_is_off_policy_variance_synthetic(tmp_path):
    rows = stable_rows(420)
    for row in rows[ONSET:]:
        row["clip_frac"] = row["clip_frac_turn"] = 0.1 + 0.15 * row["policy_lag"]
    verdict = verdict_of(tmp_path, collapse_rows(rows))
    assert verdict.root_cause == "off_policy_variance"
    assert verdict.evidence["clip_frac_per_lag"] >= DetectorConfig().off_policy_min_slope
    assert "fewer PPO epochs" in verdict.remedy


def stale_drift_rows(lag_offset: int) -> list[dict]:
    """SYNTHETIC stale rollouts: the clip fraction climbs from ~0.1 to ~0.4 across batches, flat within one."""
    rows = stable_rows(420)
    for row in rows:
        row["policy_lag"] = lag_offset + row["policy_lag"]
    for row in rows[ONSET:]:
        climb = min(1.0, (row["step"] - ONSET) / 60)
        row["clip_frac"] = row["clip_frac_turn"] = 0.1 + 0.3 * climb
    return collapse_rows(rows)


def test_clip_fraction_climbing_under_stale_rollouts_is_off_policy_variance_synthetic(tmp_path):
    verdict = verdict_of(tmp_path, stale_drift_rows(lag_offset=16))
    assert verdict.root_cause == "off_policy_variance"
    assert verdict.evidence["clip_frac_growth"] >= DetectorConfig().off_policy_clip_growth
    assert (
        verdict.evidence["clip_frac_per_lag"] < DetectorConfig().off_policy_min_slope
    )  # not the per-lag rule


def test_the_same_climb_with_fresh_rollouts_is_not_blamed_on_staleness_synthetic(tmp_path):
    verdict = verdict_of(tmp_path, stale_drift_rows(lag_offset=0))
    assert verdict.root_cause != "off_policy_variance"


def test_reward_variance_collapsing_before_a_grad_spike_is_an_echo_trap_synthetic(tmp_path):
    rows = pattern_rows("echo_trap", 420)
    PATTERNS["grad_norm_spike"](rows[ONSET + 40])
    rows[ONSET + 40]["grad_norm"] = 30.0
    verdict = verdict_of(tmp_path, rows)
    assert verdict.root_cause == "echo_trap"
    assert verdict.collapsed


def test_grad_spike_without_ratio_or_echo_signals_is_an_optimisation_blowup_synthetic(tmp_path):
    rows = pattern_rows("grad_norm_spike", 420)
    verdict = verdict_of(tmp_path, collapse_rows(rows))
    assert verdict.root_cause == "optimisation_blowup" and "learning rate" in verdict.remedy


def test_collapse_without_any_precursor_is_unexplained_synthetic(tmp_path):
    verdict = verdict_of(tmp_path, collapse_rows(stable_rows(420)))
    assert verdict.first_critical is None and verdict.root_cause == "unexplained"
    assert verdict.lead_time is None


def test_top_alerts_list_each_detector_once_with_its_first_step_synthetic(tmp_path):
    verdict = verdict_of(tmp_path, mismatch_rows())
    names = [a["detector"] for a in verdict.top_alerts]
    assert len(names) == len(set(names)) and "clip_frac_level" in names
    clip = next(a for a in verdict.top_alerts if a["detector"] == "clip_frac_level")
    assert ONSET <= clip["first_step"] < ONSET + DetectorConfig().smooth_steps
    assert verdict.first_warning == min(a["first_step"] for a in verdict.top_alerts)


def test_verdict_to_dict_is_strict_json(tmp_path):
    verdict = verdict_of(tmp_path, mismatch_rows())
    text = json.dumps(verdict.to_dict(), allow_nan=False)
    assert json.loads(text)["root_cause"] == "granularity_mismatch"


def test_label_collapse_covers_every_run_of_a_log_folder_synthetic(tmp_path):
    write_rows(tmp_path, "calm", stable_rows(300))
    write_rows(tmp_path, "fall", collapse_rows(stable_rows(420)))
    with open_runs(tmp_path) as runs:
        labels = {r["run_id"]: r["collapse_step"] for r in label_collapse(runs).to_pylist()}
    assert labels["calm"] is None and labels["fall"] >= COLLAPSE_AT


def test_unknown_run_is_a_query_error(tmp_path):
    write_rows(tmp_path, "calm", stable_rows(40))
    with open_runs(tmp_path) as runs, pytest.raises(QueryError, match="no run 'other'"):
        postmortem(runs, "other")


@pytest.mark.slow
def test_real_tiny_ppo_collapse_under_a_learning_rate_ramp_is_flagged_before_it(tmp_path):
    """REAL training (tests/detectors/tiny_pg.py, not the bundled trainer): lr ramped 0.01 → 1 collapses."""
    run = train(tmp_path, "ramped", lr=0.01, lr_end=1.0, epochs=4, iterations=100)
    with open_runs(run) as runs:
        verdict = postmortem(runs, "ramped")
    assert verdict.collapsed
    assert verdict.first_critical is not None and verdict.lead_time > 0
