"""SO-GRPO and auto-CTN inside TRL's ``GRPOTrainer``: the remedy where the agent is trained.

    from sorl_monitor.integrations.trl_so_grpo import SORLGRPOConfig, SORLGRPOTrainer
    args = SORLGRPOConfig(output_dir="out", loss_type="so_grpo")       # GRPOConfig's fields and SO-GRPO's
    trainer = SORLGRPOTrainer(model=path, reward_funcs=reward, args=args, train_dataset=data, monitor=mon,
                              ctn="auto")                             # any SO-GRPO field may also come here
    trainer.train()

``loss_type="so_grpo"`` replaces TRL's policy loss by the shared objective (``sorl_monitor.remedy.objective``):
the turn-level ratio ``w̄_k`` (``turn_is``, on by default; turns = the runs of 1 in TRL's ``completion_mask ×
tool_mask``, so each model turn between tool outputs is one turn), clip, optional dual-clip, CTN, and (with
``turn_advantage``) the per-turn group advantage in place of TRL's per-completion one. Both terms are token
means over the micro-batch divided by the gradient-accumulation steps (TRL's ``bnpo`` normalization); TRL's
``beta`` KL to the reference model is added as TRL adds it (k3 of ``log π_ref − log π_θ``). With TRL's own
clipped loss types (``grpo``, ``bnpo``, ``dr_grpo``, ``dapo``) ``ctn`` adds CTN to TRL's loss unchanged.

``ctn``: ``off`` | ``on`` | ``auto``. ``auto`` is the bundled trainer's switch: ``CtnGuard`` runs the
ratio-drift detectors over the monitor's recent ``steps`` window after each generation batch (or every
``ctn_guard_every`` updates), armed from the first update by default (``ctn_auto_start``), off after
``ctn_quiet_updates`` quiet updates; λ follows ``AdaptiveCtnCoef`` once per generation batch. Every switch
and λ change is an ``alerts`` action row (``ctn_on`` / ``ctn_off`` / ``ctn_coef``); every ``steps`` row carries
``ctn_active``, ``ctn_coef`` (λ applied), ``ctn_clip_frac`` (the clip fraction CTN multiplied),
``ctn_penalty`` and ``dual_clip_frac``.

``SORLGRPOMixin`` gives a user's own ``GRPOTrainer`` subclass the same: ``class T(SORLGRPOMixin, MyTrainer)``.
Refused at construction: ``importance_sampling_level="sequence"``, ``top_entropy_quantile < 1``, an entropy
bonus and ``off_policy_mask_threshold`` with ``so_grpo``; a setting that is not a finite number or not a
``bool`` where one is asked for (``turn_is="no"``, ``ctn_coef_max=inf``); and a ``SORLGRPOConfig`` asking for
``so_grpo`` or CTN given to a trainer without the SO-GRPO loss (TRL's ``GRPOTrainer``, ``MonitoredGRPOTrainer``,
any ``transformers.Trainer``), which would fail after the first generation or train without CTN.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor
from trl import GRPOConfig, GRPOTrainer

from sorl_monitor.diagnose.detectors.config import DetectorConfig
from sorl_monitor.diagnose.detectors.config import config_from_mapping as detector_config
from sorl_monitor.integrations.trl import CLIPPED_LOSSES, SO_GRPO, TokenTapMixin, update_keys
from sorl_monitor.remedy.ctn import CTN_DEFAULTS, CTN_MODES, coef_max_for, ctn_controller
from sorl_monitor.remedy.ctn_guard import ARMED, GuardDecision, guard_for
from sorl_monitor.remedy.objective import (
    TURN_RATIO_FORMS,
    ObjectiveSettings,
    ctn_penalty,
    ctn_pull_share,
    policy_objective,
    surrogate_ratio,
    turn_group_advantages,
)
from sorl_monitor.write.metrics import masked_mean, to_host, turn_ids_from_mask


@dataclass
class SORLGRPOConfig(GRPOConfig):
    """``GRPOConfig`` with SO-GRPO's and CTN's fields (defaults: the bundled trainer's, ``loss_type="so_grpo"``)."""

    loss_type: str = field(default=SO_GRPO, metadata={"help": "so_grpo, or one of TRL's loss types."})
    turn_is: bool = field(
        default=True, metadata={"help": "so_grpo: turn-level ratio w̄_k (False: token r_t)."}
    )
    turn_ratio: str = field(default="geomean", metadata={"help": "w̄_k's form: geomean | mean."})
    turn_advantage: bool = field(
        default=True, metadata={"help": "so_grpo: group advantage per (group, turn index); False: TRL's."}
    )
    dual_clip: float | None = field(
        default=None, metadata={"help": "so_grpo: dual-clip bound c > 1; None: off."}
    )
    ctn: str = field(
        default=CTN_DEFAULTS.ctn, metadata={"help": "CTN: off | on | auto (the detectors switch it)."}
    )
    ctn_coef: float = field(
        default=CTN_DEFAULTS.ctn_coef, metadata={"help": "CTN's λ (the lowest when it adapts)."}
    )
    ctn_target_clip: float | None = field(
        default=CTN_DEFAULTS.ctn_target_clip,
        metadata={"help": "Adaptive λ: the clip fraction to hold; None: fixed λ."},
    )
    ctn_coef_max: float | None = field(
        default=CTN_DEFAULTS.ctn_coef_max,
        metadata={
            "help": "Adaptive λ's upper bound; None: a group advantage's default, 32 (or ctn_coef if larger)."
        },
    )
    ctn_kl_cap: float | None = field(
        default=CTN_DEFAULTS.ctn_kl_cap, metadata={"help": "Cap c on the k3 gradient; None: plain k3."}
    )
    ctn_quiet_updates: int = field(
        default=CTN_DEFAULTS.ctn_quiet_updates, metadata={"help": "auto: quiet updates before CTN goes off."}
    )
    ctn_auto_start: str = field(
        default=CTN_DEFAULTS.ctn_auto_start, metadata={"help": "auto: on from the first update (on) or not."}
    )
    ctn_guard_every: int | None = field(
        default=None, metadata={"help": "auto: updates between looks; None: once per generation batch."}
    )
    ctn_detectors: dict[str, Any] = field(
        default_factory=dict, metadata={"help": "DetectorConfig fields for the guard's detectors."}
    )

    def needs_sorl_trainer(self) -> bool:
        """Whether only a trainer with the SO-GRPO loss can do what this config asks (``so_grpo``, or CTN)."""
        return self.loss_type == SO_GRPO or self.ctn != "off"

    def get_process_log_level(self) -> int:
        """``TrainingArguments``' own, and the check that the trainer being built has the SO-GRPO loss:
        ``transformers.Trainer.__init__`` calls this (TRL's ``GRPOTrainer`` through it), and only
        ``SORLLossMixin`` claims the config first (``claimed``)."""
        if self.needs_sorl_trainer() and not getattr(self, "_sorl_claims", 0):
            raise ValueError(NOT_A_SORL_TRAINER.format(loss_type=self.loss_type, ctn=self.ctn))
        return super().get_process_log_level()


NOT_A_SORL_TRAINER = (
    "SORLGRPOConfig(loss_type={loss_type!r}, ctn={ctn!r}) needs SORLGRPOTrainer (or a trainer with "
    "SORLGRPOMixin): this trainer has no SO-GRPO loss or CTN switch and would fail after the first generation "
    "or train without CTN; for TRL's own loss without CTN give loss_type='dapo' (or another TRL loss) and "
    "ctn='off'"
)


@contextlib.contextmanager
def claimed(args: Any) -> Iterator[None]:
    """While a SORL trainer is built, ``args`` (a ``SORLGRPOConfig``) lets ``get_process_log_level`` pass."""
    if not isinstance(args, SORLGRPOConfig):
        yield
        return
    args._sorl_claims = getattr(args, "_sorl_claims", 0) + 1
    try:
        yield
    finally:
        args._sorl_claims -= 1


BOOLEAN_SETTINGS = ("turn_is", "turn_advantage")
NUMBER_SETTINGS = ("dual_clip", "ctn_coef", "ctn_target_clip", "ctn_coef_max", "ctn_kl_cap")
WHOLE_SETTINGS = ("ctn_quiet_updates", "ctn_guard_every")
OPTIONAL_SETTINGS = ("dual_clip", "ctn_target_clip", "ctn_coef_max", "ctn_kl_cap", "ctn_guard_every")
"""Settings whose ``None`` means off; every other number must be a finite one."""


def config_default(name: str) -> Any:
    """``SORLGRPOConfig``'s default of the field ``name``: the one home of the loss settings' defaults."""
    return SORLGRPOConfig.__dataclass_fields__[name].default


@dataclass
class SorlLossSettings:
    """What the SO-GRPO loss reads from a ``GRPOConfig`` (a ``SORLGRPOConfig``'s fields, else its defaults)."""

    loss_type: str
    turn_is: bool = config_default("turn_is")
    turn_ratio: str = config_default("turn_ratio")
    turn_advantage: bool = config_default("turn_advantage")
    dual_clip: float | None = config_default("dual_clip")
    ctn: str = config_default("ctn")
    ctn_coef: float = config_default("ctn_coef")
    ctn_target_clip: float | None = config_default("ctn_target_clip")
    ctn_coef_max: float | None = config_default("ctn_coef_max")
    ctn_kl_cap: float | None = config_default("ctn_kl_cap")
    ctn_quiet_updates: int = config_default("ctn_quiet_updates")
    ctn_auto_start: str = config_default("ctn_auto_start")
    ctn_guard_every: int | None = config_default("ctn_guard_every")
    ctn_detectors: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, args: Any, overrides: dict[str, Any] | None = None) -> SorlLossSettings:
        """From ``args`` (a ``SORLGRPOConfig``'s fields; a plain ``GRPOConfig`` with TRL's loss: CTN off), then
        ``overrides`` (the trainer's keyword arguments, e.g. ``ctn="auto"``)."""
        found = {name: getattr(args, name) for name in OVERRIDABLE if hasattr(args, name)}
        settings = cls(loss_type=args.loss_type, **found)
        if not isinstance(args, SORLGRPOConfig) and args.loss_type != SO_GRPO:
            settings.ctn = "off"
        for name, value in (overrides or {}).items():
            setattr(settings, name, value)
        return settings.check(args)

    def check(self, args: Any) -> SorlLossSettings:
        """Raise ``ValueError`` naming the first bad or unsupported setting; return self."""
        self._check_kinds()
        if self.loss_type != SO_GRPO and self.loss_type not in CLIPPED_LOSSES - {"luspo"}:
            raise ValueError(
                f"loss_type must be so_grpo or one of grpo, bnpo, dr_grpo, dapo, not {self.loss_type!r}"
            )
        if self.ctn not in CTN_MODES:
            raise ValueError(f"ctn must be one of {', '.join(CTN_MODES)}, not {self.ctn!r}")
        if self.turn_ratio not in TURN_RATIO_FORMS:
            raise ValueError(
                f"turn_ratio must be one of {', '.join(TURN_RATIO_FORMS)}, not {self.turn_ratio!r}"
            )
        if self.ctn_auto_start not in ("on", "off"):
            raise ValueError(f"ctn_auto_start must be 'on' or 'off', not {self.ctn_auto_start!r}")
        if self.dual_clip is not None and not self.dual_clip > 1:
            raise ValueError(f"dual_clip must be > 1, not {self.dual_clip}")
        if self.ctn_kl_cap is not None and not self.ctn_kl_cap > 1:
            raise ValueError(f"ctn_kl_cap must be > 1, not {self.ctn_kl_cap}")
        if not 0 <= self.ctn_coef <= coef_max_for(self.ctn_coef_max, "group", self.ctn_coef):
            raise ValueError(f"need 0 ≤ ctn_coef ≤ ctn_coef_max, got {self.ctn_coef}, {self.ctn_coef_max}")
        if self.ctn_guard_every is not None and self.ctn_guard_every < 1:
            raise ValueError(f"ctn_guard_every must be at least 1, not {self.ctn_guard_every}")
        if self.ctn_quiet_updates < 1:
            raise ValueError(f"ctn_quiet_updates must be at least 1, not {self.ctn_quiet_updates}")
        if self.ctn_target_clip is not None and not 0 < self.ctn_target_clip < 1:
            raise ValueError(f"ctn_target_clip must be between 0 and 1, not {self.ctn_target_clip}")
        if self.loss_type == SO_GRPO:
            unsupported = {
                "importance_sampling_level='sequence'": args.importance_sampling_level != "token",
                "top_entropy_quantile < 1": args.top_entropy_quantile < 1.0,
                "an entropy bonus (entropy_coef)": bool(getattr(args, "entropy_coef", 0.0)),
                "off_policy_mask_threshold": getattr(args, "off_policy_mask_threshold", None) is not None,
            }
            for name, used in unsupported.items():
                if used:
                    raise ValueError(f"loss_type='so_grpo' does not support {name}")
        return self

    def _check_kinds(self) -> None:
        """``ValueError`` for a setting of the wrong kind: ``"no"`` for a bool, ``inf`` or text for a number."""
        for name in BOOLEAN_SETTINGS:
            value = getattr(self, name)
            if not isinstance(value, bool):
                raise ValueError(f"{name} must be True or False, not {value!r}")
        for name, kind in [
            *((n, "a finite number") for n in NUMBER_SETTINGS),
            *((n, "a whole number") for n in WHOLE_SETTINGS),
        ]:
            value = getattr(self, name)
            if value is None and name in OPTIONAL_SETTINGS:
                continue
            number = isinstance(value, int) if name in WHOLE_SETTINGS else isinstance(value, int | float)
            if isinstance(value, bool) or not number or not math.isfinite(value):
                raise ValueError(f"{name} must be {kind}, not {value!r}")
        if not isinstance(self.ctn_detectors, dict):
            raise ValueError(f"ctn_detectors must be a dict of detector settings, not {self.ctn_detectors!r}")

    def objective(self, eps_low: float, eps_high: float) -> ObjectiveSettings:
        return ObjectiveSettings(
            clip_eps=eps_low,
            clip_eps_high=eps_high,
            dual_clip=self.dual_clip,
            turn_ratio=self.turn_ratio,
            ctn_kl_cap=self.ctn_kl_cap,
        )


