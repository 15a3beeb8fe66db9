"""Trainers' metric names → ``steps`` columns: one name table per trainer family (docs/attach.md has them all).

A name is mapped only where the trainer computes the same quantity as the schema's column; anything
else keeps its own name, snake-cased (``rollout_corr/rollout_is_mean`` → ``rollout_corr_rollout_is_mean``),
so nothing a trainer logs is lost and nothing is stored under a name that means something else. Every
table was read off the trainer's source (repository, commit and functions next to it). ``UNMAPPED``
lists names each family logs that are deliberately left unmapped: the docs' "not mapped" rows, and
evidence for ``guess_family``.
"""

from __future__ import annotations

import functools
import math
import sys
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from sorl_monitor.schema import column_name

# ---------------------------------------------------------------------- transformers and TRL
# transformers 5.23 ``Trainer._maybe_log_save_evaluate`` (loss, grad_norm, learning_rate) and ``Trainer.log``
# (epoch); TRL 1.16.0 ``GRPOTrainer._generate`` (completions/*), ``_generate_and_score_completions``
# (reward*, frac_reward_zero_std), ``_compute_loss`` (policy_loss, kl, entropy, clip_ratio/*), the installed
# sources (tests/integrations/test_names.py checks every name against them). ``RLOOTrainer`` logs the same names
# but policy_loss and entropy_coef.
HF_TRAINER_NAMES: dict[str, str] = {
    "loss": "loss",  # training loss averaged over the logging window
    "grad_norm": "grad_norm",  # global L2 norm before clipping (``clip_grad_norm_``'s return value)
    "learning_rate": "lr",
}

TRL_NAMES: dict[str, str] = {
    **HF_TRAINER_NAMES,
    "policy_loss": "pg_loss",  # logged when the entropy bonus is on
    # masked token mean of k3 of KL(π_θ‖π_ref), times the token IS ratio r_t when use_bias_correction_kl (on by
    # default in TRL 1.16, off before); RLOOTrainer: k1 of KL(π_old‖π_ref), its reward penalty
    "kl": "kl_ref",
    "entropy": "entropy",  # masked token mean
    # (r < 1−ε_low ∧ A < 0) ∨ (r > 1+ε_high ∧ A > 0): where the clip binds, = clip_active
    "clip_ratio/region_mean": "clip_frac_active",
    "clip_ratio/low_mean": "clip_frac_active_low",  # r < 1−ε_low ∧ A < 0 (not the schema's clip_frac_low)
    "clip_ratio/high_mean": "clip_frac_active_high",  # r > 1+ε_high ∧ A > 0
    "reward": "reward_mean",
    "reward_std": "reward_std",  # std of the batch's rewards (all groups together; Bessel-corrected)
    # share of samples whose group has reward std 0 with scale_rewards "group" (default) or "none"
    "frac_reward_zero_std": "zero_std_group_frac",
    # model-generated tokens per completion: since TRL 0.28 (#4895) tool and environment tokens are left out
    # (``tool_mask``), so these are policy tokens, as response_len_* counts them
    "completions/mean_length": "response_len_mean",
    "completions/max_length": "response_len_max",
    "completions/clipped_ratio": "completion_truncated_frac",  # last token neither EOS nor pad
}

# ---------------------------------------------------------------------- verl and RAGEN
# volcengine/verl b178a3cd (2026-01-29): ``core_algos.compute_policy_loss_vanilla``, ``dp_actor.update_policy``,
# ``dp_critic.update_critic``, ``fsdp_workers`` (actor/lr), ``ray_trainer.fit``, ``metric_utils.compute_data_metrics``.
VERL_ACTOR_NAMES: dict[str, str] = {
    # dp_actor sums it over the step's ppo_epochs × mini-batches since verl #4711 (Dec 2025), so it is the
    # loss when one mini-batch and one epoch make the step (RAGEN: the mean over micro-batches)
    "actor/pg_loss": "pg_loss",
    # gt(−A·clip(r), −A·r) = (r > 1+ε_high ∧ A > 0) ∨ (r < 1−ε_low ∧ A < 0): where the clip binds (vanilla loss)
    "actor/pg_clipfrac": "clip_frac_active",
    # dual-clip bound: −A·r > −A·clip_ratio_c with A < 0, i.e. r > clip_ratio_c on negative advantages
    "actor/pg_clipfrac_lower": "dual_clip_frac",
    "actor/ppo_kl": "kl_old_k1",  # masked mean of −(log π_θ − log π_old)
    # KL(π_θ‖π_ref) with kl_loss_type's estimator (low_var_kl = k3 by default), aggregated by loss_agg_mode,
    # logged with use_kl_loss; summed over mini-batches × epochs like actor/pg_loss (RAGEN: the last micro-batch's)
    "actor/kl_loss": "kl_ref",
    "actor/grad_norm": "grad_norm",  # clip_grad_norm_'s pre-clip norm
    "actor/lr": "lr",
    "critic/vf_loss": "vf_loss",
    "critic/vf_clipfrac": "vf_clip_frac",
}
"""The actor and critic workers' names, which RAGEN's workers log with verl's definitions."""

