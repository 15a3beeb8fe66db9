"""Each detector fires on its labelled SYNTHETIC pattern and stays silent on a noisy-but-stable SYNTHETIC run;
signals read whichever column a trainer logs; windows count optimizer steps, not rows; the same SQL gives
the same alerts over Parquet (RunSet) and over live Arrow windows."""

from __future__ import annotations

import math
from pathlib import Path

import pyarrow as pa
import pytest

from sorl_monitor import Monitor, WriterConfig
from sorl_monitor.diagnose.detectors import (
    DETECTOR_NAMES,
    FAMILY_NAMES,
    FIRED_COLUMNS,
    ArrowDetector,
    DetectorConfig,
    detect,
    get_detectors,
    load_config,
)
from sorl_monitor.diagnose.detectors.assembly import detect_sql
from sorl_monitor.diagnose.postmortem import load_configs
from sorl_monitor.read.query import open_runs
from tests.helpers.synthetic import (
    KEYS,
    ONSET,
    PATTERNS,
    as_table,
    every,
    firing_level,
    firing_severity,
    pattern_rows,
    stable_rows,
    write_rows,
)

FAMILIES = {
    "ratio",
    "kl",
    "entropy",
    "gradient",
    "reward_variance",
    "length",
    "reward",
    "blowup",
    "divergence",
}


def first_alert(rows: list[dict], detector: str, severity: str | None = None) -> dict | None:
    alerts = detect(as_table(rows), detectors=[detector]).to_pylist()
    return next((a for a in alerts if severity is None or a["severity"] == severity), None)


def test_every_detector_has_a_synthetic_pattern():
    assert set(PATTERNS) == set(DETECTOR_NAMES)


def test_every_detector_belongs_to_one_of_the_documented_families():
    assert {d.name: d.family for d in get_detectors() if d.family not in FAMILIES} == {}
    assert set(FAMILY_NAMES) == FAMILIES


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_no_detector_fires_on_a_noisy_but_stable_synthetic_run(seed):
    alerts = detect(as_table(stable_rows(seed=seed)))
    assert alerts.num_rows == 0, alerts.to_pylist()[:3]


def latency(detector: str) -> int:
    """How many steps after a pattern's onset its detector may first fire: a block or two (20 steps), and for
    reward_drop and reward_hacking, which judge a moving average over ``reward_ma_steps``, that window more."""
    return 20 + (DetectorConfig().reward_ma_steps if detector in ("reward_drop", "reward_hacking") else 0)


@pytest.mark.parametrize("detector", DETECTOR_NAMES)
def test_detector_fires_on_its_synthetic_pattern_after_onset(detector):
    alerts = detect(as_table(pattern_rows(detector)), detectors=[detector]).to_pylist()
    assert alerts, f"{detector} did not fire"
    assert ONSET <= min(a["step"] for a in alerts) <= ONSET + latency(detector)


@pytest.mark.parametrize(
    "detector", [d.name for d in get_detectors() if math.isfinite(getattr(DetectorConfig(), d.critical_key))]
)
def test_detector_raises_critical_on_its_synthetic_pattern(detector):
    alerts = detect(as_table(pattern_rows(detector)), detectors=[detector]).to_pylist()
    assert any(a["severity"] == "critical" for a in alerts), alerts[:3]


def test_alert_rows_carry_value_threshold_and_message_on_synthetic_clip_pattern():
    alert = detect(as_table(pattern_rows("clip_rise")), detectors=["clip_rise"]).to_pylist()[-1]
    assert alert["value"] > alert["threshold"] == DetectorConfig().clip_rise_critical
    assert f"{alert['value']:.3g}" in alert["message"]


def test_result_has_the_documented_columns_even_when_nothing_fires():
    assert detect(as_table(stable_rows())).schema == FIRED_COLUMNS
    assert detect(pa.table({"step": pa.array([], pa.int64())})).schema == FIRED_COLUMNS


def test_a_raised_threshold_silences_a_synthetic_pattern():
    rows = as_table(pattern_rows("clip_rise"))
    quiet = DetectorConfig(clip_rise_warning=4 * firing_level("clip_rise"), clip_rise_critical=math.inf)
    assert detect(rows, quiet, detectors=["clip_rise"]).num_rows == 0


