"""Turn-PPO: turn-level importance sampling and a turn-level advantage.

    w̄_k  = mean_{t∈k} r_t                    (``turn_ratio="geomean"``: exp(mean_{t∈k} log r_t))
    A_k   = R_k − V(s_k)                      V(s_k) = value at turn k's first token, whitened
    L_pg  = −mean_t min(w̄_k(t) A_k(t), clip(w̄_k(t), 1−ε_low, 1+ε_high) A_k(t))
    L     = L_pg + c_v · ½ mean_t (V(s_t) − R_k(t))²   [+ λ · clip_frac(w̄) · KL_k3 when CTN is on]

Every token of a turn shares its turn's ratio and advantage: the granularity of the update matches
the granularity of the episode (one turn = one action of the agent).
"""

from __future__ import annotations

from torch import Tensor

from sorl_monitor.trainer.algorithms.common import (
    LossSettings,
    LossTerms,
    Minibatch,
    surrogate_loss,
    turn_advantage,
    whiten,
)  # fmt: skip

CRITIC = True
TURN_LEVEL = True
DEFAULT_CTN = "off"


def advantages(rewards: Tensor, values: Tensor, mask: Tensor, turn_ids: Tensor, group_ids: Tensor,
               s: LossSettings) -> tuple[Tensor, Tensor]:  # fmt: skip
    """``A_k`` broadcast to the turn's tokens (whitened) and value targets ``R_k`` on every token of turn k."""
    adv = turn_advantage(rewards, values, mask, turn_ids, s.gamma)
    returns = turn_advantage(rewards, values * 0, mask, turn_ids, s.gamma)  # R_k
    return (whiten(adv, mask) if s.whiten else adv), returns


def loss(out, batch: Minibatch, s: LossSettings, ctn_coef: float) -> LossTerms:
    return surrogate_loss(out, batch, s, ctn_coef, turn_level=TURN_LEVEL, critic=CRITIC)
