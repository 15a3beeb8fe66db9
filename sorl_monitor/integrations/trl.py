"""Token- and turn-level metrics from TRL's ``GRPOTrainer``: a mixin that taps its loss inputs.

TRL computes the per-token ratios inside ``GRPOTrainer._compute_loss`` and logs only their summaries,
so a callback never sees them. ``TokenTapMixin`` overrides four methods and copies no loss code:

- ``_calculate_rewards`` and ``_generate_and_score_completions``: keep each completion's reward (the
  reward functions' weighted sum, as TRL logs ``reward``) in the generation batch under ``sorl_reward``,
  so it is shuffled and split with the rest, and the generation batch's reward statistics;
- ``_get_per_token_logps_and_entropies``: while the loss runs, keep what it returns (``per_token_logps``
  and ``entropies`` of the current policy);
- ``_compute_loss``: run TRL's loss unchanged, then hand that micro-batch's ``per_token_logps``,
  ``old_per_token_logps`` (TRL's ``per_token_logps.detach()`` when it skipped them, as on-policy),
  ``ref_per_token_logps``, ``advantages``, rewards and ``completion_mask × tool_mask`` to ``SorlCallback``,
  which logs one row per optimizer update. Turns are the contiguous runs of 1 in that mask: in TRL's
  multi-turn tool loop, tool outputs are 0 in ``tool_mask``, so each model turn is one ``turns`` row.

The trust region is TRL's (``epsilon``, ``epsilon_high``), and ``clip_frac_active*`` is measured as the
loss clips: over tokens, or over sequences with ``importance_sampling_level="sequence"`` (GSPO), and
not at all for losses without PPO's clip (``cispo``, ``sapo``, ``vespo``).

    mon = Monitor("runs", algorithm="grpo")
    trainer = MonitoredGRPOTrainer(model=path, reward_funcs=reward, args=config, train_dataset=data, monitor=mon)
    trainer.train()

Keys of each update (TRL's micro-step counter ``_step`` at its first micro-batch; ``g`` = gradient
accumulation steps, ``s`` = ``steps_per_generation``, ``μ`` = ``num_iterations``):
``iteration = _step // (s·μ)`` (generation batch), ``ppo_epoch = (_step // s) % μ`` (reuse pass),
``minibatch = (_step % s) // g``, ``policy_lag = (_step % (s·μ)) // g`` (0 when on-policy).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from trl import GRPOTrainer

from sorl_monitor.integrations.batches import TokenBatch
from sorl_monitor.integrations.hf import SorlCallback
from sorl_monitor.write.metrics import group_reward_stats
from sorl_monitor.write.monitor import Monitor

CLIPPED_LOSSES = frozenset({"grpo", "bnpo", "dr_grpo", "dapo", "luspo"})
"""TRL loss types with PPO's two-sided clip, where ``clip_ratio/*`` is logged."""
SO_GRPO = "so_grpo"
"""SORL's loss type (``trl_so_grpo``), which only trainers with ``SORLLossMixin`` have."""
REWARD_KEY = "sorl_reward"
"""The generation-batch entry that carries each completion's reward to the loss."""


