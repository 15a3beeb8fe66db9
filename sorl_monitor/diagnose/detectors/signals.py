"""What the detectors read: each signal from whichever of its ``steps`` columns a run logs."""

from __future__ import annotations

from dataclasses import dataclass


def _finite(expression: str) -> str:
    return f"CASE WHEN isfinite({expression}) THEN {expression} END"


@dataclass(frozen=True)
class Signal:
    """One quantity a run logs, from whichever of its ``columns`` it has (first non-null wins)."""

    expression: str
    columns: tuple[str, ...]


OPTIONAL_SIGNALS = ("optimized",)
"""Signals only some logs can carry (a task score beside the reward the trainer optimizes): a detector that reads
one is not counted as lacking inputs where the log does not have it."""

NONFINITE_COLUMNS = ("loss", "pg_loss", "grad_norm", "kl_old_k3", "ratio_max", "entropy")

SIGNALS: dict[str, Signal] = {
    "clip": Signal(_finite("coalesce(clip_frac, clip_frac_active)"), ("clip_frac", "clip_frac_active")),
    "turn_clip": Signal(_finite("clip_frac_turn"), ("clip_frac_turn",)),
    "kl_to_old": Signal(
        _finite("nullif(coalesce(kl_old_k3, kl_old_k2, kl_old, abs(kl_old_k1)), 0)"),
        ("kl_old_k3", "kl_old_k2", "kl_old", "kl_old_k1"),
    ),
    "kl_to_ref": Signal(
        _finite("nullif(coalesce(kl_ref_k3, kl_ref_k2, kl_ref, abs(kl_ref_k1)), 0)"),
        ("kl_ref_k3", "kl_ref_k2", "kl_ref", "kl_ref_k1"),
    ),
    "ratio_tail": Signal(_finite("ln(greatest(ratio_p99, 1))"), ("ratio_p99",)),
    "token_entropy": Signal(_finite("entropy"), ("entropy",)),
    "grad_log": Signal(_finite("ln(nullif(grad_norm, 0))"), ("grad_norm",)),
    "zero_std": Signal(_finite("zero_std_group_frac"), ("zero_std_group_frac",)),
    "reward": Signal(_finite("reward_mean"), ("reward_mean",)),
    "optimized": Signal(_finite("reward_optimized_mean"), ("reward_optimized_mean",)),
    "reward_spread": Signal(_finite("reward_std"), ("reward_std",)),
    "length": Signal(
        _finite("coalesce(response_len_mean, completion_len_mean)"),
        ("response_len_mean", "completion_len_mean"),
    ),
    "truncation": Signal(_finite("completion_truncated_frac"), ("completion_truncated_frac",)),
    "nonfinite": Signal(
        "coalesce(nonfinite_count, 0) + "
        + " + ".join(
            f"(CASE WHEN isfinite({c}) OR {c} IS NULL THEN 0 ELSE 1 END)" for c in NONFINITE_COLUMNS
        ),
        ("nonfinite_count", *NONFINITE_COLUMNS),
    ),
}
"""What the detectors read. A signal takes the first non-null of its columns (``clip``: our token clip
fraction, or the share where the clip binds as verl's ``pg_clipfrac`` / TRL's ``clip_ratio/region_mean``
report it; ``kl_to_old``: k3, k2, the trainer's own estimator, |k1|); non-finite values are left out (the
``nonfinite`` detector counts them), and so are exact zeros of the grad norm (no-gradient batches) and
of the KL (an update on its own rollout)."""
