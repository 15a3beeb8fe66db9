"""The post-mortem's remedy names the switch of the trainer a run came from (``postmortem.remedy_for``)."""

from __future__ import annotations

import dataclasses

import pytest

from sorl_monitor.diagnose.postmortem import CAUSES
from sorl_monitor.diagnose.postmortem.causes import remedy_for, trainer_family
from sorl_monitor.trainer.config import TrainConfig


@pytest.mark.parametrize(
    "algorithm, config, family",
    [
        ("ppo", dataclasses.asdict(TrainConfig()), "bundled"),
        ("so_grpo", dataclasses.asdict(TrainConfig(algo="so_grpo")), "bundled"),
        ("grpo", {"num_generations": 8, "per_device_train_batch_size": 8, "beta": 0.0}, "trl"),
        ("sorlgrpo", {"per_device_train_batch_size": 4}, "trl"),
        ("so_ppo", {"clip_ratio_c": 3.0, "ppo_mini_batch_size": 256}, "verl"),
        ("verl", {}, "verl"),
        (None, {}, None),
    ],
)
def test_the_trainer_family_comes_from_the_runs_config(algorithm, config, family):
    assert trainer_family(algorithm, config) == family


def test_trl_and_verl_runs_get_their_switch_and_the_bundled_trainer_keeps_the_text():
    cause = "off_policy_variance"
    assert remedy_for(cause, "bundled") == remedy_for(cause, None) == CAUSES[cause][1]
    assert remedy_for(cause, "trl").endswith(
        "`SORLGRPOTrainer(..., ctn='auto')` with "
        "`SORLGRPOConfig(loss_type='so_grpo')` (sorl_monitor.integrations.trl_so_grpo)."
    )
    assert "`actor.policy_loss.loss_mode=so_ppo`" in remedy_for("granularity_mismatch", "verl")
    assert remedy_for("entropy_blowup", "trl") == CAUSES["entropy_blowup"][1]  # no CTN/turn-IS remedy there
