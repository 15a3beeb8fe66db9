"""Each detector fires on its labelled SYNTHETIC pattern and stays silent on a noisy-but-stable SYNTHETIC run;
the same SQL gives the same alerts over Parquet (RunSet) and over live Arrow windows."""

from __future__ import annotations

import math
from pathlib import Path

import pyarrow as pa
import pytest

from sorl_monitor import Monitor
from sorl_monitor.detectors import (
    ALERT_COLUMNS,
    DETECTOR_NAMES,
    ArrowDetector,
    DetectorConfig,
    detect,
    get_detectors,
    load_config,
)
from sorl_monitor.query import open_runs
from tests.detectors.synthetic import KEYS, ONSET, PATTERNS, as_table, pattern_rows, stable_rows, write_rows


def test_every_detector_has_a_synthetic_pattern():
    assert set(PATTERNS) == set(DETECTOR_NAMES)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_no_detector_fires_on_a_noisy_but_stable_synthetic_run(seed):
    alerts = detect(as_table(stable_rows(seed=seed)))
    assert alerts.num_rows == 0, alerts.to_pylist()[:3]


@pytest.mark.parametrize("detector", DETECTOR_NAMES)
def test_detector_fires_on_its_synthetic_pattern_after_onset(detector):
    alerts = detect(as_table(pattern_rows(detector)), detectors=[detector]).to_pylist()
    assert alerts, f"{detector} did not fire"
    assert min(a["step"] for a in alerts) >= ONSET
    assert min(a["step"] for a in alerts) <= ONSET + 20


@pytest.mark.parametrize(
    "detector",
    [
        name
        for name in DETECTOR_NAMES
        if math.isfinite(getattr(DetectorConfig(), get_detectors([name])[0].severe_key))
        and name != "clip_frac_trend"
    ],
)
def test_detector_raises_critical_on_its_synthetic_pattern(detector):
    alerts = detect(as_table(pattern_rows(detector)), detectors=[detector]).to_pylist()
    assert any(a["severity"] == "critical" for a in alerts), alerts[:3]


def test_alert_rows_carry_value_threshold_and_message_on_synthetic_clip_pattern():
    alert = detect(as_table(pattern_rows("clip_frac_level")), detectors=["clip_frac_level"]).to_pylist()[-1]
    assert alert["value"] > alert["threshold"] == DetectorConfig().clip_frac_severe
    assert f"{alert['value']:.3g}" in alert["message"]


def test_result_has_the_documented_columns_even_when_nothing_fires():
    assert detect(as_table(stable_rows())).schema == ALERT_COLUMNS
    assert detect(pa.table({"step": pa.array([], pa.int64())})).schema == ALERT_COLUMNS


def test_a_raised_threshold_silences_a_synthetic_pattern():
    rows = as_table(pattern_rows("clip_frac_level"))
    quiet = DetectorConfig(clip_frac_level_warning=0.7, clip_frac_severe=0.8)
    assert detect(rows, quiet, detectors=["clip_frac_level"]).num_rows == 0


def test_columns_the_trainer_never_logged_leave_their_detectors_silent():
    rows = [{"run_id": "r", "step": s, "clip_frac": 0.9} for s in range(50)]
    alerts = detect(pa.Table.from_pylist(rows)).to_pylist()
    assert {a["detector"] for a in alerts} == {"clip_frac_level"}


def test_a_second_row_of_the_same_step_is_merged_not_counted_twice():
    rows = stable_rows(60)
    extra = [{"run_id": r["run_id"], "rank": 0, "step": r["step"], "lr": 1e-3} for r in rows]
    alone = detect(as_table(rows))
    merged = detect(pa.Table.from_pylist(rows + extra))
    assert merged.equals(alone)


def test_ranks_are_merged_with_the_most_severe_firing_winning_synthetic():
    calm = stable_rows(300)
    hot = [{**row, "rank": 1} for row in pattern_rows("clip_frac_level", 300)]
    for row in hot:
        row["run_id"] = calm[0]["run_id"]
    alerts = detect(pa.Table.from_pylist(calm + hot), detectors=["clip_frac_level"]).to_pylist()
    steps = [a["step"] for a in alerts]
    assert len(steps) == len(set(steps)) and alerts and alerts[-1]["severity"] == "critical"


