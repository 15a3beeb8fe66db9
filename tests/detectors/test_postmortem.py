"""Post-mortem on SYNTHETIC runs written through the real Monitor: collapse label, status, lead time, notes,
inputs, and for a collapse its root cause."""

from __future__ import annotations

import json

import pytest

from sorl_monitor.diagnose.detectors import DetectorConfig
from sorl_monitor.diagnose.postmortem import CAUSES, PostmortemConfig, label_collapse, postmortem
from sorl_monitor.read.query import QueryError, open_runs
from tests.helpers.synthetic import (
    KEYS,
    ONSET,
    PATTERNS,
    collapse_reward,
    every,
    grad_spike,
    pattern_rows,
    stable_rows,
    verdict_of,
    write_rows,
)
from tests.helpers.tiny_pg import train

COLLAPSE_AT = 300


def collapse_rows(rows: list[dict], at: int = COLLAPSE_AT, until: int | None = None) -> list[dict]:
    """SYNTHETIC: the reward falls to 0.05 from step ``at`` (back to normal from ``until``, if given)."""
    return collapse_reward(rows, at, until)


# ---------------------------------------------------------------------------------------- collapse label
def test_sustained_synthetic_reward_fall_is_labelled_a_collapse_near_its_start(tmp_path):
    verdict = verdict_of(tmp_path, collapse_rows(stable_rows(420)))
    assert verdict.status == "collapsed" and verdict.collapse_reason == "reward_below_peak"
    assert COLLAPSE_AT <= verdict.collapse_step <= COLLAPSE_AT + PostmortemConfig().collapse_ma_steps
    assert not verdict.ends_collapsed  # the log goes on well past the recovery window


def test_synthetic_dip_that_recovers_within_the_window_is_not_a_collapse(tmp_path):
    verdict = verdict_of(tmp_path, collapse_rows(stable_rows(420), until=COLLAPSE_AT + 20))
    assert verdict.status == "healthy" and verdict.collapse_step is None


def test_deepest_dip_reports_a_recovered_dip_that_the_collapse_label_leaves_out_synthetic(tmp_path):
    dipped = verdict_of(tmp_path / "dip", collapse_rows(stable_rows(420), until=COLLAPSE_AT + 40))
    calm = verdict_of(tmp_path / "calm", stable_rows(420))

    assert dipped.status == "healthy"
    # the 32-step reward average fell from ~0.49 to ~0.05 for 40 steps: far below half its peak
    assert dipped.evidence["deepest_dip"] < 0.25
    assert COLLAPSE_AT <= dipped.evidence["deepest_dip_step"] <= COLLAPSE_AT + 40
    assert any("recovered" in note for note in dipped.notes), dipped.notes
    assert calm.evidence["deepest_dip"] > 0.8  # noisy but rising: never far below its running peak


def test_non_finite_loss_is_a_collapse_at_that_step_synthetic(tmp_path):
    verdict = verdict_of(tmp_path, pattern_rows("nonfinite", 300))
    assert verdict.collapse_step == ONSET and verdict.collapse_reason == "nonfinite_loss"


def zero_reward_before_end(steps_before_end: int, n: int = 400) -> list[dict]:
    """SYNTHETIC: the reward falls to exactly 0 ``steps_before_end`` steps before the log's last step."""
    return collapse_reward(stable_rows(n), n - steps_before_end, to=0.0)


def test_a_log_that_ends_long_after_its_reward_fell_to_zero_ends_collapsed_synthetic(tmp_path):
    config = PostmortemConfig()
    verdict = verdict_of(
        tmp_path, zero_reward_before_end(config.collapse_ma_steps + config.collapse_min_tail_steps)
    )
    assert verdict.status == "collapsed" and verdict.ends_collapsed
    assert verdict.last_step - verdict.collapse_step < config.collapse_recovery_steps
    assert any("the log ends collapsed" in note for note in verdict.notes), verdict.notes


def test_a_reward_fall_to_zero_well_before_the_log_ends_is_labelled_ends_collapsed_synthetic(tmp_path):
    """The tail is counted from where the reward moving average crosses half its peak, which lags the fall
    by up to half its window: a fall collapse_ma_steps + collapse_min_tail_steps before the end is enough,
    and less than collapse_recovery_steps before it is too recent to have seen a recovery window."""
    config = PostmortemConfig()
    assert config.collapse_ma_steps + config.collapse_min_tail_steps < config.collapse_recovery_steps
    verdict = verdict_of(
        tmp_path, zero_reward_before_end(config.collapse_ma_steps + config.collapse_min_tail_steps)
    )
    assert (verdict.status, verdict.ends_collapsed) == ("collapsed", True), verdict.notes