VERL_DATA_NAMES: dict[str, str] = {
    "critic/score/mean": "reward_mean",  # sequence score from the reward function, before any KL penalty
    "critic/score/max": "reward_max",
    "critic/score/min": "reward_min",
    "critic/advantages/mean": "adv_mean",  # over response_mask tokens
    "critic/advantages/max": "adv_max",
    "critic/advantages/min": "adv_min",
    "critic/returns/mean": "return_mean",
    "critic/returns/max": "return_max",
    "critic/returns/min": "return_min",
    "critic/values/mean": "value_mean",
    "critic/values/max": "value_max",
    "critic/values/min": "value_min",
    # response tokens per sample from the attention mask: tool and observation tokens included
    "response_length/mean": "completion_len_mean",
    "response_length/max": "completion_len_max",
    "response_length/min": "completion_len_min",
    "response_length/clip_ratio": "completion_truncated_frac",  # length == the response budget
}
"""``compute_data_metrics``'s names."""

VERL_NAMES: dict[str, str] = {
    **VERL_ACTOR_NAMES,
    # the old policy's entropy over the batch (ray_trainer, when old log-probs are computed; dp_actor logs
    # the current policy's under the same name), aggregated by loss_agg_mode: the masked token mean by default
    "actor/entropy": "entropy",
    **VERL_DATA_NAMES,
}

# RAGEN-AI/RAGEN 5eb79b82 (2025-09-06), on verl 1e47e412 (its submodule): ``ragen/trainer/agent_trainer.py``
# (``fit``, ``_filter_rollout``), ``ragen/workers/actor/dp_actor.py``, ``ragen/llm_agent/ctx_manager.py``.
RAGEN_NAMES: dict[str, str] = {
    **VERL_ACTOR_NAMES,
    # the masked mean token entropy despite its name (agg_loss of the entropy), logged when entropy_coeff ≠ 0
    # (RAGEN's default 0.001); RAGEN logs no actor/entropy
    "actor/entropy_loss": "entropy",
    # the mean group score over all groups before the rollout filter = the mean episode score (equal groups):
    # the reward plus the format penalty, after reward_normalization (identity by default)
    "rollout/in_group_mean": "reward_mean",
    "rollout/in_group_std": "group_reward_std",  # mean over groups of the Bessel-corrected std
    "train/response_length": "response_len_mean",  # assistant-turn tokens per episode (ctx_manager)
}
"""RAGEN logs verl's names too, but its verl data metrics mean something else (``UNMAPPED["ragen"]``)."""

# ---------------------------------------------------------------------- OpenRLHF
# OpenRLHF/OpenRLHF 3c3be623 (2026-08-13): ``trainer/ray/ppo_actor.py`` (``training_step``, ``ppo_train``),
# ``models/loss.py`` (``PolicyLoss``), ``trainer/ppo_trainer.py`` (``_compute_rollout_stats``), and
# ``utils/logging_utils.py``, whose W&B and TensorBoard loggers add the ``train/`` prefix.
OPENRLHF_NAMES: dict[str, str] = {
    "train/policy_loss": "pg_loss",
    "train/ppo_clip_ratio": "clip_frac_active",  # lt(clip(r)·A, r·A): where the clip binds
    "train/ppo_kl": "kl_old_k1",  # masked mean of −(log π_θ − log π_old)
    # algo.kl.estimator (k1/k2/k3): per-sequence mean over π_old's tokens vs π_ref (KL in the reward), or
    # KL(π_θ‖π_ref) aggregated like the loss (algo.kl.use_loss)
    "train/kl": "kl_ref",
    # the token entropy aggregated like the loss (the token mean when micro-batches hold equal token counts),
    # logged when actor.entropy_coef is set
    "train/entropy_loss": "entropy",
    "train/actor_grad_norm": "grad_norm",  # DeepSpeed's pre-clip norm of the step's last optimizer step
    "train/actor_lr": "lr",
    "train/critic_loss": "vf_loss",
    "train/group_reward_std": "group_reward_std",  # mean over groups of the Bessel-corrected std
    "train/rollout/reward_mean": "reward_mean",  # over every sample of the rollout batch
    "train/rollout/reward_std": "reward_std",  # Bessel-corrected
    # first to last action token per sample: environment tokens between turns included
    "train/rollout/response_length_mean": "completion_len_mean",
    "train/rollout/truncated_rate": "completion_truncated_frac",  # finish_reason == "length"
}

