"""The four advantage estimators the algorithms use (``(B, T)`` token tensors, ``(B,)`` episode tensors),
and the pieces they are made of (GAE, the turn advantage, whitening; the group normalizations are the
objective's, ``sorl_monitor.remedy.objective``, which the TRL adapter uses too).

Each estimator returns ``(advantages, value targets)`` on agent tokens; an algorithm without a critic gets
zeros as value targets. ``mask`` is 1 on agent tokens, ``turn_ids`` each agent token's turn index (−1 elsewhere).
"""

from __future__ import annotations

import torch
from torch import Tensor

from sorl_monitor.remedy.objective import group_normalize, turn_group_advantages
from sorl_monitor.trainer.algorithms.minibatch_loss import LossSettings
from sorl_monitor.write.metrics import broadcast_turns, masked_mean, turn_sum


# ------------------------------------------------------------------ pieces
def compact_policy_tokens(mask: Tensor) -> tuple[Tensor, Tensor]:
    """Column order that puts each row's agent tokens first, in sequence order, and their count mask."""
    order = torch.argsort((~mask.bool()).to(torch.int8), dim=1, stable=True)
    return order, mask.gather(1, order).bool()


def gae(rewards: Tensor, values: Tensor, mask: Tensor, gamma: float, lam: float) -> Tensor:
    """Token-level GAE over agent tokens only (observations are skipped), terminal reward ``rewards (B,)``.

    ``δ_j = r_j + γ V_{j+1} − V_j`` over the j-th agent token of a row (``V`` past the last one is 0,
    ``r_j`` is the reward on the last one), ``A_j = Σ_{i≥j} (γλ)^{i−j} δ_i`` — one matrix product,
    no loop over tokens. With ``γ = λ = 1``: ``A_j = R − V_j``.
    """
    order, valid = compact_policy_tokens(mask)
    v = values.gather(1, order) * valid
    n = valid.sum(1, keepdim=True)
    j = torch.arange(mask.shape[1], device=mask.device).unsqueeze(0)
    r = torch.where(j == n - 1, rewards.unsqueeze(1), torch.zeros_like(v))
    v_next = torch.nn.functional.pad(v[:, 1:], (0, 1))
    delta = (r + gamma * v_next - v) * valid
    i = torch.arange(mask.shape[1], device=mask.device)
    power = (i.unsqueeze(1) - i.unsqueeze(0)).clamp_min(0).to(values.dtype)  # [i, j] = i − j
    weights = torch.where(i.unsqueeze(1) >= i.unsqueeze(0), (gamma * lam) ** power, torch.zeros_like(power))
    compact = delta @ weights  # A_j = Σ_i δ_i w[i, j]
    out = torch.zeros_like(values).scatter(1, order, compact * valid)
    return out


def turn_starts(mask: Tensor, turn_ids: Tensor) -> Tensor:
    """True on the first agent token of each turn."""
    previous = torch.nn.functional.pad(turn_ids[:, :-1], (1, 0), value=-1)
    return mask.bool() & (turn_ids != previous)


def turn_advantage(rewards: Tensor, values: Tensor, mask: Tensor, turn_ids: Tensor, gamma: float) -> Tensor:
    """Turn-level advantage ``A_k = R_k − V(s_k)`` broadcast to turn ``k``'s tokens.

    ``R_k = γ^{K−1−k} R`` (the terminal reward seen from turn ``k`` of ``K``), ``V(s_k)`` = the value at
    the turn's first token (the state the turn starts from).
    """
    starts = turn_starts(mask, turn_ids)
    v_start = turn_sum(values, turn_ids, starts)  # (B, T): column k = V(s_k)
    n_turns = (turn_ids.amax(1, keepdim=True) + 1).clamp_min(1)
    k = torch.arange(mask.shape[1], device=mask.device).unsqueeze(0)
    r_k = rewards.unsqueeze(1) * gamma ** (n_turns - 1 - k).clamp_min(0).to(values.dtype)
    return broadcast_turns(r_k - v_start, turn_ids) * mask


def whiten(advantages: Tensor, mask: Tensor) -> Tensor:
    """``(A − mean) / (std + 1e-8)`` over agent tokens."""
    mean = masked_mean(advantages, mask)
    std = masked_mean((advantages - mean) ** 2, mask).sqrt()
    return (advantages - mean) / (std + 1e-8) * mask


# ------------------------------------------------------------------ estimators
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
    return turn_group_advantages(rewards, group_ids, turn_ids) * mask, torch.zeros_like(values)
