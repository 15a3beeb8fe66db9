"""ST-PPO = SO-PPO: turn-level importance sampling (Turn-PPO) plus Clipping-Triggered Normalization.

    L = −mean_t min(w̄_k A_k, clip(w̄_k) A_k) + c_v · L_V + λ · clip_frac(w̄) · mean_t (r_t − 1 − log r_t)

with ``w̄_k`` the turn ratio, ``A_k = R_k − V(s_k)`` the turn advantage and ``clip_frac`` the share of
agent tokens whose turn ratio lies outside the trust region (detached). The math is Turn-PPO's
(``turn_ppo.loss``) with CTN on by default.
"""

from __future__ import annotations

from sorl_monitor.trainer.algorithms.turn_ppo import CRITIC, TURN_LEVEL, advantages, loss

DEFAULT_CTN = "on"

__all__ = ["CRITIC", "TURN_LEVEL", "DEFAULT_CTN", "advantages", "loss"]
