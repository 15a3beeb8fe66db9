"""CTN's settings have one set of defaults (``remedy.ctn.CTN_DEFAULTS``) that the bundled trainer, TRL and verl all
take, and one way to build λ's controller and the guard."""

from __future__ import annotations

import dataclasses
import inspect

import pytest

from sorl_monitor.remedy.ctn import CTN_DEFAULTS, AdaptiveCtnCoef, CtnSettings, ctn_controller
from sorl_monitor.remedy.ctn_guard import CtnGuard, guard_for
from sorl_monitor.remedy.objective import ObjectiveSettings
from sorl_monitor.trainer.config import TrainConfig

CTN_FIELDS = [f.name for f in dataclasses.fields(CtnSettings)]


def test_the_bundled_trainer_takes_the_ctn_defaults():
    trainer = TrainConfig()
    assert {name: getattr(trainer, name) for name in CTN_FIELDS if name != "ctn"} == {
        name: getattr(CTN_DEFAULTS, name) for name in CTN_FIELDS if name != "ctn"
    }
    assert ObjectiveSettings().ctn_kl_cap == CTN_DEFAULTS.ctn_kl_cap


def test_trl_and_its_loss_settings_take_the_ctn_defaults():
    pytest.importorskip("trl")
    from sorl_monitor.integrations.trl_so_grpo import SORLGRPOConfig, SorlLossSettings

    config_defaults = {f.name: f.default for f in dataclasses.fields(SORLGRPOConfig)}
    loss_defaults = {f.name: f.default for f in dataclasses.fields(SorlLossSettings)}
    for name in CTN_FIELDS:
        assert config_defaults[name] == loss_defaults[name] == getattr(CTN_DEFAULTS, name), name
    shared = set(loss_defaults) - {"loss_type", "ctn_detectors"}
    assert {name: loss_defaults[name] for name in shared} == {name: config_defaults[name] for name in shared}


def test_verls_loss_takes_the_ctn_defaults():
    pytest.importorskip("transformers")
    from sorl_monitor.integrations.verl_so_ppo import SorlPolicyLoss

    parameters = inspect.signature(SorlPolicyLoss).parameters
    assert {name: parameters[name].default for name in CTN_FIELDS} == dataclasses.asdict(CTN_DEFAULTS)


def test_the_controller_adapts_only_with_a_target_ctn_not_off_and_a_positive_lambda():
    assert isinstance(ctn_controller("auto", 32.0, 0.05, 128.0), AdaptiveCtnCoef)
    assert isinstance(ctn_controller("on", 32.0, 0.05, 128.0), AdaptiveCtnCoef)
    assert ctn_controller("off", 32.0, 0.05, 128.0) is None
    assert ctn_controller("auto", 32.0, None, 128.0) is None
    assert ctn_controller("auto", 0.0, 0.05, 128.0) is None  # λ = 0: a fixed λ, not a controller that raises


def test_the_guard_exists_only_in_auto_mode_and_starts_as_asked():
    assert guard_for("on", None, 1024, "on") is None and guard_for("off", None, 1024, "on") is None
    armed, waiting = guard_for("auto", None, 64, "on"), guard_for("auto", None, 64, "off")
    assert isinstance(armed, CtnGuard) and armed.active and armed.quiet_updates == 64
    assert not waiting.active