def test_a_reward_fall_to_zero_5_steps_before_the_log_ends_is_not_labelled_synthetic(tmp_path):
    assert PostmortemConfig().collapse_min_tail_steps > 5
    verdict = verdict_of(tmp_path, zero_reward_before_end(5))
    assert (verdict.status, verdict.collapse_step, verdict.ends_collapsed) == ("healthy", None, False)


def test_a_dip_still_below_half_its_peak_when_the_log_ends_is_not_called_recovered_synthetic(tmp_path):
    verdict = verdict_of(tmp_path, zero_reward_before_end(24))
    assert verdict.evidence["deepest_dip"] < PostmortemConfig().collapse_fraction  # the log ends in the dip
    assert verdict.status == "collapsed" or not any("recovered" in note for note in verdict.notes), (
        verdict.notes
    )


def test_label_collapse_covers_every_run_of_a_log_folder_synthetic(tmp_path):
    write_rows(tmp_path, "calm", stable_rows(300))
    write_rows(tmp_path, "fall", collapse_rows(stable_rows(420)))
    with open_runs(tmp_path) as runs:
        labels = {r["run_id"]: r for r in label_collapse(runs).to_pylist()}
    assert labels["calm"]["collapse_step"] is None and labels["fall"]["collapse_step"] >= COLLAPSE_AT
    assert labels["calm"]["ends_collapsed"] is False and labels["fall"]["ends_collapsed"] is False


# ---------------------------------------------------------------------------------------- logging interval
def kl_then_fall() -> list[dict]:
    """SYNTHETIC: KL to the behaviour policy at twice kl_rise's critical fold from ONSET, reward falls at 300."""
    return collapse_rows(pattern_rows("kl_rise", 420))


def test_a_run_logged_every_5_steps_gets_the_verdict_of_the_same_run_logged_every_step_synthetic(tmp_path):
    dense = verdict_of(tmp_path / "dense", kl_then_fall())
    sparse = verdict_of(tmp_path / "sparse", every(kl_then_fall(), 5))
    assert dense.status == sparse.status == "collapsed"
    assert abs(dense.collapse_step - sparse.collapse_step) <= 5
    first = [next(a["detector"] for a in v.top_alerts if a["first_critical_step"] == v.first_critical)
             for v in (dense, sparse)]  # fmt: skip
    assert first == ["kl_rise", "kl_rise"]
    assert dense.root_cause == sparse.root_cause


# ---------------------------------------------------------------------------------------- status, notes
def test_healthy_synthetic_run_has_no_collapse_no_alert_and_no_cause(tmp_path):
    verdict = verdict_of(tmp_path, stable_rows(300))
    assert (verdict.status, verdict.first_warning, verdict.first_critical) == ("healthy", None, None)
    assert (verdict.root_cause, verdict.explanation, verdict.remedy) == (None, None, None)
    assert verdict.notes == []


def test_a_healthy_run_with_a_critical_alert_stays_healthy_and_notes_the_alert_synthetic(tmp_path):
    verdict = verdict_of(tmp_path, pattern_rows("clip_rise", 400))
    assert verdict.status == "healthy" and verdict.first_critical is not None
    assert (verdict.root_cause, verdict.explanation, verdict.remedy, verdict.lead_time) == (None,) * 4
    assert [note for note in verdict.notes if "clip_rise" in note and "critical" in note], verdict.notes


def test_lead_time_is_collapse_step_minus_first_critical_alert_synthetic(tmp_path):
    verdict = verdict_of(tmp_path, collapse_rows(pattern_rows("clip_rise", 420)))
    assert ONSET <= verdict.first_critical < COLLAPSE_AT
    assert verdict.lead_time == verdict.collapse_step - verdict.first_critical > 0


# ---------------------------------------------------------------------------------------- inputs
def without(rows: list[dict], *prefixes: str) -> list[dict]:
    return [{k: v for k, v in row.items() if k in KEYS or not k.startswith(prefixes)} for row in rows]