# ---------------------------------------------------------------------- prime-rl
# PrimeIntellect-ai/prime-rl 559b4477 (2026-08-21): ``trainer/rl/train.py`` (``train``), ``trainer/rl/loss.py``,
# ``trainer/utils.py`` (``Tensors.compute_stats``), ``orchestrator/orchestrator.py`` and ``orchestrator/metrics.py``;
# token counts from PrimeIntellect-ai/verifiers a60a606e ``v1/trace.py``. Its monitors log the keys unchanged.
PRIME_RL_NAMES: dict[str, str] = {
    "entropy/all/mean": "entropy",  # mean over every loss-masked token of the step, all ranks
    # exp(x) − 1 − x with x = log π_θ − log π_inference: the inference engine's sampling policy is the
    # behaviour policy, so this is k3 of KL(π_old‖π_θ), token mean
    "mismatch_kl/all/mean": "kl_old_k3",
    "optim/grad_norm": "grad_norm",  # clip_grad_norm_'s pre-clip norm (logged when optim.max_norm is set)
    "optim/lr": "lr",
    # model-generated (completion) tokens per shipped episode
    "train/agg/effective/num_output_tokens/mean": "response_len_mean",
    "train/agg/effective/num_output_tokens/max": "response_len_max",
}

# ---------------------------------------------------------------------- hand-written GRPO loops
# The CS336 (Stanford, spring 2025) assignment-5 GRPO loop as ShibukiZero/assignment5-alignment 1a47cd66 writes
# it (``cs336_alignment/grpo.py``: ``compute_group_normalized_rewards``, ``compute_grpo_clip_loss``), JSON lines of
# row kinds (``logs.row_kinds``). Its names are generic, so only the ones no other table logs decide the family.
GRPO_LOOP_NAMES: dict[str, str] = {
    **HF_TRAINER_NAMES,
    "train_reward": "reward_mean",  # mean raw reward of the rollout batch trained on
    "std_reward": "reward_std",  # torch.std of the batch's raw rewards (Bessel-corrected)
    "min_reward": "reward_min",
    "max_reward": "reward_max",
    "token_entropy": "entropy",  # masked token mean
    "avg_response_token_length": "response_len_mean",  # generated tokens per response (one turn)
    "approx_kl": "kl_old",  # to the rollout policy, the loop's own estimator
    "reference_kl": "kl_ref",
    # is_clipped = ratio != clamp(ratio, 1−ε_low, 1+ε_high): outside the band whatever the advantage's sign
    "clip_fraction": "clip_frac",
}

NAME_TABLES: dict[str, Mapping[str, str]] = {
    "trl": TRL_NAMES,
    "verl": VERL_NAMES,
    "openrlhf": OPENRLHF_NAMES,
    "ragen": RAGEN_NAMES,
    "prime_rl": PRIME_RL_NAMES,
    "grpo_loop": GRPO_LOOP_NAMES,
}
"""One name table per trainer family (``"trl"`` covers transformers' ``Trainer`` too)."""

OLDER_NAMES: dict[str, dict[str, str]] = {
    # verl v0.3–v0.4 (``ray_trainer.fit``, 2025): agg_loss of the old policy's token entropies, the quantity
    # later logged as actor/entropy; read as the entropy only when a log has no actor/entropy
    "verl": {"actor/entropy_loss": "entropy"},
    # TRL before completions/mean_length (``GRPOTrainer``, early 2025): the mean of completion_mask.sum(1)
    "trl": {"completion_length": "response_len_mean"},
}
"""Names a family's older versions logged for a column the newer name now fills: a log read from a file
fills the column from the older name when the newer one is absent (``logs.read_source``)."""

