"""The four advantage estimators the algorithms use (``(B, T)`` token tensors, ``(B,)`` episode tensors).

Each returns ``(advantages, value targets)`` on agent tokens; an algorithm without a critic gets zeros as
value targets.
"""

from __future__ import annotations

import torch
from torch import Tensor

from sorl_monitor.metrics import broadcast_turns
from sorl_monitor.trainer.algorithms.common import LossSettings, gae, group_normalize, turn_advantage, whiten


def token_gae(rewards: Tensor, values: Tensor, mask: Tensor, turn_ids: Tensor, group_ids: Tensor,
              s: LossSettings) -> tuple[Tensor, Tensor]:  # fmt: skip
    """PPO, S-PPO: ``A_t = GAE(γ, λ)`` over agent tokens (γ = λ = 1: ``A_t = R − V(s_t)``), whitened;
    value targets ``G_t = A_t + V(s_t)`` (before whitening)."""
    adv = gae(rewards, values, mask, s.gamma, s.gae_lambda)
    returns = (adv + values) * mask
    return (whiten(adv, mask) if s.whiten else adv), returns


def turn_level(rewards: Tensor, values: Tensor, mask: Tensor, turn_ids: Tensor, group_ids: Tensor,
               s: LossSettings) -> tuple[Tensor, Tensor]:  # fmt: skip
    """Turn-PPO, SO-PPO: ``A_k = R_k − V(s_k)`` (``V(s_k)`` the value at turn k's first token) broadcast to the
    turn's tokens, whitened; value targets ``R_k`` on every token of turn k. Every token of a turn shares its
    turn's advantage: the update's granularity is the episode's (one turn = one action of the agent)."""
    adv = turn_advantage(rewards, values, mask, turn_ids, s.gamma)
    returns = turn_advantage(rewards, values * 0, mask, turn_ids, s.gamma)  # R_k
    return (whiten(adv, mask) if s.whiten else adv), returns


def group(rewards: Tensor, values: Tensor, mask: Tensor, turn_ids: Tensor, group_ids: Tensor,
          s: LossSettings) -> tuple[Tensor, Tensor]:  # fmt: skip
    """GRPO: ``A_i = (R_i − mean_{j∈g(i)} R_j) / (std_{j∈g(i)} R_j + 1e-6)`` on every token of episode i (each
    prompt is answered ``group_size`` times; a group whose rewards are all equal has no signal)."""
    adv = group_normalize(rewards, group_ids).unsqueeze(1) * mask
    return adv, torch.zeros_like(values)


def turn_group(rewards: Tensor, values: Tensor, mask: Tensor, turn_ids: Tensor, group_ids: Tensor,
               s: LossSettings) -> tuple[Tensor, Tensor]:  # fmt: skip
    """SO-GRPO: ``A_{i,k} = (R_i − mean_{j∈g(i), j reached turn k} R_j) / (std_{same} + 1e-6)`` on turn k's
    tokens: the group statistics are taken per turn index over the group's episodes that played that turn,
    so a late turn is judged against the episodes that got as far (our reading of "group-normalized
    advantage computed per turn"; an interpretation, labelled as such)."""
    batch, length = mask.shape
    n_turns = turn_ids.amax(1) + 1  # (B,)
    k = torch.arange(length, device=mask.device).unsqueeze(0)
    played = k < n_turns.unsqueeze(1)  # (B, T): column k = turn k was played
    cell = group_ids.unsqueeze(1) * length + k  # one id per (group, turn index)
    per_turn = group_normalize(rewards.unsqueeze(1).expand(batch, length), cell, played)
    return broadcast_turns(per_turn, turn_ids) * mask, torch.zeros_like(values)
