"""One update's metrics, every one of docs/schema.md, computed on the tensors' device from the formulas of
``metrics`` (``update_metrics``), and their settings (``MetricsConfig``, which ``Monitor`` takes)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from sorl_monitor.settings import check_setting
from sorl_monitor.write.metrics import (
    clip_active,
    clip_fraction,
    clipped_high,
    clipped_low,
    entropy_from_logits,
    group_reward_stats,
    kl_k1,
    kl_k2,
    kl_k3,
    masked_max,
    masked_mean,
    masked_min,
    masked_quantile,
    masked_std,
    masked_sum,
    token_log_ratio,
    turn_count,
    turn_ids_from_mask,
    turn_mean,
    turn_reduce,
    turn_sum,
    value_stats,
)

TURN_COLUMNS = (
    "n_tokens",
    "ratio_mean",
    "ratio_geomean",
    "log_ratio_sum",
    "ratio_max",
    "ratio_min",
    "clip_frac",
    "turn_clipped",
    "advantage",
    "value",
    "return",
    "reward",
    "kl_k3",
    "entropy",
)
"""Per-turn statistics that ``update_metrics`` returns for the ``turns`` table, in this order."""


@dataclass(frozen=True)
class MetricsConfig:
    """What ``Monitor.log_update`` computes: ``Monitor(log_dir, metrics=MetricsConfig(clip_eps=0.28))``. A setting
    that cannot work (``clip_eps <= 0``, ``max_turn_rows < 0``) raises ``ValueError`` when it is made."""

    clip_eps: float = 0.2
    """PPO's trust region ``[1 − ε_low, 1 + ε_high]`` for the clip fractions: ε_low…"""
    clip_eps_high: float | None = None
    """…and ε_high (``None``: ``clip_eps``)."""
    max_turn_rows: int = 64
    """Turn slots per episode written to the ``turns`` table (step-level turn statistics use every turn)."""

    def __post_init__(self) -> None:
        check_setting("max_turn_rows", self.max_turn_rows, least=0, integer=True)
        check_setting("clip_eps", self.clip_eps, above=0)
        if self.clip_eps_high is not None:
            check_setting("clip_eps_high", self.clip_eps_high, above=0)


DEFAULTS = MetricsConfig()


@dataclass
class UpdateMetrics:
    """What ``update_metrics`` returns, still on device: 0-d ``scalars`` and ``(B, K)`` ``turns`` columns."""

    scalars: dict[str, Tensor]
    turns: dict[str, Tensor] = field(default_factory=dict)
    turn_valid: Tensor | None = None


def _finite(*tensors: Tensor | None) -> Tensor | None:
    """True where every given per-token tensor is finite (``None`` entries are skipped)."""
    result = None
    for t in tensors:
        if t is None:
            continue
        ok = torch.isfinite(t)
        result = ok if result is None else result & ok
    return result


def _per_token(x: Tensor | None, shape: torch.Size, dtype: torch.dtype) -> Tensor | None:
    """A ``(B,)`` per-sequence tensor spread over the ``(B, T)`` tokens; ``(B, T)`` passes through."""
    if x is None:
        return None
    x = x.detach().to(dtype)
    return x.unsqueeze(1).expand(shape) if x.dim() == 1 else x


