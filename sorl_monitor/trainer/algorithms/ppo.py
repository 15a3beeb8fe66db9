"""PPO with token-level importance sampling and GAE (the baseline that collapses under heavy reuse).

r_t   = π_θ(y_t) / π_old(y_t)                                   per agent token
A_t   = GAE(γ, λ) over agent tokens, whitened                   (γ = λ = 1: A_t = R − V(s_t))
L_pg  = −mean_t min(r_t A_t, clip(r_t, 1−ε_low, 1+ε_high) A_t)
L     = L_pg + c_v · ½ mean_t (V(s_t) − G_t)²   [+ λ · clip_frac · KL_k3 when CTN is on]
"""

from __future__ import annotations

from torch import Tensor

from sorl_monitor.trainer.algorithms.common import (
    LossSettings,
    LossTerms,
    Minibatch,
    gae,
    surrogate_loss,
    whiten,
)  # fmt: skip

CRITIC = True
TURN_LEVEL = False
DEFAULT_CTN = "off"


def advantages(rewards: Tensor, values: Tensor, mask: Tensor, turn_ids: Tensor, group_ids: Tensor,
               s: LossSettings) -> tuple[Tensor, Tensor]:  # fmt: skip
    """Token GAE advantages (whitened) and value targets ``G_t = A_t + V(s_t)`` (before whitening)."""
    adv = gae(rewards, values, mask, s.gamma, s.gae_lambda)
    returns = (adv + values) * mask
    return (whiten(adv, mask) if s.whiten else adv), returns


def loss(out, batch: Minibatch, s: LossSettings, ctn_coef: float) -> LossTerms:
    return surrogate_loss(out, batch, s, ctn_coef, turn_level=TURN_LEVEL, critic=CRITIC)
