"""CTN's settings, with the one set of their defaults, and λ's controller.

The bundled trainer (``TrainConfig``), TRL (``SORLGRPOConfig``) and verl (``SorlPolicyLoss``) take their CTN
defaults from ``CTN_DEFAULTS``; each builds λ's controller with ``ctn_controller`` and the guard that switches CTN
with ``ctn_guard.guard_for``.
"""

from __future__ import annotations

from dataclasses import dataclass

CTN_MODES = ("off", "on", "auto")
"""CTN off, on from the start, or switched by the detectors (``auto``)."""


@dataclass(frozen=True)
class CtnSettings:
    """Clipping-Triggered Normalization's settings (``objective``: ``L_CTN = λ · c̄ · mean_t k3_c(log r_t)``)."""

    ctn: str = "auto"
    """off | on | auto (the guard switches it on at a tripped detector, off after ``ctn_quiet_updates``)."""
    ctn_coef: float = 32.0
    """λ (the starting and lowest λ when it adapts)."""
    ctn_target_clip: float | None = 0.05
    """Adaptive λ: the clip fraction CTN's λ holds (``AdaptiveCtnCoef``); None: a fixed λ."""
    ctn_coef_max: float | None = None
    """Adaptive λ's upper bound; None: ``CTN_COEF_MAX`` of where the trainer's advantage comes from."""
    ctn_kl_cap: float | None = 3.0
    """Cap ``c`` (> 1) on the gradient of CTN's k3 (``objective.kl_k3_capped``); None: plain k3."""
    ctn_quiet_updates: int = 1024
    """auto: updates without a tripped detector before CTN goes off again."""
    ctn_auto_start: str = "on"
    """auto: on from the first update (``on``), or off until the detectors' first warning (``off``)."""


CTN_DEFAULTS = CtnSettings()
"""The defaults every trainer's CTN settings take."""

CTN_COEF_MAX = {"critic": 128.0, "group": 32.0}
"""Adaptive λ's default upper bound by the advantage's source: a critic (PPO, S-PPO, SO-PPO) or the episode's
group (GRPO, SO-GRPO). A group advantage has no value baseline: with stale rollouts, λ above 32 let CTN's
pull rather than the policy gradient drive the updates (docs/trainer.md, "λ's bound")."""


def coef_max_for(coef_max: float | None, advantage: str, coef: float = CTN_DEFAULTS.ctn_coef) -> float:
    """``coef_max`` if given, else the default bound for an ``advantage`` from a ``critic`` or a ``group`` (raised
    to ``coef``, the lowest λ, where that is larger)."""
    if coef_max is not None:
        return coef_max
    if advantage not in CTN_COEF_MAX:
        raise ValueError(f"advantage must be one of {', '.join(CTN_COEF_MAX)}, not {advantage!r}")
    return max(CTN_COEF_MAX[advantage], coef)


@dataclass
class AdaptiveCtnCoef:
    """CTN's λ as a controller that holds the clip fraction near ``target`` (PPO's adaptive-KL rule, Schulman
    et al. 2017 §4, applied to the clip fraction CTN multiplies):

        c̄ > 1.5 · target  →  λ ← min(2λ, high)
        c̄ < target / 1.5  →  λ ← max(λ / 2, low)

    ``c̄`` is the mean clip fraction over one rollout batch's updates. ``update`` returns the new λ when it
    changed (to be logged), else ``None``; with ``may_raise=False`` λ can only fall (the trainer's
    ``ctn_raise_unclipped``: no raise while the updates are already gradient-clipped).
    """

    value: float
    target: float
    low: float
    high: float

    def __post_init__(self) -> None:
        if not 0 < self.target < 1:
            raise ValueError(f"the CTN clip-fraction target must be in (0, 1), not {self.target}")
        if not 0 < self.low <= self.high:
            raise ValueError(f"CTN λ bounds need 0 < low ≤ high, got {self.low}..{self.high}")
        self.value = min(max(self.value, self.low), self.high)

    def update(self, clip_frac: float, may_raise: bool = True) -> float | None:
        if clip_frac > 1.5 * self.target:
            if not may_raise:
                return None
            new = min(2.0 * self.value, self.high)
        elif clip_frac < self.target / 1.5:
            new = max(self.value / 2.0, self.low)
        else:
            return None
        if new == self.value:
            return None
        self.value = new
        return new


def ctn_controller(
    ctn: str, coef: float, target_clip: float | None, coef_max: float
) -> AdaptiveCtnCoef | None:
    """λ's controller where λ adapts: CTN not ``off``, a target clip fraction set and λ above 0; else ``None`` (a
    fixed λ)."""
    if target_clip is None or ctn == "off" or not coef > 0:
        return None
    return AdaptiveCtnCoef(coef, target_clip, coef, coef_max)
