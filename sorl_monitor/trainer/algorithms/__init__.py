"""The algorithms, one module of loss math each (CleanRL style). Each module defines ``CRITIC``,
``TURN_LEVEL``, ``DEFAULT_CTN``, ``advantages(rewards, values, mask, turn_ids, group_ids, settings)``
and ``loss(policy_output, minibatch, settings, ctn_coef)``."""

from __future__ import annotations

from types import ModuleType

from sorl_monitor.trainer.algorithms import grpo, ppo, s_ppo, so_grpo, so_ppo, turn_ppo

ALGORITHMS: dict[str, ModuleType] = {
    "ppo": ppo,
    "turn_ppo": turn_ppo,
    "s_ppo": s_ppo,
    "so_ppo": so_ppo,
    "st_ppo": so_ppo,  # the paper's v1 name for SO-PPO
    "grpo": grpo,
    "so_grpo": so_grpo,
}


def get_algorithm(name: str) -> ModuleType:
    try:
        return ALGORITHMS[name]
    except KeyError:
        raise ValueError(f"unknown algorithm {name!r}; choose one of {', '.join(ALGORITHMS)}") from None
