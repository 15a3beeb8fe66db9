"""The SO-PPO / SO-GRPO policy objective: one implementation, called by the bundled trainer, TRL and verl.

Shapes: ``(B, T)`` token tensors; ``mask`` is 1 on the agent's tokens (0 on prompt, tool/observation and
padding tokens); ``turn_ids`` numbers each agent token's turn 0, 1, … per row (−1 elsewhere), given by the
trainer or made from a mask by ``turn_ids_from_mask`` (contiguous runs of 1: TRL's ``completion_mask ×
tool_mask``, verl's ``response_mask``). Ratios, clipping and KL estimators are ``sorl_monitor.write.metrics``'s,
the same functions the monitor logs with::

    log r_t = log π_θ(y_t) − log π_old(y_t)                         token ratio r_t
    w̄_k     = exp(mean_{t∈k} log r_t)   (geometric, "geomean")     turn ratio of turn k
            = mean_{t∈k} r_t             (arithmetic, "mean")
    ρ_t     = r_t (token level)  or  w̄_{k(t)} (turn level)
    L_pg    = −mean_t w_t · J_t,  J_t = min(ρ_t A_t, clip(ρ_t, 1−ε_low, 1+ε_high) A_t),
              and where A_t < 0: J_t = max(J_t, c·A_t)               (dual-clip bound c, verl's clip_ratio_c)
              w_t = rollout correction weights (verl's rollout_is_weights), 1 when absent
    c̄       = share of agent tokens with ρ_t ∉ [1−ε_low, 1+ε_high]  (detached)
    L_CTN   = λ · c̄ · mean_t k3_c(log r_t)                          Clipping-Triggered Normalization
    k3_c(x) = k3(x̂) + (e^x̂ − 1)(x − x̂),  x̂ = clamp(x, −log c, log c),  k3(x) = e^x − 1 − x
              (Schulman's k3 continued along its tangent: gradient e^x − 1 inside, ≤ c − 1 outside)
    λ       ← 2λ if c̄_batch > 1.5·target,  λ/2 if c̄_batch < target/1.5,  within [low, high]  (``ctn.AdaptiveCtnCoef``)
    pull    = Σ_t λ c̄ |e^x̂_t − 1| / (Σ_t λ c̄ |e^x̂_t − 1| + Σ_t w_t |ρ_t A_t| 1[J_t has a gradient])
              CTN's share of the loss's gradient in log r_t, summed over agent tokens (``ctn_pull_share``)

SO-PPO is the turn-level ρ with CTN on a critic's turn advantage; SO-GRPO the turn-level ρ with CTN on the
group advantage taken per turn (``turn_group_advantages``). CTN's ``λ · clip_fraction · KL`` is our
interpretation of the paper's clipping-bias normalizer, which is not public.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from sorl_monitor.remedy.ctn import CTN_DEFAULTS
from sorl_monitor.write.metrics import (
    broadcast_turns,
    clip_active,
    clip_fraction,
    kl_k3,
    masked_mean,
    token_log_ratio,
    turn_ids_from_mask,
    turn_ratio,
)

TURN_RATIO_FORMS = ("geomean", "mean")
"""``w̄_k``'s forms: geometric (``exp(mean log r)``, the default) and arithmetic (``mean r``, what the monitor
logs); docs/schema.md, "The turn ratio"."""

__all__ = [
    "TURN_RATIO_FORMS",
    "ObjectiveSettings",
    "PolicyTerms",
    "clipped_surrogate",
    "ctn_penalty",
    "ctn_pull_share",
    "dual_clip_fraction",
    "group_normalize",
    "kl_k3_capped",
    "policy_objective",
    "surrogate_objective",
    "surrogate_ratio",
    "turn_group_advantages",
    "turn_ids_from_mask",
]


@dataclass(frozen=True)
class ObjectiveSettings:
    """The objective's knobs (defaults: the bundled trainer's)."""

    clip_eps: float = 0.2
    clip_eps_high: float = 0.2
    dual_clip: float | None = 3.0
    """Dual-clip bound ``c`` (> 1) on negative-advantage tokens; None: off (TRL's default)."""
    turn_ratio: str = "geomean"
    """``w̄_k``'s form: ``geomean`` | ``mean`` (``TURN_RATIO_FORMS``)."""
    ctn_kl_cap: float | None = CTN_DEFAULTS.ctn_kl_cap
    """Cap ``c`` (> 1) on the gradient of CTN's k3 (``kl_k3_capped``); None: plain k3."""


@dataclass
class PolicyTerms:
    """``policy_objective``'s result: the two loss terms (with grad) and what they were made of (detached)."""

    pg_loss: Tensor
    ctn_penalty: Tensor
    clip_frac: Tensor
    """The clip fraction ``c̄`` CTN multiplies (of the surrogate's ρ)."""
    dual_clip_frac: Tensor
    """Share of agent tokens the dual-clip bound caps (``A < 0, ρ > c``)."""
    ratio: Tensor
    """The surrogate's ρ per token (detached)."""
    ctn_pull: Tensor
    """CTN's share of the loss's pull on ``log r`` (``ctn_pull_share``; detached, 0 with CTN off)."""

    @property
    def loss(self) -> Tensor:
        return self.pg_loss + self.ctn_penalty


def surrogate_ratio(log_ratio: Tensor, turn_ids: Tensor | None, mask: Tensor, turn_level: bool,
                    form: str = "geomean") -> Tensor:  # fmt: skip
    """ρ: the token ratio ``r_t = exp(log r_t)``, or the turn ratio ``w̄_k`` (``form``) broadcast to turn k."""
    if not turn_level:
        return log_ratio.exp()
    if turn_ids is None:
        turn_ids = turn_ids_from_mask(mask)
    return turn_ratio(log_ratio, turn_ids, mask.bool(), form)


def surrogate_objective(ratio: Tensor, advantages: Tensor, eps_low: float, eps_high: float,
                        dual_clip: float | None = None) -> Tensor:  # fmt: skip
    """Per token ``J_t = min(ρ A, clip(ρ, 1−ε_low, 1+ε_high) A)``, with dual-clip ``max(J_t, c·A)`` where ``A < 0``
    (Ye et al. 2020; verl's ``clip_ratio_c``): a token (or turn) whose ratio ran past ``c`` on a negative
    advantage gets no gradient instead of one weighted by ρ."""
    unclipped = ratio * advantages
    clipped = ratio.clamp(1.0 - eps_low, 1.0 + eps_high) * advantages
    objective = torch.minimum(unclipped, clipped)
    if dual_clip is not None:
        objective = torch.where(advantages < 0, torch.maximum(objective, dual_clip * advantages), objective)
    return objective


def clipped_surrogate(
    ratio: Tensor,
    advantages: Tensor,
    mask: Tensor,
    eps_low: float,
    eps_high: float,
    dual_clip: float | None = None,
    weights: Tensor | None = None,
) -> Tensor:
    """PPO's ``L_pg = −mean_t w_t J_t`` over agent tokens (``surrogate_objective``; ``weights`` w_t: verl's
    rollout correction, None: 1)."""
    objective = surrogate_objective(ratio, advantages, eps_low, eps_high, dual_clip)
    if weights is not None:
        objective = objective * weights
    return -masked_mean(objective, mask)


def dual_clip_fraction(ratio: Tensor, advantages: Tensor, mask: Tensor, dual_clip: float | None) -> Tensor:
    """Share of agent tokens whose objective the dual-clip bound caps: ``A < 0`` and ``ρ > c`` (detached)."""
    if dual_clip is None:
        return masked_mean(torch.zeros_like(ratio), mask).detach()
    return masked_mean(((advantages < 0) & (ratio > dual_clip)).float(), mask).detach()


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


def ctn_penalty(log_ratio: Tensor, ratio: Tensor, mask: Tensor, coef: float,
                s: ObjectiveSettings) -> tuple[Tensor, Tensor]:  # fmt: skip
    """Clipping-Triggered Normalization ``λ · c̄ · mean_t k3_c(log r_t)`` and ``c̄``.

    ``c̄`` is the clip fraction of ``ratio`` (detached: the share of agent tokens outside the trust region);
    ``log_ratio`` is ``log π_θ − log π_anchor`` (π_old by default), ``c`` = ``s.ctn_kl_cap``. With ``coef`` 0
    the penalty is an exact zero with no graph.
    """
    frac = clip_fraction(ratio.detach(), mask, s.clip_eps, s.clip_eps_high)["total"]
    if coef == 0.0:
        return torch.zeros((), device=ratio.device), frac
    return coef * frac * masked_mean(kl_k3_capped(log_ratio, s.ctn_kl_cap), mask), frac


def ctn_pull_share(ratio: Tensor, advantages: Tensor, ctn_log_ratio: Tensor, mask: Tensor, ctn_scale: Tensor,
                   s: ObjectiveSettings, weights: Tensor | None = None) -> Tensor:  # fmt: skip
    """CTN's share of the policy loss's gradient in ``log r_t``, summed in magnitude over agent tokens (detached)::

        g_CTN,t = λ c̄ |e^x̂_t − 1|       (``kl_k3_capped``'s slope, x̂ clamped to ±log c)
        g_pg,t  = w_t |ρ_t A_t|          where J_t has a gradient (inside the clip, or on its improving side,
                                        and not capped by dual-clip); 0 elsewhere
        pull    = Σ g_CTN / (Σ g_CTN + Σ g_pg)

    ``ctn_scale`` is ``λ · c̄``. Near 1, CTN's pull back to the anchor, not the policy gradient, moves the
    policy. Exact for the token ratio and for the geometric turn ratio with one advantage per turn (SO-GRPO's);
    elsewhere ``g_pg`` is an upper bound (the turn's slope is the mean of its tokens' ``A_t``).
    """
    with torch.no_grad():
        alive = ~clip_active(ratio, advantages, s.clip_eps, s.clip_eps_high)
        if s.dual_clip is not None:
            alive &= ~((advantages < 0) & (ratio > s.dual_clip))
        pg = (ratio * advantages).abs() * alive * mask
        if weights is not None:
            pg = pg * weights
        bound = math.inf if s.ctn_kl_cap is None else math.log(s.ctn_kl_cap)
        ctn = ctn_scale * (ctn_log_ratio.clamp(-bound, bound).exp() - 1.0).abs() * mask
        ctn_sum = ctn.sum()
        return ctn_sum / (ctn_sum + pg.sum()).clamp_min(1e-12)


def policy_objective(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    turn_ids: Tensor | None = None,
    *,
    turn_level: bool,
    ctn_coef: float = 0.0,
    settings: ObjectiveSettings | None = None,
    weights: Tensor | None = None,
) -> PolicyTerms:
    """SO-PPO / SO-GRPO's policy loss ``L_pg + L_CTN`` on one (micro-)batch (module docstring).

    ``advantages`` is ``(B, T)`` or ``(B,)`` (one per sequence, broadcast); ``turn_ids`` None: the turns are
    ``mask``'s runs of 1; ``turn_level`` False gives token PPO / GRPO (with CTN when ``ctn_coef`` > 0);
    ``weights``: per-token rollout-correction weights on the surrogate. Both terms are token means over
    ``mask``; a trainer with another aggregation uses the pieces (``surrogate_objective``, ``ctn_penalty``).
    """
    s = settings or ObjectiveSettings()
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(1).expand_as(logp)
    mask = mask.to(logp.dtype)
    log_ratio = token_log_ratio(logp, old_logp)
    if turn_level and turn_ids is None:
        turn_ids = turn_ids_from_mask(mask)
    ratio = surrogate_ratio(log_ratio, turn_ids, mask, turn_level, s.turn_ratio)
    pg = clipped_surrogate(ratio, advantages, mask, s.clip_eps, s.clip_eps_high, s.dual_clip, weights)
    penalty, frac = ctn_penalty(log_ratio, ratio, mask, ctn_coef, s)
    pull = ctn_pull_share(ratio.detach(), advantages, log_ratio.detach(), mask, ctn_coef * frac, s, weights)
    return PolicyTerms(pg, penalty, frac.detach(), dual_clip_fraction(ratio, advantages, mask, s.dual_clip),
                       ratio.detach(), pull)  # fmt: skip


def group_normalize(values: Tensor, group_ids: Tensor, valid: Tensor | None = None) -> Tensor:
    """GRPO's ``(x − mean_g) / (std_g + 1e-6)`` within each group of ``group_ids`` (population std; entries
    with ``valid`` only, 0 elsewhere)."""
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


def turn_group_advantages(rewards: Tensor, group_ids: Tensor, turn_ids: Tensor) -> Tensor:
    """SO-GRPO's advantage of turn k of episode i, on that turn's tokens (0 off any turn)::

        A_{i,k} = (R_i − mean_{j∈g(i), j reached turn k} R_j) / (std_{same} + 1e-6)

    The group statistics are taken per turn index over the group's episodes that played turn k, so a late
    turn is judged against the episodes that got as far (our reading of "group-normalized advantage computed
    per turn", an interpretation). ``rewards``, ``group_ids`` ``(B,)``; ``turn_ids`` ``(B, T)``.
    """
    batch, length = turn_ids.shape
    n_turns = turn_ids.amax(1) + 1  # (B,)
    k = torch.arange(length, device=turn_ids.device).unsqueeze(0)
    played = k < n_turns.unsqueeze(1)  # (B, T): column k = turn k was played
    cell = group_ids.unsqueeze(1) * length + k  # one id per (group, turn index)
    per_turn = group_normalize(rewards.unsqueeze(1).expand(batch, length), cell, played)
    return broadcast_turns(per_turn, turn_ids)