def test_columns_the_trainer_never_logged_leave_their_detectors_silent():
    rows = [{"run_id": "r", "step": s, "clip_frac": 0.9} for s in range(50)]
    alerts = detect(pa.Table.from_pylist(rows)).to_pylist()
    assert {a["detector"] for a in alerts} == {"clip_rise"}


# ---------------------------------------------------------------------------------------- signals
def renamed(rows: list[dict], old: str, new: str, transform=lambda v: v) -> list[dict]:
    """The rows with column ``old`` logged as ``new`` instead (a foreign trainer's name for the signal)."""
    return [{**{k: v for k, v in row.items() if k != old}, new: transform(row[old])} for row in rows]


def test_clip_rise_reads_the_share_where_the_clip_binds_when_no_clip_frac_is_logged_synthetic():
    rows = renamed(pattern_rows("clip_rise"), "clip_frac", "clip_frac_active")
    alert = first_alert(rows, "clip_rise", "critical")
    assert alert is not None and ONSET <= alert["step"] <= ONSET + 20


@pytest.mark.parametrize(
    ("column", "transform"),
    [("kl_old_k2", lambda v: v), ("kl_old", lambda v: v), ("kl_old_k1", lambda v: -v)],
    ids=["k2", "trainer-estimator", "negative-k1"],
)
def test_kl_rise_reads_whichever_kl_estimator_the_trainer_logs_synthetic(column, transform):
    rows = renamed(pattern_rows("kl_rise"), "kl_old_k3", column, transform)
    alert = first_alert(rows, "kl_rise", firing_severity("kl_rise"))
    assert alert is not None and ONSET <= alert["step"] <= ONSET + 20


def test_exact_zero_grad_norms_of_no_gradient_batches_are_not_spikes_synthetic():
    rows = stable_rows()
    for row in rows[::3]:
        row["grad_norm"] = 0.0  # a batch whose group rewards were all equal: no gradient
    assert detect(as_table(rows), detectors=["grad_norm_spike", "nonfinite"]).num_rows == 0


def test_a_real_grad_spike_among_exact_zero_grad_norms_still_fires_synthetic():
    rows = pattern_rows("grad_norm_spike")
    for row in rows[::3]:
        if row["step"] != ONSET:
            row["grad_norm"] = 0.0
    alerts = detect(as_table(rows), detectors=["grad_norm_spike"]).to_pylist()
    assert len(alerts) == 1 and ONSET <= alerts[0]["step"] < ONSET + DetectorConfig().smooth_steps, alerts


def on_policy_zero_rows(zero: float) -> list[dict]:
    """SYNTHETIC: a trainer logging every ``smooth_steps`` steps, with rollouts reused for twice that many
    updates, so every other logged row is a rollout's first, on-policy update whose KL is ``zero``; the other
    rows' KL climbs slowly from ``kl_floor`` to ``2 × kl_rise_warning × kl_floor`` over 1600 steps."""
    config = DetectorConfig()
    interval = config.smooth_steps
    top = 2 * config.kl_rise_warning
    rows = every(stable_rows(1600), interval)
    for row in rows:
        on_policy = row["step"] % (2 * interval) == 0
        row["kl_old_k3"] = zero if on_policy else config.kl_floor * (1 + (top - 1) * row["step"] / 1600)
    return rows


def test_exact_zero_kl_rows_of_on_policy_updates_do_not_create_a_fold_synthetic():
    assert detect(as_table(on_policy_zero_rows(0.0)), detectors=["kl_rise"]).num_rows == 0


def test_the_same_rows_with_a_tiny_nonzero_kl_do_fold_so_the_zeros_are_what_is_skipped_synthetic():
    """The control of the test above: had the zeros counted, the quiet level would sit at the floor."""
    assert detect(as_table(on_policy_zero_rows(1e-9)), detectors=["kl_rise"]).num_rows > 0