def test_a_run_without_kl_columns_lists_the_kl_detectors_as_not_evaluated_synthetic(tmp_path):
    verdict = verdict_of(tmp_path, without(stable_rows(300), "kl_"))
    assert {"kl_rise", "kl_ref_rise"} <= set(verdict.not_evaluated)
    assert "clip_rise" not in verdict.not_evaluated
    assert verdict.inputs["kl"] == [] and "clip_frac" in verdict.inputs["ratio"]


def test_a_run_logging_every_input_has_nothing_not_evaluated_synthetic(tmp_path):
    verdict = verdict_of(tmp_path, stable_rows(300))
    assert verdict.not_evaluated == []
    assert all(verdict.inputs[family] for family in verdict.inputs), verdict.inputs


def test_a_detector_needing_two_signals_is_not_evaluated_when_the_run_logs_only_one_synthetic(tmp_path):
    rows = [{k: v for k, v in row.items() if k in KEYS or k == "reward_mean"} for row in stable_rows(300)]
    verdict = verdict_of(tmp_path, rows)
    assert {"echo_trap", "reward_std_collapse"} <= set(verdict.not_evaluated), verdict.not_evaluated


def test_a_collapse_no_detector_saw_is_unexplained_and_names_the_missing_inputs_synthetic(tmp_path):
    verdict = verdict_of(tmp_path, collapse_rows(without(stable_rows(420), "kl_")))
    assert verdict.first_critical is None and verdict.lead_time is None
    assert verdict.root_cause == "unexplained" and verdict.remedy == CAUSES["unexplained"][1]
    missing = [note for note in verdict.notes if "kl_rise" in note and "kl_ref_rise" in note]
    assert missing, verdict.notes


# ---------------------------------------------------------------------------------------- root causes
def mismatch_rows() -> list[dict]:
    """SYNTHETIC granularity mismatch: token clip fraction 0.6 from ONSET while turn clip fraction stays put."""
    rows = stable_rows(420)
    for row in rows[ONSET:]:
        row["clip_frac"] = 0.6
    return collapse_rows(rows)


def test_token_clip_far_above_turn_clip_is_a_granularity_mismatch_synthetic(tmp_path):
    verdict = verdict_of(tmp_path, mismatch_rows())
    assert verdict.root_cause == "granularity_mismatch"
    assert verdict.evidence["token_turn_clip_ratio"] >= PostmortemConfig().mismatch_clip_ratio
    assert "turn-level importance sampling" in verdict.remedy and "CTN" in verdict.remedy


def test_turn_level_algorithms_are_not_blamed_for_granularity_synthetic(tmp_path):
    verdict = verdict_of(tmp_path, mismatch_rows(), algorithm="so_ppo")
    assert verdict.status == "collapsed" and verdict.root_cause != "granularity_mismatch"


def test_clip_fraction_growing_with_policy_lag_is_off_policy_variance_synthetic(tmp_path):
    rows = stable_rows(420)
    for row in rows[ONSET:]:
        row["clip_frac"] = row["clip_frac_turn"] = 0.1 + 0.15 * row["policy_lag"]
    verdict = verdict_of(tmp_path, collapse_rows(rows))
    assert verdict.root_cause == "off_policy_variance"
    assert verdict.evidence["clip_frac_per_lag"] >= PostmortemConfig().off_policy_min_slope
    assert "fewer PPO epochs" in verdict.remedy


def stale_drift_rows(lag_offset: int) -> list[dict]:
    """SYNTHETIC stale rollouts: the clip fraction climbs to 0.4 across batches from ONSET, flat within one."""
    rows = stable_rows(420)
    for row in rows:
        row["policy_lag"] = lag_offset + row["policy_lag"]
    for row in rows[ONSET:]:
        climb = min(1.0, (row["step"] - ONSET) / 60)
        row["clip_frac"] = row["clip_frac_turn"] = row["clip_frac"] + (0.4 - row["clip_frac"]) * climb
    return collapse_rows(rows)


def test_clip_fraction_climbing_under_stale_rollouts_is_off_policy_variance_synthetic(tmp_path):
    verdict = verdict_of(tmp_path, stale_drift_rows(lag_offset=16))
    assert verdict.root_cause == "off_policy_variance"
    assert verdict.evidence["clip_frac_growth"] >= PostmortemConfig().off_policy_clip_growth
    assert (
        verdict.evidence["clip_frac_per_lag"] < PostmortemConfig().off_policy_min_slope
    )  # not the per-lag rule


