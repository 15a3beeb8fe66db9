"""SO-PPO / SO-GRPO and auto-CTN as verl policy losses (``actor.policy_loss.loss_mode=so_ppo``).

    # a module listed in VERL_USE_EXTERNAL_MODULES, imported in every worker:
    from sorl_monitor.integrations.verl_so_ppo import register_sorl_loss
    register_sorl_loss(ctn="auto", log_dir="runs")
    # then: actor_rollout_ref.actor.policy_loss.loss_mode=so_ppo   (or so_grpo, with algorithm.adv_estimator=grpo)

``register_sorl_loss`` registers ``so_ppo`` and ``so_grpo`` with verl's ``register_policy_loss``: the shared
objective (``sorl_monitor.remedy.objective``) on the turn-level ratio ``w̄_k``, turns = the runs of 1 in verl's
``response_mask`` (its agent loop marks LLM tokens 1, tool/observation tokens 0), clip with verl's
``clip_ratio_low``/``clip_ratio_high``, dual-clip with ``clip_ratio_c`` (as verl's ``vanilla``), verl's
``rollout_is_weights`` on the surrogate when rollout correction is on, the log-ratio clamped to ±20 as verl
clamps it, and CTN. Both terms are aggregated by verl's ``agg_loss`` (``loss_agg_mode`` and the config's
``global_batch_info``), so CTN is weighted as the policy loss across micro-batches and ranks::

    pg_loss = agg_loss(−w_t J_t),   ctn = λ · c̄ · agg_loss(k3_c(log r_t))

The two names differ in nothing but the advantages verl hands them (the critic's GAE for ``so_ppo``, the
group's for ``so_grpo``). Each actor worker has its own loss object, so CTN's switch and λ are per worker; a
``Monitor`` per rank logs one ``steps`` row per optimizer update (``MonitoredPolicyLoss``), and with
``ctn="auto"`` the guard reads that rank's window every ``judge_every`` updates, when λ's controller also
judges the clip fractions since its last look. Each switch and λ change is an ``alerts`` action row.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch

from sorl_monitor.diagnose.detectors.config import DetectorConfig
from sorl_monitor.integrations.verl import MonitoredPolicyLoss, config_value
from sorl_monitor.remedy.ctn import CTN_COEF_MAX, CTN_DEFAULTS, CTN_MODES, coef_max_for, ctn_controller
from sorl_monitor.remedy.ctn_guard import ARMED, GuardDecision, guard_for
from sorl_monitor.remedy.objective import (
    TURN_RATIO_FORMS,
    ObjectiveSettings,
    ctn_pull_share,
    kl_k3_capped,
    surrogate_objective,
    surrogate_ratio,
    turn_ids_from_mask,
)
from sorl_monitor.write.metrics import clip_active, clip_fraction, masked_mean, to_host

LOSS_NAMES = ("so_ppo", "so_grpo")
VERL_LOG_RATIO_CLAMP = 20.0
"""verl's ``vanilla`` clamps ``log π_θ − log π_old`` to ±20 before ``exp``; so does this loss."""


def token_mean(loss_mat: torch.Tensor, loss_mask: torch.Tensor, loss_agg_mode: str, **_: Any) -> torch.Tensor:
    """verl's ``agg_loss`` in ``token-mean`` mode on one micro-batch (used where verl is not installed)."""
    if loss_agg_mode != "token-mean":
        raise ValueError(f"loss_agg_mode {loss_agg_mode!r} needs verl's agg_loss (verl is not installed)")
    return (loss_mat * loss_mask).sum() / loss_mask.sum().clamp_min(1)


def verl_agg_loss() -> Callable[..., torch.Tensor]:
    """verl's ``core_algos.agg_loss``, or ``token_mean`` without verl."""
    try:
        from verl.trainer.ppo.core_algos import agg_loss
    except ImportError:
        return token_mean
    return agg_loss