def test_run_id_selects_one_run_of_a_run_set(tmp_path):
    write_rows(tmp_path, "calm", stable_rows(300))
    write_rows(tmp_path, "hot", pattern_rows("token_ratio_max", 300))
    with open_runs(tmp_path) as runs:
        assert detect(runs, run_id="calm").num_rows == 0
        assert set(detect(runs).column("run_id").to_pylist()) == {"hot"}


def test_live_windows_give_the_offline_alerts_on_a_synthetic_run_written_through_monitor(tmp_path):
    rows = pattern_rows("kl_spike", 420)
    for row in rows[330:]:
        PATTERNS["clip_frac_level"](row)
    config = DetectorConfig()
    live: list[dict] = []
    runner = ArrowDetector(config)
    seen = None
    with Monitor(tmp_path, "parity", flush_interval_s=0.05, window=config.lookback_steps + 8) as mon:
        for row in rows:
            mon.log_scalars(row["step"], {k: v for k, v in row.items() if k not in KEYS})
            if row["step"] % 3 == 2:  # every third update, like a guard called less often than it logs
                live += runner(mon.recent_steps(), after_step=seen).to_pylist()
                seen = row["step"]
    with open_runs(tmp_path) as runs:
        offline = detect(runs, config).to_pylist()
    assert offline and [(a["step"], a["detector"], a["severity"]) for a in live] == [
        (a["step"], a["detector"], a["severity"]) for a in offline
    ]


def test_each_detector_alone_is_one_runnable_query():
    for detector in get_detectors():
        assert detector.sql.count("UNPIVOT") == 1 and detector.name in detector.sql


def test_unknown_detector_name_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown detector 'nope'"):
        detect(as_table(stable_rows(10)), detectors=["nope"])


# ---------------------------------------------------------------------------------------- config
def test_toml_file_sets_thresholds_at_top_level_or_under_detectors(tmp_path):
    flat = tmp_path / "flat.toml"
    flat.write_text("clip_frac_severe = 0.4\nsmooth_steps = 2\n")
    nested = tmp_path / "nested.toml"
    nested.write_text("[detectors]\nclip_frac_severe = 0.45\nentropy_collapse_severe = inf\n")
    assert load_config(flat).clip_frac_severe == 0.4 and load_config(flat).smooth_steps == 2
    assert load_config(nested).clip_frac_severe == 0.45


def test_set_overrides_win_over_the_toml_file(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text("clip_frac_severe = 0.4\n")
    config = load_config(path, ["clip_frac_severe=0.35", "turn_level_algorithms=so_ppo, my_algo"])
    assert config.clip_frac_severe == 0.35
    assert config.turn_level_algorithms == ("so_ppo", "my_algo")


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["clip_frac_sever=0.4"], "unknown detector setting 'clip_frac_sever'"),
        (["clip_frac_severe"], "name=value"),
        (["clip_frac_severe=high"], "cannot read 'high'"),
        (["smooth_steps=0"], "positive integer"),
        (["smooth_steps=2.5"], "cannot read '2.5' as int"),
        (["kl_spike_floor=nan"], "NaN"),
    ],
)
def test_bad_settings_are_clear_errors(overrides, message):
    with pytest.raises(ValueError, match=message):
        load_config(None, overrides)


def test_bad_or_missing_toml_is_a_clear_error(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("clip_frac_severe = [\n")
    with pytest.raises(ValueError, match="bad TOML"):
        load_config(bad)
    with pytest.raises(ValueError, match="no such config file"):
        load_config(tmp_path / "missing.toml")
    unknown = tmp_path / "unknown.toml"
    unknown.write_text("[detectors]\nfoo = 1\n")
    with pytest.raises(ValueError, match="unknown detector setting 'foo'"):
        load_config(unknown)


def test_docs_list_every_detector_by_name():
    docs = (Path(__file__).resolve().parents[2] / "docs" / "detectors.md").read_text()
    assert [name for name in DETECTOR_NAMES if f"| `{name}` |" not in docs] == []
