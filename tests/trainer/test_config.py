"""Trainer configuration: defaults, TOML files, and a clear error for every bad knob."""

from __future__ import annotations

import pytest

from sorl_monitor.trainer.config import TrainConfig, load_config


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("algo", "ppo2", "unknown algorithm"),
        ("ctn", "sometimes", "ctn must be"),
        ("lr", 0.0, "lr must be"),
        ("lr", float("nan"), "lr must be"),
        ("epochs", 0, "epochs must be"),
        ("clip_eps", 1.5, "clip_eps must be"),
        ("staleness", -1, "staleness must be"),
        ("episodes", 100, "multiple of group_size"),
        ("turn_ratio", "median", "turn_ratio must be"),
        ("log_turns", "some", "log_turns must be"),
        ("gamma", 2.0, "gamma must be"),
        ("ctn_anchor", "reference", "ctn_anchor must be"),
        ("ctn_kl_cap", 1.0, "ctn_kl_cap must be"),
    ],
)
def test_bad_knobs_are_refused_before_training(field, value, message):
    cfg = TrainConfig()
    setattr(cfg, field, value)
    with pytest.raises(ValueError, match=message):
        cfg.check()


def test_ctn_mode_defaults_to_the_algorithm():
    assert TrainConfig(algo="ppo").ctn_mode == "off"
    assert TrainConfig(algo="so_ppo").ctn_mode == "on"
    assert TrainConfig(algo="so_ppo", ctn="auto").ctn_mode == "auto"


def test_a_toml_file_sets_every_level(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text('algo = "so_grpo"\nlr = 5e-4\n[task]\nmax_hops = 2\n[policy]\nlayers = 1\n')
    cfg = load_config(path).check()
    assert (cfg.algo, cfg.lr, cfg.task.max_hops, cfg.policy.layers) == ("so_grpo", 5e-4, 2, 1)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("lr = ", "not valid TOML"),
        ("learning_rate = 1e-3", "unknown setting learning_rate"),
        ("[task]\nhops = 3", r"unknown setting hops in \[task\]"),
    ],  # fmt: skip
)
def test_bad_config_files_get_one_line_reasons(tmp_path, text, message):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ValueError, match=message):
        load_config(path)
    with pytest.raises(ValueError, match="not found"):
        load_config(tmp_path / "missing.toml")


def test_the_loss_settings_defaults_are_the_train_configs():
    from sorl_monitor.trainer.algorithms.minibatch_loss import LossSettings
    from sorl_monitor.trainer.train import loss_settings

    assert loss_settings(TrainConfig()) == LossSettings()