class SorlPolicyLoss(MonitoredPolicyLoss):
    """The SO-PPO / SO-GRPO policy loss with verl's signature, logging each update through the monitor.

    Args:
        turn_is: the turn-level ratio ``w̄_k`` (False: token ``r_t``, i.e. PPO/GRPO with CTN).
        turn_ratio: ``w̄_k``'s form, ``geomean`` or ``mean``.
        ctn: ``off`` | ``on`` | ``auto`` (the guard switches it; needs the monitor).
        ctn_coef, ctn_target_clip, ctn_coef_max: λ, and its controller (target None: fixed λ). ``ctn_coef_max``
            None: the bound of the advantage's source (``remedy.ctn.CTN_COEF_MAX``), read from the actor
            config's ``policy_loss.loss_mode`` at the first call: 32 under ``so_grpo``, 128 otherwise.
        ctn_kl_cap: cap ``c`` on the k3 gradient (None: plain k3).
        ctn_quiet_updates, ctn_auto_start, detectors: the guard's (``CtnGuard``).
        judge_every: updates between the guard's and λ's looks (a rollout batch's updates, e.g.
            ``ppo_epochs × mini-batches``; 4 by default).
        monitor: log there; ``log_dir``/``run_name``/``monitor_kwargs``: the ``Monitor`` built in the worker.
    """

    def __init__(
        self,
        *,
        turn_is: bool = True,
        turn_ratio: str = "geomean",
        ctn: str = CTN_DEFAULTS.ctn,
        ctn_coef: float = CTN_DEFAULTS.ctn_coef,
        ctn_target_clip: float | None = CTN_DEFAULTS.ctn_target_clip,
        ctn_coef_max: float | None = CTN_DEFAULTS.ctn_coef_max,
        ctn_kl_cap: float | None = CTN_DEFAULTS.ctn_kl_cap,
        ctn_quiet_updates: int = CTN_DEFAULTS.ctn_quiet_updates,
        ctn_auto_start: str = CTN_DEFAULTS.ctn_auto_start,
        detectors: DetectorConfig | None = None,
        judge_every: int = 4,
        log_dir: str | os.PathLike[str] = "runs",
        run_name: str | None = None,
        **monitor_kwargs: Any,
    ) -> None:
        if ctn not in CTN_MODES:
            raise ValueError(f"ctn must be off, on or auto, not {ctn!r}")
        if turn_ratio not in TURN_RATIO_FORMS:
            raise ValueError(f"turn_ratio must be one of {', '.join(TURN_RATIO_FORMS)}, not {turn_ratio!r}")
        if judge_every < 1:
            raise ValueError(f"judge_every must be at least 1, not {judge_every}")
        monitor_kwargs.setdefault("algorithm", "so_ppo" if turn_is else "ppo")
        super().__init__(self.objective, log_dir=log_dir, run_name=run_name, **monitor_kwargs)
        self.turn_is, self.turn_ratio, self.ctn_kl_cap = turn_is, turn_ratio, ctn_kl_cap
        self.judge_every = judge_every
        self.guard = guard_for(ctn, detectors, ctn_quiet_updates, ctn_auto_start)
        self.ctn_active = ctn == "on" or (self.guard is not None and self.guard.active)
        self.ctn_coef = ctn_coef
        coef_max = coef_max_for(ctn_coef_max, "critic", ctn_coef)  # until the loss mode says a group's
        self.controller = ctn_controller(ctn, ctn_coef, ctn_target_clip, coef_max)
        self._bound_from_loss_mode = ctn_coef_max is None  # until the first call names the loss mode
        self.ctn_switches: list[tuple[int, bool, str]] = []
        self._clip_fracs: list[float] = []
        self._columns: dict[str, float] = {}
        self._armed_unlogged = self.guard is not None and self.guard.active
        self._agg_loss = verl_agg_loss()

    # ------------------------------------------------------------------ the loss
    def objective(
        self,
        old_log_prob: torch.Tensor,
        log_prob: torch.Tensor,
        advantages: torch.Tensor,
        response_mask: torch.Tensor,
        loss_agg_mode: str = "token-mean",
        config: Any = None,
        rollout_is_weights: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, dict[str, Any]]:
        """``(pg_loss + CTN, metrics)`` of one micro-batch, as verl's policy losses return them."""
        if self._bound_from_loss_mode:
            self._bound_from_loss_mode = False
            self._bound_by_loss_mode(config_value(config_value(config, "policy_loss"), "loss_mode"))
        clip = config_value(config, "clip_ratio", 0.2)
        eps_low = float(config_value(config, "clip_ratio_low", clip))
        eps_high = float(config_value(config, "clip_ratio_high", clip))
        dual_clip = float(config_value(config, "clip_ratio_c", 3.0))
        batch_info = config_value(config, "global_batch_info", {}) or {}
        mask = response_mask.to(log_prob.dtype)
        log_ratio = (log_prob - old_log_prob).clamp(-VERL_LOG_RATIO_CLAMP, VERL_LOG_RATIO_CLAMP)
        turn_ids = turn_ids_from_mask(mask) if self.turn_is else None
        ratio = surrogate_ratio(log_ratio, turn_ids, mask, self.turn_is, self.turn_ratio)
        per_token = -surrogate_objective(ratio, advantages, eps_low, eps_high, dual_clip)
        if rollout_is_weights is not None:
            per_token = per_token * rollout_is_weights
        pg_loss = self._agg_loss(
            loss_mat=per_token, loss_mask=mask, loss_agg_mode=loss_agg_mode, **batch_info
        )
        frac = clip_fraction(ratio.detach(), mask, eps_low, eps_high)["total"]
        coef = self.ctn_coef if self.ctn_active else 0.0
        penalty = torch.zeros((), device=log_prob.device, dtype=log_prob.dtype)
        if coef:
            kl = self._agg_loss(
                loss_mat=kl_k3_capped(log_ratio, self.ctn_kl_cap),
                loss_mask=mask,
                loss_agg_mode=loss_agg_mode,
                **batch_info,
            )
            penalty = coef * frac * kl
        dual_frac = masked_mean(((advantages < 0) & (ratio.detach() > dual_clip)).float(), mask)
        settings = ObjectiveSettings(
            clip_eps=eps_low, clip_eps_high=eps_high, dual_clip=dual_clip, ctn_kl_cap=self.ctn_kl_cap
        )
        pull = ctn_pull_share(ratio.detach(), advantages, log_ratio.detach(), mask, coef * frac, settings,
                              rollout_is_weights)  # fmt: skip
        host = to_host(
            {
                "ctn_clip_frac": frac,
                "ctn_pull": pull,
                "ctn_penalty": penalty.detach(),
                "dual_clip_frac": dual_frac,
                "pg_clipfrac": masked_mean(
                    clip_active(ratio.detach(), advantages, eps_low, eps_high).float(), mask
                ),
                "ppo_kl": masked_mean(-log_ratio.detach(), mask),
            }
        )
        if self.ctn_active:
            self._clip_fracs.append(host["ctn_clip_frac"])
        self._columns = {
            "ctn_active": float(self.ctn_active),
            "ctn_coef": float(coef),
            **{name: host[name] for name in ("ctn_clip_frac", "ctn_pull", "ctn_penalty", "dual_clip_frac")},
        }
        metrics = {
            "actor/pg_clipfrac": host["pg_clipfrac"],
            "actor/ppo_kl": host["ppo_kl"],
            "actor/pg_clipfrac_lower": host["dual_clip_frac"],
            "actor/ctn_penalty": self._columns["ctn_penalty"],
            "actor/ctn_coef": float(coef),
        }
        return pg_loss + penalty, metrics

    def _bound_by_loss_mode(self, loss_mode: str | None) -> None:
        """λ's default bound for the advantage a loss mode implies: a group's under ``so_grpo``."""
        if self.controller is not None and loss_mode == "so_grpo":
            self.controller.high = max(CTN_COEF_MAX["group"], self.controller.low)
            self.controller.value = min(self.controller.value, self.controller.high)

    # ------------------------------------------------------------------ rows and the switch
    def _record(self, *args: Any) -> None:
        super()._record(*args)
        if self._batches:  # the CTN columns under their schema names (not verl's ``actor/ctn_*``)
            metrics = self._batches[-1].metrics
            for name in ("actor_ctn_penalty", "actor_ctn_coef"):
                metrics.pop(name, None)
            metrics.update(self._columns)

    def _write(self) -> None:
        super()._write()
        if self.monitor is None or self.updates == 0 or self.updates % self.judge_every:
            return
        if self._armed_unlogged:
            self._armed_unlogged = False
            self._switch(ARMED)
        if self.controller is not None and self._clip_fracs:
            mean_clip = sum(self._clip_fracs) / len(self._clip_fracs)
            if self.controller.update(mean_clip) is not None:
                self.ctn_coef = self.controller.value
                self.monitor.log_alert(
                    "ctn_coef",
                    "info",
                    f"CTN λ → {self.ctn_coef:g}: clip fraction {mean_clip:.3f} "
                    f"vs target {self.controller.target:g}",
                    value=self.ctn_coef,
                    threshold=self.controller.target,
                    step=self.updates,
                    kind="action",
                )
        self._clip_fracs = []
        if self.guard is not None:
            decision = self.guard.update(self.monitor.recent_steps())
            if decision is not None:
                self._switch(decision)

    def _switch(self, decision: GuardDecision) -> None:
        self.ctn_active = decision.ctn_on
        self.ctn_switches.append((decision.step, decision.ctn_on, decision.reason))
        if self.monitor is not None:
            self.monitor.log_alert(**decision.alert_fields())


def register_sorl_loss(names: tuple[str, ...] = LOSS_NAMES, **settings: Any) -> SorlPolicyLoss:
    """Register one ``SorlPolicyLoss(**settings)`` under each of ``names`` with verl's ``register_policy_loss``
    (needs verl); select it with ``actor_rollout_ref.actor.policy_loss.loss_mode=so_ppo`` (or ``so_grpo``)."""
    from verl.trainer.ppo.core_algos import register_policy_loss

    loss = SorlPolicyLoss(**settings)
    for name in names:
        register_policy_loss(name)(loss)
    return loss
