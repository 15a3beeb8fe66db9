"""GRPO: group-normalized outcome advantage, token-level IS, no critic.

    A_i   = (R_i − mean_{j∈g(i)} R_j) / (std_{j∈g(i)} R_j + 1e-6)     for every token of episode i
    L     = −mean_t min(r_t A_i, clip(r_t, 1−ε_low, 1+ε_high) A_i)  [+ β · KL(π_θ‖π_ref)] [+ CTN]

Each prompt is answered ``group_size`` times; a group whose rewards are all equal has no signal.
"""

from __future__ import annotations

import torch
from torch import Tensor

from sorl_monitor.trainer.algorithms.common import (
    LossSettings,
    LossTerms,
    Minibatch,
    group_normalize,
    surrogate_loss,
)  # fmt: skip

CRITIC = False
TURN_LEVEL = False
DEFAULT_CTN = "off"


def advantages(rewards: Tensor, values: Tensor, mask: Tensor, turn_ids: Tensor, group_ids: Tensor,
               s: LossSettings) -> tuple[Tensor, Tensor]:  # fmt: skip
    """The episode's group-normalized reward on each of its agent tokens; no value targets (zeros)."""
    adv = group_normalize(rewards, group_ids).unsqueeze(1) * mask
    return adv, torch.zeros_like(values)


def loss(out, batch: Minibatch, s: LossSettings, ctn_coef: float) -> LossTerms:
    return surrogate_loss(out, batch, s, ctn_coef, turn_level=TURN_LEVEL, critic=CRITIC)
