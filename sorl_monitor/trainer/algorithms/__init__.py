"""The algorithms, as data: which ratio the surrogate uses, whether there is a critic, whether CTN is on
by default, and the advantage estimator. Every loss is ``minibatch_loss.surrogate_loss`` around the objective of ``sorl_monitor.remedy.objective``:

    ρ     = r_t = π_θ(y_t)/π_old(y_t)  (token level)   or   w̄_k = exp(mean_{t∈k} log r_t)  (turn level,
            the geometric form, ``turn_ratio="geomean"`` by default; ``"mean"``: mean_{t∈k} r_t, the arithmetic
            form the monitor logs; both: docs/schema.md, "The turn ratio")
    L_pg  = −mean_t min(ρ A, clip(ρ, 1−ε_low, 1+ε_high) A), and where A < 0 at least c·A (dual-clip, c = 3)
    L     = L_pg [+ c_v · ½ mean_t (V(s_t) − G_t)²  with a critic]
               [+ λ · clip_frac(ρ) · mean_t (r_t − 1 − log r_t)  when CTN is on]
               [− c_H · H]  [+ β · KL(π_θ‖π_ref)]

| name | ratio | advantage (``advantages``) | critic | CTN by default |
|---|---|---|---|---|
| ``ppo`` | token | ``token_gae`` | yes | off |
| ``turn_ppo`` | turn | ``turn_level`` | yes | off |
| ``s_ppo`` | token | ``token_gae`` | yes | on (the paper's clipping-bias correction) |
| ``so_ppo`` = ``st_ppo`` | turn | ``turn_level`` | yes | on |
| ``grpo`` | token | ``group`` | no | off |
| ``so_grpo`` | turn | ``turn_group`` | no | on |

CTN's ``clip_frac`` is the share of agent tokens whose ``ρ`` lies outside the trust region (detached); the
paper's exact normalizer is not public, so ``λ · clip_fraction · KL`` is our interpretation.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from torch import Tensor

from sorl_monitor.trainer.algorithms import advantages as estimators
from sorl_monitor.trainer.algorithms.minibatch_loss import LossSettings, LossTerms, Minibatch, surrogate_loss

Advantages = Callable[[Tensor, Tensor, Tensor, Tensor, Tensor, LossSettings], tuple[Tensor, Tensor]]


@dataclass(frozen=True)
class Algorithm:
    """One algorithm: the surrogate's ratio (token or turn), critic, default CTN mode, advantage estimator."""

    name: str
    turn_level: bool
    critic: bool
    default_ctn: str
    advantages: Advantages

    def loss(self, out, batch: Minibatch, settings: LossSettings, ctn_coef: float) -> LossTerms:
        return surrogate_loss(out, batch, settings, ctn_coef, turn_level=self.turn_level, critic=self.critic)


ALGORITHMS: dict[str, Algorithm] = {
    "ppo": Algorithm("ppo", turn_level=False, critic=True, default_ctn="off", advantages=estimators.token_gae),
    "turn_ppo": Algorithm("turn_ppo", turn_level=True, critic=True, default_ctn="off", advantages=estimators.turn_level),
    "s_ppo": Algorithm("s_ppo", turn_level=False, critic=True, default_ctn="on", advantages=estimators.token_gae),
    "so_ppo": Algorithm("so_ppo", turn_level=True, critic=True, default_ctn="on", advantages=estimators.turn_level),
    "grpo": Algorithm("grpo", turn_level=False, critic=False, default_ctn="off", advantages=estimators.group),
    "so_grpo": Algorithm("so_grpo", turn_level=True, critic=False, default_ctn="on", advantages=estimators.turn_group),
}  # fmt: skip
ALGORITHMS["st_ppo"] = ALGORITHMS["so_ppo"]  # the paper's v1 name for SO-PPO


def get_algorithm(name: str) -> Algorithm:
    try:
        return ALGORITHMS[name]
    except KeyError:
        raise ValueError(f"unknown algorithm {name!r}; choose one of {', '.join(ALGORITHMS)}") from None
