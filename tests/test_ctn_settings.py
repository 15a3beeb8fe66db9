"""CTN's settings have one set of defaults (``remedy.ctn.CTN_DEFAULTS``) that the bundled trainer, TRL and verl all
take, and one way to build λ's controller and the guard."""

from __future__ import annotations

import dataclasses
import inspect

import pytest

from sorl_monitor.remedy.ctn import (
    CTN_COEF_MAX,
    CTN_DEFAULTS,
    AdaptiveCtnCoef,
    CtnSettings,
    coef_max_for,
    ctn_controller,
)
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


@pytest.mark.parametrize(
    ("algo", "bound"),
    [("ppo", 128.0), ("s_ppo", 128.0), ("so_ppo", 128.0), ("grpo", 32.0), ("so_grpo", 32.0)],
)
def test_lambdas_default_bound_follows_where_the_advantage_comes_from(algo, bound):
    """One rule for λ's bound: a critic's advantage 128, a group's 32 (``CTN_COEF_MAX``); a given bound wins, and
    a ``ctn_coef`` above the default raises it."""
    assert CTN_COEF_MAX == {"critic": 128.0, "group": 32.0}
    assert TrainConfig(algo=algo).coef_max == bound
    assert TrainConfig(algo=algo, ctn_coef_max=64.0).coef_max == 64.0
    assert TrainConfig(algo=algo, ctn_coef=200.0).check().coef_max == 200.0
    with pytest.raises(ValueError, match="ctn_coef_max"):
        TrainConfig(algo=algo, ctn_coef=200.0, ctn_coef_max=100.0).check()
    assert coef_max_for(None, "group") == 32.0 and coef_max_for(None, "critic", 256.0) == 256.0
    with pytest.raises(ValueError, match="advantage"):
        coef_max_for(None, "value")


def test_trls_sorl_trainer_bounds_lambda_as_for_a_group_advantage():
    pytest.importorskip("trl")
    from sorl_monitor.integrations.trl_so_grpo import SORLGRPOConfig, SorlLossSettings

    settings = SorlLossSettings.of(SORLGRPOConfig(output_dir="unused", report_to=[], use_cpu=True))
    assert settings.ctn_coef_max is None
    assert coef_max_for(settings.ctn_coef_max, "group", settings.ctn_coef) == 32.0


@pytest.mark.parametrize(("loss_mode", "bound"), [("so_grpo", 32.0), ("so_ppo", 128.0), (None, 128.0)])
def test_verls_loss_reads_its_bound_from_the_loss_mode_it_runs_under(loss_mode, bound):
    pytest.importorskip("transformers")
    import torch

    from sorl_monitor.integrations.verl_so_ppo import SorlPolicyLoss

    loss = SorlPolicyLoss(ctn="on", monitor=None)
    config = {"clip_ratio": 0.2, "policy_loss": {"loss_mode": loss_mode} if loss_mode else None}
    old = -torch.rand(2, 6, dtype=torch.float64)
    loss.objective(old, old + 0.1, torch.ones(2, 6, dtype=torch.float64), torch.ones(2, 6), config=config)
    assert loss.controller.high == bound
    given = SorlPolicyLoss(ctn="on", monitor=None, ctn_coef_max=64.0)
    given.objective(old, old + 0.1, torch.ones(2, 6, dtype=torch.float64), torch.ones(2, 6), config=config)
    assert given.controller.high == 64.0
