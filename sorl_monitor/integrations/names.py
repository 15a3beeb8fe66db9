"""Trainers' metric names → ``steps`` columns (docs/attach.md has the table with each one's meaning).

A name is mapped only where the trainer computes the same quantity as the schema's column; anything
else keeps its own name, snake-cased (``rollout_corr/rollout_is_mean`` → ``rollout_corr_rollout_is_mean``),
so nothing a trainer logs is lost and nothing is stored under a name that means something else.
Looked up in the sources: transformers 5.x ``Trainer._maybe_log_save_evaluate``, TRL 1.16
``GRPOTrainer`` (``_compute_loss``, ``_generate_and_score_completions``), verl
``compute_policy_loss_vanilla``, ``dp_actor``, ``dp_critic``, ``metric_utils.compute_data_metrics``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import torch

from sorl_monitor.schema import column_name

HF_TRAINER_NAMES: dict[str, str] = {
    "loss": "loss",  # training loss averaged over the logging window
    "grad_norm": "grad_norm",  # global L2 norm before clipping (``clip_grad_norm_``'s return value)
    "learning_rate": "lr",
}

TRL_NAMES: dict[str, str] = {
    **HF_TRAINER_NAMES,
    "policy_loss": "pg_loss",
    # not mapped: "kl" is k3 of KL(π_θ‖π_ref) times the token IS ratio r_t when use_bias_correction_kl
    # (TRL 1.16's default), so it is kept as ``kl``; the token tap measures kl_ref_k3 itself.
    "entropy": "entropy",
    # (r < 1−ε_low ∧ A < 0) ∨ (r > 1+ε_high ∧ A > 0): where the clip binds, = clip_active
    "clip_ratio/region_mean": "clip_frac_active",
    "clip_ratio/low_mean": "clip_frac_active_low",  # r < 1−ε_low ∧ A < 0 (not the schema's clip_frac_low)
    "clip_ratio/high_mean": "clip_frac_active_high",  # r > 1+ε_high ∧ A > 0
    "reward": "reward_mean",
    "reward_std": "reward_std",  # std of the batch's rewards (all groups together)
    "frac_reward_zero_std": "zero_std_group_frac",  # share of samples whose group has reward std 0
    # not mapped: completions/*_length count tool outputs too; response_len_* counts policy tokens only.
}

VERL_NAMES: dict[str, str] = {
    "actor/pg_loss": "pg_loss",
    # gt(−A·clip(r), −A·r) = (r > 1+ε_high ∧ A > 0) ∨ (r < 1−ε_low ∧ A < 0): where the clip binds
    "actor/pg_clipfrac": "clip_frac_active",
    # dual-clip bound: −A·r > −A·clip_ratio_c with A < 0, i.e. r > clip_ratio_c on negative advantages
    "actor/pg_clipfrac_lower": "dual_clip_frac",
    "actor/ppo_kl": "kl_old_k1",  # masked mean of −(log π_θ − log π_old)
    "actor/entropy": "entropy",  # aggregated by loss_agg_mode: the masked token mean under "token-mean"
    "actor/grad_norm": "grad_norm",
    "actor/lr": "lr",
    "critic/vf_loss": "vf_loss",
    "critic/vf_clipfrac": "vf_clip_frac",
    "critic/score/mean": "reward_mean",  # sequence score from the reward function
    "critic/score/max": "reward_max",
    "critic/score/min": "reward_min",
    "critic/advantages/mean": "adv_mean",
    "critic/advantages/max": "adv_max",
    "critic/advantages/min": "adv_min",
    "critic/returns/mean": "return_mean",
    "critic/returns/max": "return_max",
    "critic/returns/min": "return_min",
    "critic/values/mean": "value_mean",
    "critic/values/max": "value_max",
    "critic/values/min": "value_min",
    # not mapped: response_length/* count tool-response tokens too (response_len_* counts policy tokens);
    # num_turns/* counts messages (user + assistant + 1), not policy turns (turns_mean);
    # rollout_corr/* compare the trainer with the rollout engine, not π_θ with π_old.
}

TAP_MEASURED = frozenset({"entropy", "kl_old_k1", "clip_frac_active"})
"""Columns a token-level tap measures itself for the update; a trainer's logged value of them (an average
over its logging window) is left out of that update's row rather than overwrite the measurement."""


def scalar(value: Any) -> float | bool | str | None:
    """A logged value as a storable scalar: numbers as float (so huge integers cannot overflow a column),
    bools and strings as they are, 1-element tensors and arrays unwrapped; anything else is ``None``."""
    if isinstance(value, torch.Tensor):
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
        if name in names:
            row[names[name]] = value
        else:
            unmapped.setdefault(column_name(name), value)
    for column, value in unmapped.items():
        row.setdefault(column, value)
    return row


NAME_TABLES: dict[str, Mapping[str, str]] = {
    "trl": TRL_NAMES,
    "verl": VERL_NAMES,
}
"""One name table per trainer family (``"trl"`` covers transformers' ``Trainer`` too)."""


def guess_family(keys: Iterable[str]) -> str | None:
    """The trainer family whose table maps the most of ``keys`` (at least one), or ``None``."""
    keys = set(keys)
    best, best_hits = None, 0
    for family, table in NAME_TABLES.items():
        hits = len(keys & set(table))
        if hits > best_hits:
            best, best_hits = family, hits
    return best


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