# ---------------------------------------------------------------------------------------- windows
@pytest.mark.parametrize("detector", ["clip_rise", "turn_clip_rise", "kl_rise"])
def test_a_trust_region_fold_is_judged_against_its_floor_before_any_baseline_exists_synthetic(detector):
    rows = stable_rows(60)
    for row in rows:
        PATTERNS[detector](row)
    alert = first_alert(rows, detector, firing_severity(detector))
    config = DetectorConfig()  # rows of reused rollouts' updates: blocks of smooth_steps from the start
    assert alert is not None and alert["step"] < config.min_history_blocks * config.smooth_steps


def test_other_folds_wait_for_a_baseline_synthetic():
    rows = stable_rows(60)
    for row in rows:
        PATTERNS["kl_ref_rise"](row)
        PATTERNS["length_rise"](row)
    alerts = detect(as_table(rows), detectors=["kl_ref_rise", "length_rise"]).to_pylist()
    assert [a for a in alerts if a["step"] < DetectorConfig().min_history_steps] == []


@pytest.mark.parametrize(
    "detector", ["clip_rise", "kl_rise", "entropy_rise", "grad_norm_spike", "reward_drop"]
)
def test_a_run_logged_every_5_steps_fires_where_the_same_run_logged_every_step_does_synthetic(detector):
    rows = pattern_rows(detector)
    assert ONSET % 5 == 0  # the pattern's first row (a one-row spike) is a logged row in both
    dense = detect(as_table(rows), detectors=[detector]).to_pylist()
    sparse = detect(as_table(every(rows, 5)), detectors=[detector]).to_pylist()
    assert dense and sparse
    # a block's value agrees within a logged row; a moving average (reward_drop) holds other rows in each log
    tolerance = DetectorConfig().reward_ma_steps // 2 if detector == "reward_drop" else 4
    assert abs(sparse[0]["step"] - dense[0]["step"]) <= tolerance, (dense[0], sparse[0])
    reached = [any(a["severity"] == "critical" for a in alerts) for alerts in (dense, sparse)]
    assert reached[0] == reached[1]


def test_a_second_row_of_the_same_step_is_merged_not_counted_twice():
    rows = stable_rows(60)
    extra = [{"run_id": r["run_id"], "rank": 0, "step": r["step"], "lr": 1e-3} for r in rows]
    alone = detect(as_table(rows))
    merged = detect(pa.Table.from_pylist(rows + extra))
    assert merged.equals(alone)


def test_ranks_are_merged_with_the_most_severe_firing_winning_synthetic():
    calm = stable_rows(300)
    hot = [{**row, "rank": 1} for row in pattern_rows("clip_rise", 300)]
    for row in hot:
        row["run_id"] = calm[0]["run_id"]
    alerts = detect(pa.Table.from_pylist(calm + hot), detectors=["clip_rise"]).to_pylist()
    steps = [a["step"] for a in alerts]
    assert len(steps) == len(set(steps)) and alerts and alerts[-1]["severity"] == "critical"


def test_run_id_selects_one_run_of_a_run_set(tmp_path):
    write_rows(tmp_path, "calm", stable_rows(300))
    write_rows(tmp_path, "hot", pattern_rows("ratio_tail_rise", 300))
    with open_runs(tmp_path) as runs:
        assert detect(runs, run_id="calm").num_rows == 0
        assert set(detect(runs).column("run_id").to_pylist()) == {"hot"}


