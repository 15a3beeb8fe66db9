"""Pieces every algorithm's loss is made of. Ratios, clipping and KL come from ``sorl_monitor.metrics``.

Shapes: ``(B, T)`` token tensors; ``mask`` is 1 on agent tokens; ``turn_ids`` the turn index of each
agent token (−1 elsewhere); per-episode tensors are ``(B,)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from sorl_monitor.metrics import (
    broadcast_turns,
    clip_fraction,
    kl_k3,
    masked_mean,
    token_log_ratio,
    turn_ratio,
    turn_sum,
)


@dataclass
class Minibatch:
    """What a loss needs from the rollout (rows of one mini-batch)."""

    mask: Tensor
    turn_ids: Tensor
    old_logp: Tensor  # behaviour policy π_old
    ref_logp: Tensor  # the warm-started reference policy
    advantages: Tensor  # (B, T), fixed for the iteration
    returns: Tensor  # (B, T) value targets
    old_values: Tensor  # (B, T)
    prox_logp: Tensor | None = None  # the learner π_prox as it was when this rollout batch's updates began


@dataclass
class LossTerms:
    loss: Tensor
    pg_loss: Tensor
    vf_loss: Tensor
    ctn_penalty: Tensor
    clip_frac: (
        Tensor  # what CTN multiplies: the clip fraction of the surrogate's (or the token) ratio, detached
    )
    dual_clip_frac: Tensor  # share of agent tokens the dual-clip bound caps (A < 0, ρ > c), detached


@dataclass(frozen=True)
class LossSettings:
    clip_eps: float = 0.2
    clip_eps_high: float = 0.2
    vf_coef: float = 0.5
    ent_coef: float = 0.0
    kl_ref_coef: float = 0.0
    turn_ratio: str = "geomean"
    gamma: float = 1.0
    gae_lambda: float = 1.0
    whiten: bool = True
    dual_clip: float | None = 3.0
    """Dual-clip bound ``c`` (> 1) on negative-advantage tokens; None: off. (Defaults as ``TrainConfig``'s.)"""
    ctn_clip_level: str = "surrogate"
    """Whose clip fraction CTN multiplies: the surrogate's ratio ρ | ``token`` (r_t whatever ρ is) | ``proximal``
    (the token ratio π_θ/π_prox)."""
    ctn_anchor: str = "behaviour"
    """The policy CTN's KL pulls back to: ``behaviour`` (π_old, which made the rollout) or ``proximal``
    (π_prox, the learner when this batch's updates began; the same policy when rollouts are fresh)."""
    ctn_kl_cap: float | None = 3.0
    """Cap ``c`` (> 1) on the gradient of CTN's k3: outside ``1/c ≤ r ≤ c`` it continues linearly in ``log r``
    (``kl_k3_capped``); None: plain k3, whose gradient ``r − 1`` is unbounded for stale ratios."""


# ------------------------------------------------------------------ advantages
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


def group_normalize(values: Tensor, group_ids: Tensor, valid: Tensor | None = None) -> Tensor:
    """``(x − mean_g) / (std_g + 1e-6)`` within each group of ``group_ids`` (entries with ``valid`` only)."""
    valid = torch.ones_like(values, dtype=torch.bool) if valid is None else valid.bool()
    flat_ids = group_ids.flatten()
    x = torch.where(valid, values, torch.zeros_like(values)).flatten()
    w = valid.flatten().to(values.dtype)
    size = torch.zeros(int(flat_ids.max()) + 1, dtype=values.dtype, device=values.device)
    count = size.index_add(0, flat_ids, w)
    mean = size.index_add(0, flat_ids, x) / count.clamp_min(1)
    var = size.index_add(0, flat_ids, w * (x - mean[flat_ids]) ** 2) / count.clamp_min(1)
    out = (x - mean[flat_ids]) / (var.sqrt()[flat_ids] + 1e-6)
    return (out * w).view_as(values)


# ------------------------------------------------------------------ loss terms
def ratios(logp: Tensor, batch: Minibatch, turn_level: bool, mode: str) -> tuple[Tensor, Tensor]:
    """``(log r_t, ratio used by the surrogate)``: token ``r_t``, or turn ``w̄_k`` broadcast to its tokens."""
    log_ratio = token_log_ratio(logp, batch.old_logp)
    if turn_level:
        return log_ratio, turn_ratio(log_ratio, batch.turn_ids, batch.mask.bool(), mode)
    return log_ratio, log_ratio.exp()


def clipped_surrogate(
    ratio: Tensor,
    advantages: Tensor,
    mask: Tensor,
    eps_low: float,
    eps_high: float,
    dual_clip: float | None = None,
) -> Tensor:
    """PPO's ``−mean_t min(ρ_t A_t, clip(ρ_t, 1−ε_low, 1+ε_high) A_t)`` over agent tokens.

    Dual-clip (Ye et al. 2020; verl's ``clip_ratio_c``): where ``A_t < 0`` the objective is also bounded
    below by ``c · A_t``, i.e. ``max(min(ρ A, clip(ρ) A), c A)``, so a token (or turn) whose ratio ran past
    ``c`` on a negative advantage gets no gradient instead of one weighted by ``ρ``.
    """
    unclipped = ratio * advantages
    clipped = ratio.clamp(1.0 - eps_low, 1.0 + eps_high) * advantages
    objective = torch.minimum(unclipped, clipped)
    if dual_clip is not None:
        objective = torch.where(advantages < 0, torch.maximum(objective, dual_clip * advantages), objective)
    return -masked_mean(objective, mask)


def ctn_penalty(
    log_ratio: Tensor, ratio: Tensor, mask: Tensor, coef: float, s: LossSettings
) -> tuple[Tensor, Tensor]:
    """Clipping-Triggered Normalization ``λ · clip_fraction · KL`` and the clip fraction.

    ``clip_fraction`` (of ``ratio``, detached) is the share of agent tokens outside the trust region;
    ``KL = mean_t (r_t − 1 − log r_t)`` with ``log r_t = log_ratio`` (log π_θ − log π_anchor), Schulman's
    k3 on the rollout's samples (bounded below by 0); with ``s.ctn_kl_cap = c`` (3 by default) each token's
    k3 continues along its tangent in ``log r`` beyond ``r = c`` and below ``1/c`` (``kl_k3_capped``).
    """
    frac = clip_fraction(ratio.detach(), mask, s.clip_eps, s.clip_eps_high)["total"]
    if coef == 0.0:
        return torch.zeros((), device=ratio.device), frac
    return coef * frac * masked_mean(kl_k3_capped(log_ratio, s.ctn_kl_cap), mask), frac


def ctn_log_ratio(logp: Tensor, behaviour_log_ratio: Tensor, batch: Minibatch, s: LossSettings) -> Tensor:
    """``log π_θ − log π_anchor`` for CTN's KL: the behaviour policy's, or the proximal policy's
    (``s.ctn_anchor``; with stale rollouts a pull back to π_old is a pull towards an older learner)."""
    if s.ctn_anchor == "behaviour":
        return behaviour_log_ratio
    if batch.prox_logp is None:
        raise ValueError("ctn_anchor='proximal' needs the minibatch's prox_logp (π_prox log-probs)")
    return token_log_ratio(logp, batch.prox_logp)


def ctn_clip_ratio(
    logp: Tensor, log_ratio: Tensor, ratio: Tensor, batch: Minibatch, s: LossSettings
) -> Tensor:
    """The ratio whose clip fraction CTN multiplies (``s.ctn_clip_level``): the surrogate's ``ρ``, the token
    ``r_t = π_θ/π_old``, or the token ``π_θ/π_prox`` (the drift of this batch's updates alone)."""
    if s.ctn_clip_level == "surrogate":
        return ratio
    if s.ctn_clip_level == "token":
        return log_ratio.exp()
    if batch.prox_logp is None:
        raise ValueError("ctn_clip_level='proximal' needs the minibatch's prox_logp (π_prox log-probs)")
    return token_log_ratio(logp, batch.prox_logp).exp()


def kl_k3_capped(log_ratio: Tensor, cap: float | None) -> Tensor:
    """Schulman's k3 ``r − 1 − log r`` for ``|log r| ≤ log c``, continued by its tangent beyond, so its gradient
    in ``log r`` is ``r − 1`` inside and ``c − 1`` (or ``1/c − 1``) outside (our bounded form; None: plain k3)::

        x̂ = clamp(log r, −log c, log c);  KL = k3(x̂) + (e^x̂ − 1)(log r − x̂)
    """
    if cap is None:
        return kl_k3(log_ratio)
    bound = math.log(cap)
    inside = log_ratio.clamp(-bound, bound)
    return kl_k3(inside) + (inside.exp() - 1.0) * (log_ratio - inside)


def value_loss(values: Tensor, returns: Tensor, mask: Tensor) -> Tensor:
    """``½ mean_t (V(s_t) − G_t)²`` over agent tokens."""
    return 0.5 * masked_mean((values - returns) ** 2, mask)


def kl_to_reference(logp: Tensor, ref_logp: Tensor, mask: Tensor) -> Tensor:
    """KL(π_θ‖π_ref) as GRPO's k3 with ``x = log π_ref − log π_θ``."""
    return masked_mean(kl_k3(ref_logp - logp), mask)


def combine(pg: Tensor, vf: Tensor, penalty: Tensor, frac: Tensor, dual_frac: Tensor, entropy: Tensor,
            logp: Tensor, batch: Minibatch, s: LossSettings) -> LossTerms:  # fmt: skip
    """``loss = pg + c_v·vf + CTN − c_H·H + β·KL(π_θ‖π_ref)``."""
    loss = pg + s.vf_coef * vf + penalty
    if s.ent_coef:
        loss = loss - s.ent_coef * masked_mean(entropy, batch.mask)
    if s.kl_ref_coef:
        loss = loss + s.kl_ref_coef * kl_to_reference(logp, batch.ref_logp, batch.mask)
    return LossTerms(loss, pg.detach(), vf.detach(), penalty.detach(), frac.detach(), dual_frac.detach())


def surrogate_loss(
    out, batch: Minibatch, s: LossSettings, ctn_coef: float, *, turn_level: bool, critic: bool
) -> LossTerms:
    """Every algorithm's loss: the clipped surrogate on the token or turn ratio, the value loss when there is
    a critic, CTN, and the optional entropy and reference-KL terms (``combine``)."""
    log_ratio, ratio = ratios(out.logp, batch, turn_level, s.turn_ratio)
    pg = clipped_surrogate(ratio, batch.advantages, batch.mask, s.clip_eps, s.clip_eps_high, s.dual_clip)
    vf = value_loss(out.values, batch.returns, batch.mask) if critic else torch.zeros_like(pg)
    ctn_ratio = ctn_clip_ratio(out.logp, log_ratio, ratio, batch, s)
    penalty, frac = ctn_penalty(
        ctn_log_ratio(out.logp, log_ratio, batch, s), ctn_ratio, batch.mask, ctn_coef, s
    )
    capped = (
        (batch.advantages < 0) & (ratio > s.dual_clip) if s.dual_clip is not None else torch.zeros_like(ratio)
    )
    return combine(
        pg, vf, penalty, frac, masked_mean(capped.float(), batch.mask), out.entropy, out.logp, batch, s
    )