OVERRIDABLE = tuple(name for name in SorlLossSettings.__dataclass_fields__ if name != "loss_type")
"""The settings a trainer also takes as keyword arguments (``SORLGRPOTrainer(..., ctn="auto")``)."""


def loss_mask(inputs: dict[str, Any]) -> Tensor:
    """The tokens the loss trains on: ``completion_mask × tool_mask`` (tool outputs are 0 in ``tool_mask``)."""
    mask = inputs["completion_mask"]
    return mask * inputs["tool_mask"] if "tool_mask" in inputs else mask


def per_turn_advantages(
    rewards: Tensor, n_turns: Tensor, num_generations: int, local_turn_ids: Tensor, start: int
) -> Tensor:
    """SO-GRPO's per-turn group advantage on this process's tokens ``(B_local, T)``.

    ``rewards`` and ``n_turns`` ``(N,)`` are the whole generation batch's (all processes; groups are runs of
    ``num_generations``), ``local_turn_ids`` this process's rows, which start at row ``start``.
    """
    width = max(int(n_turns.max()), 1)
    k = torch.arange(width, device=rewards.device).unsqueeze(0)
    table_ids = torch.where(k < n_turns.unsqueeze(1), k, torch.full_like(k, -1))
    groups = torch.arange(rewards.numel(), device=rewards.device) // num_generations
    table = turn_group_advantages(rewards, groups, table_ids)[start : start + local_turn_ids.shape[0]]
    gathered = table.gather(1, local_turn_ids.clamp(0, width - 1))
    return torch.where(local_turn_ids >= 0, gathered, torch.zeros_like(gathered))


