"""The detectors' settings (``DetectorConfig``: alert thresholds and windows) and the post-mortem's
(``PostmortemConfig``: collapse label, root cause) are separate; one ``--config`` file and ``--set`` still set
both, each name going to the dataclass that has it."""

from __future__ import annotations

import dataclasses

import pytest
from typer.testing import CliRunner

from sorl_monitor.cli.main import app
from sorl_monitor.diagnose.detectors import DetectorConfig
from sorl_monitor.diagnose.postmortem import PostmortemConfig, label_collapse, load_configs
from sorl_monitor.read.query import open_runs
from tests.helpers.synthetic import collapse_reward, stable_rows, write_rows

POSTMORTEM_SETTINGS = {
    "collapse_ma_steps", "collapse_fraction", "collapse_recovery_steps", "collapse_min_tail_steps",
    "collapse_min_peak", "peak_band", "end_detectors", "end_blocks", "root_cause_steps", "turn_ratio_eps", "mismatch_clip_ratio", "mismatch_min_clip",
    "mismatch_tail_ratio", "off_policy_min_slope", "off_policy_growth", "off_policy_min_lag",
    "off_policy_clip_growth", "degenerate_length_rise", "degenerate_truncation", "turn_level_algorithms",
}  # fmt: skip


def names(config_class: type) -> set[str]:
    return {f.name for f in dataclasses.fields(config_class)}


# ---------------------------------------------------------------------------------------- the split
def test_detector_config_holds_alert_settings_and_postmortem_config_the_rest():
    assert names(PostmortemConfig) == POSTMORTEM_SETTINGS
    assert names(DetectorConfig) & POSTMORTEM_SETTINGS == set()


def test_one_toml_file_and_set_give_each_setting_to_its_own_dataclass(tmp_path):
    path = tmp_path / "settings.toml"
    path.write_text(
        "[detectors]\nclip_rise_critical = 6.0\ncollapse_ma_steps = 16\nturn_level_algorithms = ['my_ppo']\n"
    )
    detectors, postmortem_config = load_configs(path, ["collapse_fraction=0.4", "smooth_steps=4"])
    assert (detectors.clip_rise_critical, detectors.smooth_steps) == (6.0, 4)
    assert postmortem_config == PostmortemConfig(
        collapse_ma_steps=16, collapse_fraction=0.4, turn_level_algorithms=("my_ppo",)
    )


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["collapse_ma_steps=0"], "post-mortem setting collapse_ma_steps must be a positive integer"),
        (["collapse_fraction=nan"], "post-mortem setting collapse_fraction must not be NaN"),
        (
            ["collapse_fractio=0.4"],
            "unknown detector setting 'collapse_fractio'; known settings: .*collapse_fraction",
        ),
    ],
)
def test_postmortem_settings_are_checked_like_detector_settings(overrides, message):
    with pytest.raises(ValueError, match=message):
        load_configs(None, overrides)


def test_postmortem_settings_reach_the_collapse_label_synthetic(tmp_path):
    write_rows(tmp_path, "fall", collapse_reward(stable_rows(420), 300))
    with open_runs(tmp_path) as runs:
        default = label_collapse(runs).to_pylist()[0]
        no_peak_counts = label_collapse(runs, postmortem_config=PostmortemConfig(collapse_min_peak=1e9))
    assert default["collapse_step"] is not None
    assert no_peak_counts.to_pylist()[0]["collapse_step"] is None


def test_sorl_postmortem_set_routes_a_postmortem_setting_synthetic(tmp_path):
    run = write_rows(tmp_path, "fall", collapse_reward(stable_rows(420), 300))
    runner = CliRunner()
    assert runner.invoke(app, ["postmortem", str(run)]).exit_code == 3
    assert runner.invoke(app, ["postmortem", str(run), "--set", "collapse_min_peak=1e9"]).exit_code == 0


def test_a_moved_setting_is_not_a_detector_setting():
    with pytest.raises(AttributeError, match="collapse_fraction"):
        DetectorConfig().collapse_fraction  # noqa: B018