@torch.no_grad()
def update_metrics(
    logp: Tensor,
    old_logp: Tensor,
    mask: Tensor,
    *,
    turn_ids: Tensor | None = None,
    ref_logp: Tensor | None = None,
    logits: Tensor | None = None,
    entropy: Tensor | None = None,
    advantages: Tensor | None = None,
    values: Tensor | None = None,
    returns: Tensor | None = None,
    rewards: Tensor | None = None,
    group_ids: Tensor | None = None,
    clip_eps: float = DEFAULTS.clip_eps,
    clip_eps_high: float | None = DEFAULTS.clip_eps_high,
    max_turn_rows: int = DEFAULTS.max_turn_rows,
) -> UpdateMetrics:
    """Every metric of docs/schema.md for one update, as 0-d tensors (``scalars``) and per-turn columns (``turns``).

    ``advantages``, ``values``, ``returns`` may be per token ``(B, T)`` or per sequence ``(B,)``;
    ``rewards`` is per episode ``(B,)`` or per token ``(B, T)`` (summed per row). ``turns`` holds the
    first ``max_turn_rows`` turn slots of each row (``turn_valid`` says which exist); every step-level
    turn statistic uses all turns.
    """
    dtype = torch.float32 if logp.device.type == "mps" else torch.float64
    shape = logp.shape
    logp, old_logp = logp.detach().to(dtype), old_logp.detach().to(dtype)
    policy = mask.bool()
    if turn_ids is None:
        turn_ids = turn_ids_from_mask(policy)
    ref_logp = None if ref_logp is None else ref_logp.detach().to(dtype)
    if entropy is None and logits is not None:
        entropy = entropy_from_logits(logits.detach())
    entropy = None if entropy is None else entropy.detach().to(dtype)
    adv = _per_token(advantages, shape, dtype)
    val = _per_token(values, shape, dtype)
    ret = _per_token(returns, shape, dtype)

    token_inputs = (logp, old_logp, ref_logp, entropy, adv, val, ret)
    finite = _finite(*token_inputs)
    valid = policy & finite
    eps_high = clip_eps if clip_eps_high is None else clip_eps_high

    log_ratio = torch.where(
        valid, token_log_ratio(logp, old_logp), torch.zeros((), dtype=dtype, device=logp.device)
    )
    ratio = log_ratio.exp()
    clip = clip_fraction(ratio, valid, clip_eps, eps_high)
    tails = masked_quantile(log_ratio, valid, [0.01, 0.99]).exp()
    s: dict[str, Tensor] = {
        "ratio_mean": masked_mean(ratio, valid),
        "ratio_min": masked_min(ratio, valid),
        "ratio_max": masked_max(ratio, valid),
        "ratio_p01": tails[0],
        "ratio_p99": tails[1],
        "log_ratio_std": masked_std(log_ratio, valid),
        "clip_frac": clip["total"],
        "clip_frac_low": clip["low"],
        "clip_frac_high": clip["high"],
        "kl_old_k1": masked_mean(kl_k1(log_ratio), valid),
        "kl_old_k2": masked_mean(kl_k2(log_ratio), valid),
        "kl_old_k3": masked_mean(kl_k3(log_ratio), valid),
    }
    row_valid = valid.any(dim=1)
    s["seq_ratio_mean"] = masked_mean(masked_mean(log_ratio, valid, dim=1).exp(), row_valid)

    # turn-level IS, the arithmetic form: w̄_k = mean_{t∈k} r_t (docs/schema.md, "The turn ratio")
    in_turn = valid & (turn_ids >= 0)
    n_tokens = turn_count(turn_ids, in_turn)
    turn_exists = n_tokens > 0
    turn_ratio_mean = turn_mean(ratio, turn_ids, in_turn)
    turn_log_sum = turn_sum(log_ratio, turn_ids, in_turn)
    turn_ratio_geo = (turn_log_sum / n_tokens.clamp_min(1)).exp()
    turn_clipped = clipped_low(turn_ratio_mean, clip_eps) | clipped_high(turn_ratio_mean, eps_high)
    s["turn_ratio_mean"] = masked_mean(turn_ratio_mean, turn_exists)
    s["turn_ratio_max"] = masked_max(turn_ratio_mean, turn_exists)
    s["turn_ratio_min"] = masked_min(turn_ratio_mean, turn_exists)
    s["turn_geo_ratio_mean"] = masked_mean(turn_ratio_geo, turn_exists)
    s["turn_log_ratio_sum_max"] = masked_max(turn_log_sum.abs(), turn_exists)
    s["clip_frac_turn"] = masked_mean(turn_clipped.to(dtype), turn_exists)

    if ref_logp is not None:
        ref_x = torch.where(valid, ref_logp - logp, torch.zeros((), dtype=dtype, device=logp.device))
        s["kl_ref_k1"] = masked_mean(kl_k1(ref_x), valid)
        s["kl_ref_k2"] = masked_mean(kl_k2(ref_x), valid)
        s["kl_ref_k3"] = masked_mean(kl_k3(ref_x), valid)
    if entropy is not None:
        s["entropy"] = masked_mean(entropy, valid)
    if adv is not None:
        for name, value in value_stats(adv, valid).items():
            s[f"adv_{name}"] = value
        s["clip_frac_active"] = masked_mean(clip_active(ratio, adv, clip_eps, eps_high).to(dtype), valid)
    if val is not None:
        for name, value in value_stats(val, valid).items():
            s[f"value_{name}"] = value
    if ret is not None:
        for name, value in value_stats(ret, valid).items():
            s[f"return_{name}"] = value

    episode_reward = None
    nonfinite = (policy & ~finite).sum().to(dtype)
    if rewards is not None:
        rewards = rewards.detach().to(dtype)
        episode_reward = masked_sum(rewards, policy, dim=1) if rewards.dim() == 2 else rewards
        reward_ok = torch.isfinite(episode_reward)
        nonfinite = nonfinite + (~reward_ok).sum().to(dtype)
        for name, value in value_stats(episode_reward, reward_ok).items():
            s[f"reward_{name}"] = value
        if group_ids is not None:  # host ids: an async copy (pageable memory is staged at once, no wait)
            group = group_reward_stats(
                torch.where(reward_ok, episode_reward, 0.0), group_ids.to(logp.device, non_blocking=True)
            )
            s["group_reward_std"] = group["std_mean"]
            s["zero_std_group_frac"] = group["zero_std_frac"]
    s["nonfinite_count"] = nonfinite
    s["response_len_mean"] = policy.sum(dim=1).to(dtype).mean()
    s["response_len_max"] = policy.sum(dim=1).to(dtype).max()
    s["turns_mean"] = turn_exists.sum(dim=1).to(dtype).mean()
    s["n_tokens"] = valid.sum().to(dtype)

    # per-turn rows for the ``turns`` table (first max_turn_rows slots of each row)
    k = min(max_turn_rows, shape[1])
    positions = torch.arange(shape[1], device=logp.device).expand(shape)
    first = turn_reduce(positions.to(dtype), turn_ids, in_turn, "amin")[:, :k]
    first_index = first.clamp(0, shape[1] - 1).long()

    def at_turn_start(x: Tensor | None) -> Tensor:
        if x is None:
            return torch.full_like(first, float("nan"))
        return torch.where(first.isfinite(), x.gather(1, first_index), torch.full_like(first, float("nan")))

    def per_turn_mean(x: Tensor | None) -> Tensor:
        if x is None:
            return torch.full_like(first, float("nan"))
        return turn_mean(x, turn_ids, in_turn)[:, :k]

    token_clipped = (clipped_low(ratio, clip_eps) | clipped_high(ratio, eps_high)).to(dtype)
    turns = {
        "n_tokens": n_tokens[:, :k],
        "ratio_mean": turn_ratio_mean[:, :k],
        "ratio_geomean": turn_ratio_geo[:, :k],
        "log_ratio_sum": turn_log_sum[:, :k],
        "ratio_max": turn_reduce(ratio, turn_ids, in_turn, "amax")[:, :k],
        "ratio_min": turn_reduce(ratio, turn_ids, in_turn, "amin")[:, :k],
        "clip_frac": turn_mean(token_clipped, turn_ids, in_turn)[:, :k],
        "turn_clipped": turn_clipped[:, :k].to(dtype),
        "advantage": per_turn_mean(adv),
        "value": at_turn_start(val),
        "return": at_turn_start(ret),
        "reward": (
            torch.full_like(first, float("nan"))
            if episode_reward is None
            else episode_reward.unsqueeze(1).expand_as(first)
        ),
        "kl_k3": per_turn_mean(kl_k3(log_ratio)),
        "entropy": per_turn_mean(entropy),
    }
    s["turn_rows_truncated"] = turn_exists[:, k:].sum().to(dtype)
    return UpdateMetrics(scalars=s, turns=turns, turn_valid=turn_exists[:, :k])