_VERL_DATA_UNMAPPED = frozenset(
    {
        "critic/rewards/mean",  # the score minus the KL penalty in the reward
        "critic/rewards/max",
        "critic/rewards/min",
        "critic/vf_explained_var",
        "prompt_length/mean",
        "prompt_length/max",
        "prompt_length/min",
        "prompt_length/clip_ratio",
    }
)
UNMAPPED: dict[str, frozenset[str]] = {
    "trl": frozenset(
        {
            "epoch",
            "num_tokens",  # tokens seen so far (prompts too), not the update's
            "step_time",
            "entropy_coef",
            "completions/min_length",  # policy tokens, and the schema has no response_len_min
            "completions/mean_terminated_length",
            "completions/min_terminated_length",
            "completions/max_terminated_length",
            "clip_ratio/low_min",  # extremes of per-sequence clip shares
            "clip_ratio/high_max",
        }
    ),
    "verl": _VERL_DATA_UNMAPPED
    | {
        "actor/entropy_loss",  # the entropy of engine workers, beside actor/entropy (older verl: the entropy)
        "actor/kl_coef",
        "actor/reward_kl_penalty",  # KL in the reward (algorithm.kl_penalty), beside actor/kl_loss
        "actor/reward_kl_penalty_coeff",
        "critic/vpred_mean",
        "critic/grad_norm",
        "critic/lr",
        "num_turns/mean",  # messages per sample (user + assistant + 1), not policy turns
        "num_turns/max",
        "num_turns/min",
        "response_length_non_aborted/mean",
        "response_length_non_aborted/max",
        "response_length_non_aborted/min",
        "response_length_non_aborted/clip_ratio",
        "response/aborted_ratio",
        "training/global_step",
        "training/epoch",
    },
    # verl's data metrics, computed by RAGEN over the groups the rollout filter kept (critic/score/*) and
    # over whole sequences, prompt included (response_length/*, critic/advantages|returns|values/*)
    "ragen": _VERL_DATA_UNMAPPED
    | frozenset(VERL_DATA_NAMES)
    | {
        "actor/kl_coef",
        "actor/reward_kl_penalty",
        "actor/reward_kl_penalty_coeff",
        "critic/vpred_mean",
        "critic/grad_norm",
        "critic/lr",
        "rollout/in_group_max",  # mean over groups of the group's best score
        "rollout/chosen_in_group_std",  # the same over the groups the filter kept
        "rollout/chosen_in_group_max",
        "rollout/chosen_in_group_mean",
        "rollout/old_log_prob",
        "rollout/ref_log_prob",
    },
    "openrlhf": frozenset(
        {
            "train/reward",  # = train/rollout/reward_mean over the training micro-batches
            "train/response_length",  # = train/rollout/response_length_mean over the micro-batches
            "train/truncated",  # = train/rollout/truncated_rate over the micro-batches
            "train/response_clip_ratio",  # prompt + response reached the context length
            "train/total_length",
            "train/return",
            "train/score",
            "train/vllm_kl",  # the rollout engine vs π_old
            "train/logprobs_diff",
            "train/values",  # the critic's predictions during training
            "train/critic_lr",
            "train/critic_grad_norm",
            "train/rollout/num_samples",
            "train/dynamic_filtering_pass_rate",
        }
    ),
    "grpo_loop": frozenset(
        {
            "mean_reward",  # = train_reward
            "answer_accuracy",  # share of correct answers: the reward only when the reward is correctness
            "format_accuracy",
            "train_answer_accuracy",
            "train_format_accuracy",
            "mean_advantage",
            "std_advantage",
            "scaled_loss",  # the loss divided by gradient_accumulation_steps
            "kl_penalty",
            "grpo_step",
            "optimizer_step",
        }
    ),
    "prime_rl": frozenset(
        {
            "loss/mean",  # micro-batch losses normalised by the step's token count: a share of the loss
            "entropy/all/std",
            "entropy/all/max",
            "mismatch_kl/all/std",
            "mismatch_kl/all/max",
            "is_masked/mean",  # DPPO's trust region masks by probability difference, not by the ratio
            "is_masked_low/mean",
            "is_masked_high/mean",
            "train/agg/effective/num_total_tokens/mean",  # the whole context, prompt included
            "train/agg/effective/num_input_tokens/mean",
            "train/agg/effective/num_turns/mean",
        }
    ),
}
"""Names each family logs that are left unmapped (stored snake-cased), with the reason where it is not obvious."""