def update_keys(
    micro_step: int, steps_per_generation: int, num_iterations: int, accumulation: int
) -> dict[str, int]:
    """``iteration, ppo_epoch, minibatch, policy_lag`` of the update holding TRL micro-step ``micro_step``."""
    generate_every = steps_per_generation * num_iterations
    return {
        "iteration": micro_step // generate_every,
        "ppo_epoch": (micro_step // steps_per_generation) % num_iterations,
        "minibatch": (micro_step % steps_per_generation) // accumulation,
        "policy_lag": (micro_step % generate_every) // accumulation,
    }


def tapped_batch(
    inputs: dict[str, Any], per_token_logps: Any, entropies: Any, keys: dict[str, int]
) -> TokenBatch:
    """The micro-batch ``_compute_loss`` trained on, from its ``inputs`` and the log-probs it computed."""
    mask = inputs["completion_mask"]
    if "tool_mask" in inputs:
        mask = mask * inputs["tool_mask"]
    old = inputs.get("old_per_token_logps")
    on_policy = old is None
    return TokenBatch.detached(
        logp=per_token_logps,
        old_logp=per_token_logps if on_policy else old,
        mask=mask,
        advantages=inputs["advantages"],
        entropy=entropies,
        ref_logp=inputs.get("ref_per_token_logps"),
        rewards=inputs.get(REWARD_KEY),
        iteration=keys["iteration"],
        ppo_epoch=keys["ppo_epoch"],
        minibatch=keys["minibatch"],
        policy_lag=0 if on_policy else keys["policy_lag"],
    )


def generation_reward_stats(rewards: Tensor, num_generations: int) -> dict[str, float]:
    """Reward statistics of a whole generation batch ``(N,)`` (groups: runs of ``num_generations``).

    ``reward_mean``/``reward_std`` as TRL logs ``reward``/``reward_std`` (std with Bessel's correction,
    NaN rewards of unscorable completions left out); ``group_reward_std`` and ``zero_std_group_frac`` as
    the monitor defines them (``metrics.group_reward_stats``).
    """
    finite = torch.isfinite(rewards)
    if not finite.any():
        return {}
    scored = rewards[finite].double()
    groups = torch.arange(rewards.numel(), device=rewards.device) // num_generations
    group = group_reward_stats(scored, groups[finite])
    stats = torch.stack(
        [
            scored.mean(),
            scored.std() if scored.numel() > 1 else torch.zeros((), dtype=scored.dtype),
            scored.min(),
            scored.max(),
            group["std_mean"],
            group["zero_std_frac"],
        ]
    ).tolist()
    names = (
        "reward_mean",
        "reward_std",
        "reward_min",
        "reward_max",
        "group_reward_std",
        "zero_std_group_frac",
    )
    return dict(zip(names, stats, strict=True))


def clip_region(
    batch: TokenBatch, eps_low: float, eps_high: float, level: str, loss_type: str
) -> dict[str, Tensor | None]:
    """``clip_frac_active`` and its two sides where TRL's loss clips, as it logs ``clip_ratio/*``.

    Token level: share of the update's loss tokens with ``(r < 1−ε_low ∧ A < 0)`` (low) or
    ``(r > 1+ε_high ∧ A > 0)`` (high). Sequence level (GSPO): ``r`` is each sequence's
    ``exp(mean log-ratio)`` and the share is over sequences. ``None`` for losses without the clip.
    """
    if loss_type not in CLIPPED_LOSSES:
        return dict.fromkeys(("clip_frac_active", "clip_frac_active_low", "clip_frac_active_high"))
    mask = batch.mask > 0
    log_ratio = torch.where(mask, batch.logp - batch.old_logp, torch.zeros((), dtype=batch.logp.dtype))
    if level == "sequence":
        log_ratio = (log_ratio.sum(-1) / mask.sum(-1).clamp(min=1)).unsqueeze(-1)
    ratio = log_ratio.exp()
    advantages = batch.advantages
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(-1)
    low = (ratio < 1 - eps_low) & (advantages < 0)
    high = (ratio > 1 + eps_high) & (advantages > 0)

    def share(clipped: Tensor) -> Tensor:
        if clipped.shape[-1] == 1:
            return clipped.double().mean()
        return (clipped & mask).sum().double() / mask.sum().clamp(min=1)

    return {
        "clip_frac_active": share(low | high),
        "clip_frac_active_low": share(low),
        "clip_frac_active_high": share(high),
    }


class TokenTapMixin:
    """Mix into a ``GRPOTrainer`` (subclass) before it: ``class T(TokenTapMixin, GRPOTrainer)``.

    Pass ``monitor=`` to the constructor, or a ``SorlCallback`` in ``callbacks=``; the tap feeds that
    callback. A failing tap warns once and training goes on.
    """

    _sorl_capture: dict[str, Any] | None = None
    _sorl_rewards: Tensor | None = None

    def __init__(self, *args: Any, monitor: Monitor | None = None, **kwargs: Any) -> None:
        config = kwargs.get("args", args[2] if len(args) > 2 else None)  # (model, reward_funcs, args, …)
        if getattr(config, "loss_type", None) == SO_GRPO and not hasattr(self, "_so_grpo_loss"):
            raise ValueError(
                "loss_type='so_grpo' needs SORLGRPOTrainer (or a trainer with SORLGRPOMixin): this trainer has "
                "no SO-GRPO loss and would fail after the first generation"
            )
        super().__init__(*args, **kwargs)
        callbacks = self.callback_handler.callbacks  # type: ignore[attr-defined]
        found = [c for c in callbacks if isinstance(c, SorlCallback)]
        if found:
            self.sorl_callback = found[0]
            if monitor is not None:
                self.sorl_callback.monitor = monitor
        else:
            self.sorl_callback = SorlCallback(monitor)
            self.add_callback(self.sorl_callback)  # type: ignore[attr-defined]
        self.sorl_generation: dict[str, float] = {}
        """Reward statistics of the current generation batch, written on each of its updates."""
        self.sorl_callback.clip_bounds = (self.epsilon_low, self.epsilon_high)  # type: ignore[attr-defined]
        self.sorl_callback.update_columns = self._sorl_update_columns

    def _calculate_rewards(self, *args: Any, **kwargs: Any) -> Any:
        rewards_per_func = super()._calculate_rewards(*args, **kwargs)  # type: ignore[misc]
        self._sorl_rewards = rewards_per_func
        return rewards_per_func

    def _generate_and_score_completions(self, *args: Any, **kwargs: Any) -> Any:
        self._sorl_rewards = None
        output = super()._generate_and_score_completions(*args, **kwargs)  # type: ignore[misc]
        if self.model.training and self._sorl_rewards is not None:  # type: ignore[attr-defined]
            try:
                self._keep_rewards(output, self._sorl_rewards)
            except Exception as error:  # noqa: BLE001 - the tap must never break training
                self.sorl_callback.warn_once(
                    "rewards", f"GRPO reward tap failed ({type(error).__name__}: {error})"
                )
        self._sorl_rewards = None
        return output

    def _keep_rewards(self, output: dict[str, Any], rewards_per_func: Tensor) -> None:
        """Each local completion's reward into ``output``; the whole (all-rank) batch's statistics kept."""
        weights = self.reward_weights.to(rewards_per_func.device)  # type: ignore[attr-defined]
        rewards = (rewards_per_func * weights.unsqueeze(0)).nansum(dim=1)
        rewards[torch.isnan(rewards_per_func).all(dim=1)] = torch.nan  # unscorable, as TRL marks them
        local = output["completion_ids"].shape[0]
        start = self.accelerator.process_index * local  # type: ignore[attr-defined]
        output[REWARD_KEY] = rewards[start : start + local]
        self.sorl_generation = generation_reward_stats(rewards, self.num_generations)  # type: ignore[attr-defined]

    def _get_per_token_logps_and_entropies(self, *args: Any, **kwargs: Any) -> Any:
        output = super()._get_per_token_logps_and_entropies(*args, **kwargs)  # type: ignore[misc]
        if self._sorl_capture is not None and not self._sorl_capture:
            self._sorl_capture["logps"], self._sorl_capture["entropies"] = output[0], output[1]
        return output

    def _compute_loss(self, model: Any, inputs: dict[str, Any]) -> Any:
        capture: dict[str, Any] | None = {} if self.model.training else None  # type: ignore[attr-defined]
        self._sorl_capture = capture
        try:
            loss = super()._compute_loss(model, inputs)  # type: ignore[misc]
        finally:
            self._sorl_capture = None
        if capture:
            self._tap(inputs, capture)
        return loss

    def _tap(self, inputs: dict[str, Any], capture: dict[str, Any]) -> None:
        try:
            keys = update_keys(
                self._step,  # type: ignore[attr-defined]
                self.args.steps_per_generation,  # type: ignore[attr-defined]
                self.num_iterations,  # type: ignore[attr-defined]
                self.args.gradient_accumulation_steps,  # type: ignore[attr-defined]
            )
            batch = tapped_batch(inputs, capture["logps"], capture["entropies"], keys)
            batch.metrics = dict(self.sorl_generation)
            loss_columns = getattr(self, "_sorl_micro_metrics", None)  # SORLLossMixin's CTN columns
            if loss_columns is not None:
                batch.metrics.update(loss_columns())
            self.sorl_callback.add_update(self.state.global_step + 1, batch)  # type: ignore[attr-defined]
        except Exception as error:  # noqa: BLE001 - the tap must never break training
            self.sorl_callback.warn_once("tap", f"GRPO token tap failed ({type(error).__name__}: {error})")

    def _sorl_update_columns(self, batch: TokenBatch) -> dict[str, Tensor | None]:
        return clip_region(
            batch,
            self.epsilon_low,  # type: ignore[attr-defined]
            self.epsilon_high,  # type: ignore[attr-defined]
            self.importance_sampling_level,  # type: ignore[attr-defined]
            self.loss_type,  # type: ignore[attr-defined]
        )


class MonitoredGRPOTrainer(TokenTapMixin, GRPOTrainer):
    """TRL's ``GRPOTrainer`` with the token tap: takes ``monitor=`` besides GRPOTrainer's arguments.
    (SO-GRPO and CTN inside the trainer: ``integrations.trl_so_grpo.SORLGRPOTrainer``.)"""
