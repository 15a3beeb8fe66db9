"""The TRL remedy refuses at construction what would fail later or silently: an SO-GRPO config given to a
trainer without the SO-GRPO loss (TRL's real ``GRPOTrainer`` 1.16, ``MonitoredGRPOTrainer``), and settings
that are not booleans or finite numbers. Tiny Qwen2 from a config, tokenizer in code, CPU."""

from __future__ import annotations

import pytest

pytest.importorskip("trl")
from datasets import Dataset  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402

from sorl_monitor.integrations.trl import MonitoredGRPOTrainer  # noqa: E402
from sorl_monitor.integrations.trl_so_grpo import SORLGRPOConfig, SORLGRPOTrainer, SorlLossSettings  # noqa: E402
from tests.helpers.tiny_lm import char_tokenizer, save_tiny_qwen2  # noqa: E402


def reward(completions, **kwargs):
    return [float(len(text)) for text in completions]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return str(save_tiny_qwen2(tmp_path_factory.mktemp("model") / "qwen2"))


def config(kind, tmp_path, **fields):
    common = {"output_dir": str(tmp_path), "use_cpu": True, "report_to": [], "num_generations": 2}
    return kind(**common, per_device_train_batch_size=2, max_completion_length=4, **fields)


def build(trainer, model_dir, args):
    data = Dataset.from_dict({"prompt": ["abc", "hello"] * 2})
    return trainer(
        model=model_dir, processing_class=char_tokenizer(), reward_funcs=reward, args=args, train_dataset=data
    )


@pytest.mark.parametrize("trainer", [GRPOTrainer, MonitoredGRPOTrainer])
@pytest.mark.parametrize("fields", [{}, {"loss_type": "dapo", "ctn": "auto"}])
def test_an_sorl_config_given_to_a_trainer_without_the_sorl_loss_is_refused_at_construction(
    model_dir, tmp_path, trainer, fields
):
    with pytest.raises(
        ValueError, match="needs SORLGRPOTrainer"
    ):  # guards against TRL's own "Unknown loss type"
        build(trainer, model_dir, config(SORLGRPOConfig, tmp_path, **fields))  # after the first generation


def test_a_plain_config_asking_for_so_grpo_is_refused_by_the_monitored_trainer(model_dir, tmp_path):
    with pytest.raises(ValueError, match="needs SORLGRPOTrainer"):
        build(MonitoredGRPOTrainer, model_dir, config(GRPOConfig, tmp_path, loss_type="so_grpo"))


def test_an_sorl_config_with_trls_loss_and_no_ctn_is_a_plain_config_and_the_sorl_trainer_takes_any(
    model_dir, tmp_path
):
    build(GRPOTrainer, model_dir, config(SORLGRPOConfig, tmp_path, loss_type="dapo", ctn="off"))
    args = config(SORLGRPOConfig, tmp_path)
    assert build(SORLGRPOTrainer, model_dir, args).sorl.loss_type == "so_grpo"
    with pytest.raises(ValueError, match="needs SORLGRPOTrainer"):  # the same config, now to a plain one
        build(GRPOTrainer, model_dir, args)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"turn_is": "no"}, "turn_is must be True or False, not 'no'"),
        ({"turn_advantage": 1}, "turn_advantage must be True or False"),
        ({"ctn_coef_max": float("inf")}, "ctn_coef_max must be a finite number, not inf"),
        ({"ctn_coef": float("nan")}, "ctn_coef must be a finite number, not nan"),
        ({"dual_clip": float("inf")}, "dual_clip must be a finite number"),
        ({"ctn_kl_cap": "3"}, "ctn_kl_cap must be a finite number, not '3'"),
        ({"ctn_target_clip": 1.5}, "ctn_target_clip must be between 0 and 1"),
        ({"ctn_quiet_updates": 2.5}, "ctn_quiet_updates must be a whole number"),
    ],
)
def test_a_setting_that_is_not_a_boolean_or_a_finite_number_is_refused(tmp_path, fields, message):
    with pytest.raises(ValueError, match=message):
        SorlLossSettings.of(config(SORLGRPOConfig, tmp_path, **fields))
    with pytest.raises(ValueError, match=message):  # as a trainer's keyword argument too
        SorlLossSettings.of(config(SORLGRPOConfig, tmp_path), fields)


def test_the_sorl_trainer_refuses_a_bad_setting_at_construction(model_dir, tmp_path):
    with pytest.raises(ValueError, match="turn_is must be True or False"):
        build(SORLGRPOTrainer, model_dir, config(SORLGRPOConfig, tmp_path, turn_is="no"))
