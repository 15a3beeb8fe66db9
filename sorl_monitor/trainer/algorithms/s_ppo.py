"""S-PPO: token-level PPO plus Clipping-Triggered Normalization (the paper's clipping-bias correction).

    L = L_pg(token r_t, GAE A_t) + c_v · L_V + λ · clip_frac(r) · mean_t (r_t − 1 − log r_t)

``clip_frac`` is the share of agent tokens with ``r_t`` outside ``[1−ε_low, 1+ε_high]`` (detached): the
more of the batch the clip has cut off, the harder the pull back to π_old. The paper's exact
normalizer is not public; this is the seed's form ``λ · clip_fraction · KL`` (an interpretation).
The math is PPO's (``ppo.loss``) with CTN on by default.
"""

from __future__ import annotations

from sorl_monitor.trainer.algorithms.ppo import CRITIC, TURN_LEVEL, advantages, loss

DEFAULT_CTN = "on"

__all__ = ["CRITIC", "TURN_LEVEL", "DEFAULT_CTN", "advantages", "loss"]