def test_live_windows_give_the_offline_alerts_on_a_synthetic_run_written_through_monitor(tmp_path):
    rows = pattern_rows("kl_rise", 420)
    for row in rows[330:]:
        PATTERNS["clip_rise"](row)
    config = DetectorConfig()
    live: list[dict] = []
    runner = ArrowDetector(config)
    seen = None
    with Monitor(
        tmp_path, "parity", window=config.lookback_steps + 8, writer=WriterConfig(flush_interval_s=0.05)
    ) as mon:
        for row in rows:
            mon.log_scalars(row["step"], {k: v for k, v in row.items() if k not in KEYS}, names=None)
            if row["step"] % 7 == 6:  # every seventh update, like a guard called less often than it logs
                # a block still being written is judged on its rows so far: judge it again once complete
                after = None if seen is None else (seen // config.smooth_steps) * config.smooth_steps - 1
                live = [a for a in live if after is None or a["step"] <= after]
                live += runner(mon.recent_steps(), after_step=after).to_pylist()
                seen = row["step"]
    with open_runs(tmp_path) as runs:
        offline = detect(runs, config).to_pylist()
    assert {a["detector"] for a in offline} >= {"kl_rise", "clip_rise"}
    assert [(a["step"], a["detector"], a["severity"]) for a in live] == [
        (a["step"], a["detector"], a["severity"]) for a in offline
    ]


def test_each_detector_alone_is_one_runnable_query():
    for detector in get_detectors():
        sql = detect_sql((detector,))
        assert sql.count("UNPIVOT") == 1 and detector.name in sql


def test_unknown_detector_name_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown detector 'nope'"):
        detect(as_table(stable_rows(10)), detectors=["nope"])


# ---------------------------------------------------------------------------------------- config
def test_toml_file_sets_thresholds_at_top_level_or_under_detectors(tmp_path):
    flat = tmp_path / "flat.toml"
    flat.write_text("clip_rise_critical = 7.5\nsmooth_steps = 2\n")
    nested = tmp_path / "nested.toml"
    nested.write_text("[detectors]\nclip_rise_critical = 8.5\nentropy_rise_critical = inf\n")
    assert load_config(flat).clip_rise_critical == 7.5 and load_config(flat).smooth_steps == 2
    assert (
        load_config(nested).clip_rise_critical == 8.5
        and load_config(nested).entropy_rise_critical == math.inf
    )


def test_set_overrides_win_over_the_toml_file(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text("clip_rise_critical = 7.5\n")
    config, postmortem_config = load_configs(
        path, ["clip_rise_critical=6.5", "turn_level_algorithms=so_ppo, my_algo"]
    )
    assert config.clip_rise_critical == 6.5
    assert postmortem_config.turn_level_algorithms == ("so_ppo", "my_algo")


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["clip_rise_critica=4"], "unknown detector setting 'clip_rise_critica'"),
        (["clip_frac_severe=0.4"], "unknown detector setting 'clip_frac_severe'"),
        (["min_history=16"], "unknown detector setting 'min_history'"),
        (["clip_rise_critical"], "name=value"),
        (["clip_rise_critical=high"], "cannot read 'high'"),
        (["smooth_steps=0"], "positive integer"),
        (["history_steps=2.5"], "cannot read '2.5' as int"),
        (["kl_floor=nan"], "NaN"),
    ],
)
def test_bad_settings_are_clear_errors(overrides, message):
    with pytest.raises(ValueError, match=message):
        load_config(None, overrides)


def test_bad_or_missing_toml_is_a_clear_error(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("clip_rise_critical = [\n")
    with pytest.raises(ValueError, match="bad TOML"):
        load_config(bad)
    with pytest.raises(ValueError, match="no such config file"):
        load_config(tmp_path / "missing.toml")
    unknown = tmp_path / "unknown.toml"
    unknown.write_text("[detectors]\nfoo = 1\n")
    with pytest.raises(ValueError, match="unknown detector setting 'foo'"):
        load_config(unknown)


def test_the_removed_stale_rollouts_preset_is_no_longer_a_config_name():
    with pytest.raises(ValueError, match="no such config file"):
        load_config("stale-rollouts")


def test_docs_list_every_detector_by_name():
    docs = (Path(__file__).resolve().parents[2] / "docs" / "detectors.md").read_text()
    assert [name for name in DETECTOR_NAMES if f"| `{name}` |" not in docs] == []


def test_the_unoptimised_live_detector_gives_the_same_alerts_on_every_window_synthetic():
    rows = pattern_rows("kl_rise", 420)
    for row in rows[330:]:
        PATTERNS["clip_rise"](row)
    table = as_table(rows)
    optimised, plain = ArrowDetector(), ArrowDetector(optimize=False)
    for end in range(100, 421, 40):
        window = table.slice(max(0, end - 300), min(end, 300))
        after = window.column("step")[-1].as_py() - 40
        assert plain(window, after_step=after).to_pylist() == optimised(window, after_step=after).to_pylist()
    assert plain(table).num_rows > 0