def test_the_same_climb_with_fresh_rollouts_is_not_blamed_on_staleness_synthetic(tmp_path):
    verdict = verdict_of(tmp_path, stale_drift_rows(lag_offset=0))
    assert verdict.status == "collapsed" and verdict.root_cause != "off_policy_variance"


def test_reward_variance_collapsing_before_a_grad_spike_is_an_echo_trap_synthetic(tmp_path):
    rows = pattern_rows("echo_trap", 420)
    rows[ONSET + 40]["grad_norm"] = grad_spike()
    verdict = verdict_of(tmp_path, rows)
    assert verdict.status == "collapsed" and verdict.root_cause == "echo_trap"


def entropy_blowup_rows() -> list[dict]:
    """SYNTHETIC entropy blow-up: entropy ×10 from ONSET, every completion cut at the length limit, and the
    reward falling at 300."""
    rows = stable_rows(420)
    for row in rows[ONSET:]:
        row["entropy"] *= 10
        row["completion_truncated_frac"] = 1.0
    return collapse_rows(rows)


def test_entropy_exploding_before_the_reward_falls_is_an_entropy_blowup_synthetic(tmp_path):
    verdict = verdict_of(tmp_path, entropy_blowup_rows())
    assert verdict.root_cause == "entropy_blowup"
    assert verdict.remedy == CAUSES["entropy_blowup"][1]
    assert [note for note in verdict.notes if note.startswith("degenerate generations")], verdict.notes


def test_an_entropy_blowup_after_a_ratio_alert_is_not_blamed_on_entropy_synthetic(tmp_path):
    rows = entropy_blowup_rows()
    for row in rows[ONSET - 30 :]:
        PATTERNS["clip_rise"](row)
    verdict = verdict_of(tmp_path, rows)
    assert verdict.status == "collapsed" and verdict.root_cause != "entropy_blowup"


def test_grad_spike_without_ratio_or_echo_signals_is_an_optimisation_blowup_synthetic(tmp_path):
    verdict = verdict_of(tmp_path, collapse_rows(pattern_rows("grad_norm_spike", 420)))
    assert verdict.root_cause == "optimisation_blowup" and "learning rate" in verdict.remedy


def test_collapse_without_any_precursor_is_unexplained_synthetic(tmp_path):
    verdict = verdict_of(tmp_path, collapse_rows(stable_rows(420)))
    assert verdict.first_critical is None and verdict.root_cause == "unexplained"
    assert verdict.lead_time is None


# ---------------------------------------------------------------------------------------- output
def test_top_alerts_list_each_detector_once_with_its_first_step_synthetic(tmp_path):
    verdict = verdict_of(tmp_path, mismatch_rows())
    names = [a["detector"] for a in verdict.top_alerts]
    assert len(names) == len(set(names)) and "clip_rise" in names
    clip = next(a for a in verdict.top_alerts if a["detector"] == "clip_rise")
    assert ONSET <= clip["first_step"] < ONSET + DetectorConfig().smooth_steps
    assert verdict.first_warning == min(a["first_step"] for a in verdict.top_alerts)


def test_verdict_to_dict_is_strict_json(tmp_path):
    verdict = verdict_of(tmp_path, mismatch_rows())
    payload = json.loads(json.dumps(verdict.to_dict(), allow_nan=False))
    assert payload["root_cause"] == "granularity_mismatch" and payload["status"] == "collapsed"
    assert payload["collapsed"] is True and payload["ends_collapsed"] is False
    assert set(payload["inputs"]) == {"ratio", "kl", "entropy", "gradient", "reward_variance", "length",
                                      "reward", "blowup", "divergence"}  # fmt: skip


def test_unknown_run_is_a_query_error(tmp_path):
    write_rows(tmp_path, "calm", stable_rows(40))
    with open_runs(tmp_path) as runs, pytest.raises(QueryError, match="no run 'other'"):
        postmortem(runs, "other")


@pytest.mark.slow
def test_real_tiny_ppo_collapse_under_a_learning_rate_ramp_is_flagged_before_it(tmp_path):
    """REAL training (tests/helpers/tiny_pg.py, not the bundled trainer): lr ramped 0.01 → 1 collapses."""
    run = train(tmp_path, "ramped", lr=0.01, lr_end=1.0, epochs=4, iterations=100)
    with open_runs(run) as runs:
        verdict = postmortem(runs, "ramped")
    assert verdict.status == "collapsed"
    assert verdict.first_critical is not None and verdict.lead_time > 0
