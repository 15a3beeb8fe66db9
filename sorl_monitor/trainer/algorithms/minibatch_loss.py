"""The bundled trainer's loss of one mini-batch: the policy objective (``sorl_monitor.remedy.objective``, the one
implementation the TRL and verl adapters call too) plus the value loss, entropy bonus and reference KL::

    L = L_pg(ρ) [+ c_v · ½ mean_t (V(s_t) − G_t)²  with a critic]  + λ · c̄ · mean_t k3_c(log r_t)
        [− c_H · H]  [+ β · KL(π_θ‖π_ref)]

with the trainer's two CTN variants: whose clip fraction ``c̄`` is (``ctn_clip_level``) and which policy
its KL pulls back to (``ctn_anchor``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from sorl_monitor.remedy.objective import (
    ObjectiveSettings,
    clipped_surrogate,
    ctn_penalty,
    ctn_pull_share,
    dual_clip_fraction,
    surrogate_ratio,
)
from sorl_monitor.write.metrics import kl_k3, masked_mean, token_log_ratio


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
    ctn_pull: Tensor  # CTN's share of the loss's pull on log r (objective.ctn_pull_share), detached


@dataclass(frozen=True)
class LossSettings(ObjectiveSettings):
    """The objective's settings (``ObjectiveSettings``) and the bundled trainer's other loss knobs.
    (Defaults as ``TrainConfig``'s.)"""

    vf_coef: float = 0.5
    ent_coef: float = 0.0
    kl_ref_coef: float = 0.0
    gamma: float = 1.0
    gae_lambda: float = 1.0
    whiten: bool = True
    ctn_clip_level: str = "surrogate"
    """Whose clip fraction CTN multiplies: the surrogate's ratio ρ | ``token`` (r_t whatever ρ is) | ``proximal``
    (the token ratio π_θ/π_prox)."""
    ctn_anchor: str = "behaviour"
    """The policy CTN's KL pulls back to: ``behaviour`` (π_old, which made the rollout) or ``proximal``
    (π_prox, the learner when this batch's updates began; the same policy when rollouts are fresh)."""


def ratios(logp: Tensor, batch: Minibatch, turn_level: bool, mode: str) -> tuple[Tensor, Tensor]:
    """``(log r_t, ratio used by the surrogate)``: token ``r_t``, or turn ``w̄_k`` broadcast to its tokens."""
    log_ratio = token_log_ratio(logp, batch.old_logp)
    return log_ratio, surrogate_ratio(log_ratio, batch.turn_ids, batch.mask, turn_level, mode)


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


def value_loss(values: Tensor, returns: Tensor, mask: Tensor) -> Tensor:
    """``½ mean_t (V(s_t) − G_t)²`` over agent tokens."""
    return 0.5 * masked_mean((values - returns) ** 2, mask)


def kl_to_reference(logp: Tensor, ref_logp: Tensor, mask: Tensor) -> Tensor:
    """KL(π_θ‖π_ref) as GRPO's k3 with ``x = log π_ref − log π_θ``."""
    return masked_mean(kl_k3(ref_logp - logp), mask)


def combine(pg: Tensor, vf: Tensor, penalty: Tensor, frac: Tensor, dual_frac: Tensor, pull: Tensor,
            entropy: Tensor, logp: Tensor, batch: Minibatch, s: LossSettings) -> LossTerms:  # fmt: skip
    """``loss = pg + c_v·vf + CTN − c_H·H + β·KL(π_θ‖π_ref)``."""
    loss = pg + s.vf_coef * vf + penalty
    if s.ent_coef:
        loss = loss - s.ent_coef * masked_mean(entropy, batch.mask)
    if s.kl_ref_coef:
        loss = loss + s.kl_ref_coef * kl_to_reference(logp, batch.ref_logp, batch.mask)
    return LossTerms(
        loss, pg.detach(), vf.detach(), penalty.detach(), frac.detach(), dual_frac.detach(), pull
    )


def surrogate_loss(
    out, batch: Minibatch, s: LossSettings, ctn_coef: float, *, turn_level: bool, critic: bool
) -> LossTerms:
    """Every algorithm's loss: the clipped surrogate on the token or turn ratio, the value loss when there is
    a critic, CTN, and the optional entropy and reference-KL terms (``combine``)."""
    log_ratio, ratio = ratios(out.logp, batch, turn_level, s.turn_ratio)
    pg = clipped_surrogate(ratio, batch.advantages, batch.mask, s.clip_eps, s.clip_eps_high, s.dual_clip)
    vf = value_loss(out.values, batch.returns, batch.mask) if critic else torch.zeros_like(pg)
    ctn_ratio = ctn_clip_ratio(out.logp, log_ratio, ratio, batch, s)
    anchor_log_ratio = ctn_log_ratio(out.logp, log_ratio, batch, s)
    penalty, frac = ctn_penalty(anchor_log_ratio, ctn_ratio, batch.mask, ctn_coef, s)
    pull = ctn_pull_share(
        ratio.detach(), batch.advantages, anchor_log_ratio.detach(), batch.mask, ctn_coef * frac, s
    )
    dual_frac = dual_clip_fraction(ratio, batch.advantages, batch.mask, s.dual_clip)
    return combine(pg, vf, penalty, frac, dual_frac, pull, out.entropy, out.logp, batch, s)