class SORLLossMixin:
    """The SO-GRPO loss and the CTN switch (needs ``TokenTapMixin`` before it for the monitor; use
    ``SORLGRPOMixin``, which is both)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        overrides = {name: kwargs.pop(name) for name in list(kwargs) if name in OVERRIDABLE}
        config = kwargs.get("args", args[2] if len(args) > 2 else None)  # (model, reward_funcs, args, …)
        with claimed(config):
            super().__init__(*args, **kwargs)
        self.sorl = SorlLossSettings.of(self.args, overrides)  # type: ignore[attr-defined]
        s = self.sorl
        detectors = detector_config(dict(s.ctn_detectors), DetectorConfig())
        self.ctn_guard = guard_for(s.ctn, detectors, s.ctn_quiet_updates, s.ctn_auto_start)
        self.ctn_active = s.ctn == "on" or (self.ctn_guard is not None and self.ctn_guard.active)
        self.ctn_coef = s.ctn_coef
        coef_max = coef_max_for(s.ctn_coef_max, "group", s.ctn_coef)  # GRPO's advantage: the group's
        self.ctn_controller = ctn_controller(s.ctn, s.ctn_coef, s.ctn_target_clip, coef_max)
        self.ctn_switches: list[tuple[int, bool, str]] = []
        self._sorl_seen: tuple[int, int] | None = None  # (update, generation batch) of the last micro-batch
        self._sorl_batch_clip: list[float] = []
        self._sorl_micro: dict[str, float] = {}
        self._sorl_armed_unlogged = self.ctn_guard is not None and self.ctn_guard.active

    # ------------------------------------------------------------------ the switch
    def _sorl_monitor(self) -> Any:
        callback = getattr(self, "sorl_callback", None)
        return None if callback is None else callback.monitor

    def _record(self, decision: GuardDecision) -> None:
        self.ctn_active = decision.ctn_on
        self.ctn_switches.append((decision.step, decision.ctn_on, decision.reason))
        monitor = self._sorl_monitor()
        if monitor is not None:
            monitor.log_alert(**decision.alert_fields())

    def _before_micro_batch(self) -> None:
        """At an update's first micro-batch: λ's controller at a new generation batch, then the guard."""
        update = self.state.global_step + 1  # type: ignore[attr-defined]
        keys = update_keys(
            self._step,
            self.args.steps_per_generation,
            self.num_iterations,  # type: ignore[attr-defined]
            self.args.gradient_accumulation_steps,
        )  # type: ignore[attr-defined]
        if self._sorl_armed_unlogged:  # armed: on from the first update, logged like a switch (once)
            self._sorl_armed_unlogged = False
            self._record(ARMED)
        if self._sorl_seen is not None and self._sorl_seen[0] == update:
            return
        new_batch = self._sorl_seen is not None and keys["iteration"] != self._sorl_seen[1]
        first_update = self._sorl_seen is None
        self._sorl_seen = (update, keys["iteration"])
        if first_update:
            return
        if new_batch and self.ctn_controller is not None and self._sorl_batch_clip:
            mean_clip = sum(self._sorl_batch_clip) / len(self._sorl_batch_clip)
            if self.ctn_controller.update(mean_clip) is not None:
                self.ctn_coef = self.ctn_controller.value
                monitor = self._sorl_monitor()
                if monitor is not None:
                    monitor.log_alert(
                        "ctn_coef",
                        "info",
                        f"CTN λ → {self.ctn_coef:g}: clip fraction {mean_clip:.3f} "
                        f"vs target {self.sorl.ctn_target_clip:g}",
                        value=self.ctn_coef,
                        threshold=self.sorl.ctn_target_clip,
                        step=update - 1,
                        kind="action",
                    )
        if new_batch:
            self._sorl_batch_clip = []
        every = self.sorl.ctn_guard_every
        look = new_batch if every is None else (update - 1) % every == 0
        monitor = self._sorl_monitor()
        if self.ctn_guard is not None and look and monitor is not None:
            decision = self.ctn_guard.update(monitor.recent_steps())
            if decision is not None:
                self._record(decision)

    # ------------------------------------------------------------------ the loss
    def _compute_loss(self, model: Any, inputs: dict[str, Any]) -> Tensor:
        training = self.model.training  # type: ignore[attr-defined]
        if training:
            self._before_micro_batch()
        coef = self.ctn_coef if self.ctn_active else 0.0
        if self.sorl.loss_type == SO_GRPO:
            loss, terms = self._so_grpo_loss(model, inputs, coef)
        else:
            loss = super()._compute_loss(model, inputs)  # type: ignore[misc]
            terms = self._ctn_on_trls_loss(inputs, coef)
            if terms is not None:
                loss = loss + terms["penalty"] / (
                    self.current_gradient_accumulation_steps if training else 1.0
                )  # type: ignore[attr-defined]
        if training and terms is not None:
            host = to_host({name: terms[name] for name in ("clip_frac", "pull", "penalty", "dual_clip_frac")})
            clip = host["clip_frac"]
            if self.ctn_active:
                self._sorl_batch_clip.append(clip)
            self._sorl_micro = {
                "ctn_active": float(self.ctn_active),
                "ctn_coef": float(coef),
                "ctn_clip_frac": clip,
                "ctn_pull": host["pull"],
                "ctn_penalty": host["penalty"],
                "dual_clip_frac": host["dual_clip_frac"],
            }
        return loss

    def _sorl_micro_metrics(self) -> dict[str, float]:
        """This micro-batch's CTN columns for its ``steps`` row (read by ``TokenTapMixin``)."""
        return dict(self._sorl_micro)

    def _so_grpo_loss(
        self, model: Any, inputs: dict[str, Any], coef: float
    ) -> tuple[Tensor, dict[str, Tensor]]:
        completion_ids = inputs["completion_ids"]
        input_ids = torch.cat([inputs["prompt_ids"], completion_ids], dim=1)
        attention_mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
        logps, entropies, _ = self._get_per_token_logps_and_entropies(  # type: ignore[attr-defined]
            model, input_ids, attention_mask, completion_ids.size(1), compute_entropy=True
        )
        mask = loss_mask(inputs).to(logps.dtype)
        old = inputs.get("old_per_token_logps")
        old = logps.detach() if old is None else old
        weights = None
        if getattr(self, "use_vllm", False) and getattr(self, "vllm_importance_sampling_correction", False):
            weights = inputs.get("importance_sampling_ratio")
        settings = self.sorl.objective(self.epsilon_low, self.epsilon_high)  # type: ignore[attr-defined]
        terms = policy_objective(
            logps,
            old,
            inputs["advantages"],
            mask,
            turn_level=self.sorl.turn_is,
            ctn_coef=coef,
            settings=settings,
            weights=weights,
        )
        loss = terms.pg_loss + terms.ctn_penalty
        mode = "train" if self.model.training else "eval"  # type: ignore[attr-defined]
        if self.beta != 0.0:  # type: ignore[attr-defined]
            ref = inputs["ref_per_token_logps"]
            kl = masked_mean(torch.exp(ref - logps) - (ref - logps) - 1, mask)
            loss = loss + self.beta * kl  # type: ignore[attr-defined]
            self._metrics[mode]["kl"].append(float(kl.detach()))  # type: ignore[attr-defined]
        metrics = self._metrics[mode]  # type: ignore[attr-defined]
        metrics["entropy"].append(float(masked_mean(entropies.detach(), mask)))
        if mode == "train":
            loss = loss / self.current_gradient_accumulation_steps  # type: ignore[attr-defined]
        return loss, {
            "clip_frac": terms.clip_frac,
            "pull": terms.ctn_pull,
            "penalty": terms.ctn_penalty.detach(),
            "dual_clip_frac": terms.dual_clip_frac,
        }

    def _ctn_on_trls_loss(self, inputs: dict[str, Any], coef: float) -> dict[str, Tensor] | None:
        """CTN on the token ratio of TRL's own loss, from the log-probs the tap captured (``TokenTapMixin``)."""
        capture = getattr(self, "_sorl_capture", None)
        if self.sorl.ctn == "off" or not capture or "logps" not in capture:
            return None
        logps = capture["logps"]
        mask = loss_mask(inputs).to(logps.dtype)
        old = inputs.get("old_per_token_logps")
        log_ratio = logps - (logps.detach() if old is None else old)
        settings = self.sorl.objective(self.epsilon_low, self.epsilon_high)  # type: ignore[attr-defined]
        ratio = surrogate_ratio(log_ratio, None, mask, turn_level=False)
        penalty, frac = ctn_penalty(log_ratio, ratio, mask, coef, settings)
        advantages = inputs["advantages"]
        advantages = advantages.unsqueeze(1).expand_as(logps) if advantages.dim() == 1 else advantages
        pull = ctn_pull_share(ratio.detach(), advantages, log_ratio.detach(), mask, coef * frac, settings)
        return {
            "clip_frac": frac.detach(),
            "pull": pull,
            "penalty": penalty,
            "dual_clip_frac": torch.zeros((), device=frac.device),
        }  # penalty: with grad

    # ------------------------------------------------------------------ per-turn advantages
    def _generate_and_score_completions(self, *args: Any, **kwargs: Any) -> Any:
        output = super()._generate_and_score_completions(*args, **kwargs)  # type: ignore[misc]
        training = self.model.training  # type: ignore[attr-defined]
        if self.sorl.loss_type == SO_GRPO and self.sorl.turn_advantage and training:
            output["advantages"] = self._per_turn_advantages(output)
        return output

    def _per_turn_advantages(self, output: dict[str, Any]) -> Tensor:
        rewards_per_func = getattr(self, "_sorl_rewards", None)
        if rewards_per_func is None:
            raise RuntimeError("turn_advantage needs the rewards TokenTapMixin keeps (use SORLGRPOMixin)")
        weights = self.reward_weights.to(rewards_per_func.device)  # type: ignore[attr-defined]
        rewards = (rewards_per_func * weights.unsqueeze(0)).nansum(dim=1)
        turn_ids = turn_ids_from_mask(loss_mask(output))
        n_turns = self.accelerator.gather(turn_ids.amax(1) + 1)  # type: ignore[attr-defined]
        start = self.accelerator.process_index * turn_ids.shape[0]  # type: ignore[attr-defined]
        groups = self.num_generations  # type: ignore[attr-defined]
        return per_turn_advantages(rewards, n_turns, groups, turn_ids, start)


class SORLGRPOMixin(TokenTapMixin, SORLLossMixin):
    """The monitor's tap and the SO-GRPO loss for a user's own ``GRPOTrainer`` subclass:
    ``class MyTrainer(SORLGRPOMixin, MyGRPOTrainer)``; configure it with a ``SORLGRPOConfig``."""


class SORLGRPOTrainer(SORLGRPOMixin, GRPOTrainer):
    """TRL's ``GRPOTrainer`` with SO-GRPO, CTN and the monitor's tap: takes ``monitor=`` besides its arguments."""