TRANSFORMERS_LOGGER_PREFIX = "train/"
"""transformers' W&B, TensorBoard and Comet callbacks log TRL's ``kl`` as ``train/kl``: such a name is TRL's
too, so it is no evidence for a family that logs the same name (OpenRLHF's ``train/kl``)."""

TAP_MEASURED = frozenset(
    {"entropy", "kl_old_k1", "clip_frac_active", "response_len_mean", "response_len_max"}
)
"""Columns a token-level tap measures itself for the update; a trainer's logged value of them (an average
over its logging window) is left out of that update's row rather than overwrite the measurement."""


def _is_tensor(value: Any) -> bool:
    """A torch tensor, told without importing torch (reading logs never needs it)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.Tensor)


def scalar(value: Any) -> float | bool | str | None:
    """A logged value as a storable scalar: numbers as float (so huge integers cannot overflow a column),
    bools and strings as they are, 1-element tensors and arrays unwrapped; anything else is ``None``."""
    kind = type(value)
    if kind is float or kind is str or kind is bool:
        return value
    if _is_tensor(value):
        if value.numel() != 1:
            return None
        value = value.detach().reshape(()).item()
    elif isinstance(value, np.ndarray):
        if value.size != 1:
            return None
        value = value.reshape(()).item()
    elif isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, bool | str):
        return value
    if isinstance(value, int | float):
        try:
            return float(value)
        except OverflowError:  # an int beyond float range
            return math.inf if value > 0 else -math.inf
    return None


def to_columns(metrics: Mapping[str, Any], names: Mapping[str, str]) -> dict[str, float | bool | str]:
    """``{column: value}`` of a trainer's metrics dict: mapped names first, others snake-cased.

    Values that are not scalars (lists, dicts, multi-element tensors) are left out; so is an unmapped name
    whose snake-cased form collides with a mapped column.
    """
    row: dict[str, float | bool | str] = {}
    unmapped: dict[str, float | bool | str] = {}
    for name, raw in metrics.items():
        value = scalar(raw)
        if value is None:
            continue
        column = names.get(name)
        if column is not None:
            row[column] = value
        else:
            unmapped.setdefault(column_name(name), value)
    for column, value in unmapped.items():
        row.setdefault(column, value)
    return row


@functools.lru_cache(maxsize=4096)
def _logged_only_by(name: str) -> str | None:
    """The one family known to log ``name`` (mapped or in ``UNMAPPED``), else ``None`` (cached: the tables
    are constants).

    A schema column mapped to itself says nothing about the trainer; neither does TRL's name as
    transformers' logging callbacks write it (``train/kl``), whoever else logs that name.
    """
    families = [
        family
        for family, table in NAME_TABLES.items()
        if table.get(name, name) != name or name in UNMAPPED.get(family, ())
    ]
    if len(families) != 1:
        return None
    bare = name.removeprefix(TRANSFORMERS_LOGGER_PREFIX)
    if bare != name and (bare in TRL_NAMES or bare in UNMAPPED["trl"]):
        return None
    return families[0]


def guess_family(keys: Iterable[str]) -> str | None:
    """The trainer family with the most distinctive names among ``keys``, or ``None`` if none or a tie.

    A name is distinctive when exactly one family is known to log it (``NAME_TABLES`` and ``UNMAPPED``):
    names that several trainers log (``loss``, verl's ``actor/*`` that RAGEN logs too) decide nothing.
    """
    hits = dict.fromkeys(NAME_TABLES, 0)
    for key in set(keys):
        if (family := _logged_only_by(key)) is not None:
            hits[family] += 1
    (best, most), (_, runner_up) = sorted(hits.items(), key=lambda item: item[1], reverse=True)[:2]
    return best if most > runner_up else None


def names_for(family: str | Mapping[str, str] | None) -> Mapping[str, str]:
    """The name table of ``family`` (a family name, a table itself, or ``None`` for no mapping)."""
    if family is None:
        return {}
    if isinstance(family, Mapping):
        return family
    if family not in NAME_TABLES:
        raise ValueError(f"unknown trainer family {family!r}; known: {', '.join(NAME_TABLES)}")
    return NAME_TABLES[family]


def map_metrics(
    metrics: Mapping[str, Any], family: str | Mapping[str, str] | None = "auto"
) -> dict[str, float | bool | str]:
    """``to_columns`` with the table of ``family``; ``"auto"`` guesses it from the keys, ``None`` maps nothing."""
    if family == "auto":
        family = guess_family(metrics)
    return to_columns(metrics, names_for(family))
