"""SO-GRPO: GRPO with a turn-level group advantage, turn-level IS and Clipping-Triggered Normalization.

    A_{i,k} = (R_i − mean_{j∈g(i), j reached turn k} R_j) / (std_{same} + 1e-6)   for turn k of episode i
    L       = −mean_t min(w̄_k A_{i,k}, clip(w̄_k) A_{i,k}) + λ · clip_frac(w̄) · mean_t (r_t − 1 − log r_t)

The group statistics are taken per turn index over the group's episodes that played that turn, so a
late turn is judged against the episodes that got as far (our reading of "group-normalized
advantage computed per turn"; an interpretation, labelled as such). ``w̄_k`` is the turn ratio.
"""

from __future__ import annotations

import torch
from torch import Tensor

from sorl_monitor.metrics import broadcast_turns
from sorl_monitor.trainer.algorithms.common import (
    LossSettings,
    LossTerms,
    Minibatch,
    group_normalize,
    surrogate_loss,
)  # fmt: skip

CRITIC = False
TURN_LEVEL = True
DEFAULT_CTN = "on"


def advantages(rewards: Tensor, values: Tensor, mask: Tensor, turn_ids: Tensor, group_ids: Tensor,
               s: LossSettings) -> tuple[Tensor, Tensor]:  # fmt: skip
    """Per (group, turn index) normalized reward, broadcast to the turn's tokens; no value targets."""
    batch, length = mask.shape
    n_turns = turn_ids.amax(1) + 1  # (B,)
    k = torch.arange(length, device=mask.device).unsqueeze(0)
    played = k < n_turns.unsqueeze(1)  # (B, T): column k = turn k was played
    cell = group_ids.unsqueeze(1) * length + k  # one id per (group, turn index)
    per_turn = group_normalize(rewards.unsqueeze(1).expand(batch, length), cell, played)
    return broadcast_turns(per_turn, turn_ids) * mask, torch.zeros_like(values)


def loss(out, batch: Minibatch, s: LossSettings, ctn_coef: float) -> LossTerms:
    return surrogate_loss(out, batch, s, ctn_coef, turn_level=TURN_LEVEL, critic=CRITIC)
