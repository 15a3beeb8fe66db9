"""One update's metrics, every one of docs/schema.md, computed on the tensors' device from the formulas of
``metrics`` (``update_metrics``), and their settings (``MetricsConfig``, which ``Monitor`` takes)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import torch
from torch import Tensor

from sorl_monitor.settings import check_setting
from sorl_monitor.write.metrics import (
    clip_active,
    clipped_high,
    clipped_low,
    entropy_from_logits,
    group_reward_stats,
    kl_k1,
    kl_k2,
    kl_k3,
    masked_extremes,
    masked_mean,
    masked_means,
    masked_sum,
    masked_tails,
    token_log_ratio,
    turn_ids_from_mask,
    turn_index,
    turn_mins,
    turn_sums,
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
    """What ``update_metrics`` returns, still on device: the step-level scalars as one ``(S,)`` tensor
    (``values``, named by ``names``) and the per-turn columns as one ``(len(TURN_COLUMNS) + 1, B, K)``
    tensor (``turn_table``: ``TURN_COLUMNS`` in order, then ``turn_valid`` as 0/1) — one host copy each."""

    names: list[str]
    values: Tensor
    turn_table: Tensor

    @property
    def scalars(self) -> dict[str, Tensor]:
        """``{name: 0-d tensor}``."""
        return dict(zip(self.names, self.values.unbind(), strict=True))

    @property
    def turns(self) -> dict[str, Tensor]:
        """``{turn column: (B, K) tensor}``."""
        return dict(zip(TURN_COLUMNS, self.turn_table.unbind(), strict=False))

    @property
    def turn_valid(self) -> Tensor:
        """``(B, K)`` bool: which turn slots exist."""
        return self.turn_table[-1] > 0


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


@lru_cache(maxsize=256)
def _positions(order: tuple[int, ...], device: torch.device) -> Tensor:
    """``order`` as an index tensor on ``device``, built once per (order, device): a tensor built from a Python
    list is a host→device copy, which on CUDA waits for the queued work (a sync)."""
    return torch.tensor(order, dtype=torch.long, device=device)


class _Scalars:
    """Named 1-D tensors of step-level scalars, gathered into one ``(S,)`` tensor in the order they were named."""

    def __init__(self) -> None:
        self.parts: list[Tensor] = []
        self.at: dict[str, int] = {}  # name → position in the concatenated parts
        self.size = 0

    def add(self, names: list[str | None], values: Tensor) -> None:
        """``values[i]`` is called ``names[i]`` (``None``: computed, not kept)."""
        self.at.update((name, self.size + i) for i, name in enumerate(names) if name is not None)
        self.parts.append(values)
        self.size += len(names)

    def gather(self, order: list[str]) -> Tensor:
        values = torch.cat(self.parts)
        return values.index_select(0, _positions(tuple(self.at[name] for name in order), values.device))


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
    """Every metric of docs/schema.md for one update: step-level scalars and per-turn columns, on the device.

    ``advantages``, ``values``, ``returns`` may be per token ``(B, T)`` or per sequence ``(B,)``;
    ``rewards`` is per episode ``(B,)`` or per token ``(B, T)`` (summed per row). The turn table holds
    the first ``max_turn_rows`` turn slots of each row; every step-level turn statistic uses all turns.

    The per-token quantities are zero-filled off the valid tokens, stacked, and reduced together (means as one
    matrix-vector product, extremes as one ``amin``/``amax``, tails by ``topk``, per-turn sums and minima as one
    scatter per quantity): a few dozen kernels per call whatever the inputs, so its fixed cost stays small.
    """
    dtype = torch.float32 if logp.device.type == "mps" else torch.float64
    shape, device = logp.shape, logp.device
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

    finite = _finite(logp, old_logp, ref_logp, entropy, adv, val, ret)
    valid = policy & finite
    eps_high = clip_eps if clip_eps_high is None else clip_eps_high
    zero = torch.zeros((), dtype=dtype, device=device)
    # every per-token quantity is zero-filled off the valid tokens, so masked sums are matrix-vector products
    log_ratio = torch.where(valid, token_log_ratio(logp, old_logp), zero)
    adv, val, ret, entropy = (
        None if x is None else torch.where(valid, x, zero) for x in (adv, val, ret, entropy)
    )
    ratio = log_ratio.exp()
    low, high = clipped_low(ratio, clip_eps), clipped_high(ratio, eps_high)
    token_clipped = (low | high).to(dtype)
    kl_old = kl_k3(log_ratio)
    out = _Scalars()

    # token level, one stack: the quantities with a spread first (min/max: ratio to return; std: adv to log ratio)
    spread = {"ratio": ratio} | {
        name: x for name, x in (("adv", adv), ("value", val), ("return", ret)) if x is not None
    }
    token = spread | {"log_ratio": log_ratio, "clip_frac": token_clipped, "clip_frac_low": low.to(dtype),
                      "clip_frac_high": high.to(dtype), "kl_old_k1": kl_k1(log_ratio), "kl_old_k2": kl_k2(log_ratio),
                      "kl_old_k3": kl_old}  # fmt: skip
    if ref_logp is not None:
        ref_x = torch.where(valid, ref_logp - logp, zero)
        token.update(kl_ref_k1=kl_k1(ref_x), kl_ref_k2=kl_k2(ref_x), kl_ref_k3=kl_k3(ref_x))
    if entropy is not None:
        token["entropy"] = entropy
    if adv is not None:
        token["clip_frac_active"] = clip_active(ratio, adv, clip_eps, eps_high).to(dtype)
    names = list(token)
    stack = torch.stack(list(token.values()))
    means = masked_means(stack, valid)
    out.add([name if name not in spread else f"{name}_mean" for name in names], means)
    n_spread = len(spread)
    deviations = stack[1 : n_spread + 1] - means[1 : n_spread + 1, None, None]  # adv … return, log ratio
    out.add([f"{name}_std" for name in names[1 : n_spread + 1]], masked_means(deviations**2, valid).sqrt())
    lowest, highest = masked_extremes(stack[:n_spread], valid)
    out.add([f"{name}_min" for name in spread], lowest)
    out.add([f"{name}_max" for name in spread], highest)
    out.add(["ratio_p01", "ratio_p99"], masked_tails(log_ratio, valid, 0.01).exp())

    # turn level: per-turn sums of every quantity in one index_add, extremes in one scatter_reduce
    in_turn = valid & (turn_ids >= 0)
    index = turn_index(turn_ids)
    summed = {"n_tokens": torch.ones(shape, dtype=dtype, device=device), "ratio": ratio, "log_ratio": log_ratio,
              "clip_frac": token_clipped, "kl_k3": kl_old}  # fmt: skip
    if adv is not None:
        summed["advantage"] = adv
    if entropy is not None:
        summed["entropy"] = entropy
    sums = turn_sums(torch.stack(list(summed.values())), index, in_turn)
    turn_means = dict(zip(summed, sums / sums[0].clamp_min(1), strict=True))
    n_tokens, turn_log_sum = sums[0], sums[2]
    turn_ratio_mean, turn_ratio_geo = turn_means["ratio"], turn_means["log_ratio"].exp()
    positions = torch.arange(shape[1], device=device).to(dtype).expand(shape)
    neg_max, turn_min, first = turn_mins(torch.stack((-ratio, ratio, positions)), index, in_turn)
    turn_exists = n_tokens > 0
    turn_clipped = (clipped_low(turn_ratio_mean, clip_eps) | clipped_high(turn_ratio_mean, eps_high)).to(
        dtype
    )
    per_turn = torch.stack((turn_ratio_mean, turn_ratio_geo, turn_clipped, turn_log_sum.abs()))
    out.add(
        ["turn_ratio_mean", "turn_geo_ratio_mean", "clip_frac_turn"], masked_means(per_turn[:3], turn_exists)
    )
    lowest, highest = masked_extremes(per_turn[[0, 3]], turn_exists)
    out.add(["turn_ratio_min", None], lowest)
    out.add(["turn_ratio_max", "turn_log_ratio_sum_max"], highest)

    # sequence level
    row_valid = valid.any(dim=1)
    seq_ratio = masked_mean(masked_mean(log_ratio, valid, dim=1).exp(), row_valid)
    nonfinite = (policy & ~finite).sum().to(dtype)
    episode_reward = None
    if rewards is not None:
        rewards = rewards.detach().to(dtype)
        episode_reward = masked_sum(rewards, policy, dim=1) if rewards.dim() == 2 else rewards
        reward_ok = torch.isfinite(episode_reward)
        nonfinite = nonfinite + (~reward_ok).sum().to(dtype)
        reward = torch.where(reward_ok, episode_reward, zero).unsqueeze(0)
        reward_mean = masked_means(reward, reward_ok)
        reward_std = masked_means((reward - reward_mean) ** 2, reward_ok).sqrt()
        out.add(["reward_mean", "reward_std", "reward_min", "reward_max"],
                torch.cat((reward_mean, reward_std, *masked_extremes(reward, reward_ok))))  # fmt: skip
        if group_ids is not None:  # host ids: an async copy (pageable memory is staged at once, no wait)
            group = group_reward_stats(
                torch.where(reward_ok, episode_reward, 0.0), group_ids.to(device, non_blocking=True)
            )
            out.add(
                ["group_reward_std", "zero_std_group_frac"],
                torch.stack((group["std_mean"], group["zero_std_frac"])),
            )
    lengths = policy.sum(dim=1).to(dtype)
    k = min(max_turn_rows, shape[1])
    out.add(["seq_ratio_mean", "nonfinite_count", "response_len_mean", "response_len_max", "turns_mean",
             "n_tokens", "turn_rows_truncated"],
            torch.stack((seq_ratio, nonfinite, lengths.mean(), lengths.max(),
                         turn_exists.sum(dim=1).to(dtype).mean(), valid.sum().to(dtype),
                         turn_exists[:, k:].sum().to(dtype))))  # fmt: skip

    names = [name for name in SCALAR_ORDER if name in out.at]
    scalar_values = out.gather(names)

    # the turn table (first k slots of each row)
    first = first[:, :k]
    first_index = first.clamp(0, shape[1] - 1).long()
    starts = first.isfinite()
    nan_turns = torch.full_like(first, float("nan"))

    def at_turn_start(x: Tensor | None) -> Tensor:
        return nan_turns if x is None else torch.where(starts, x.gather(1, first_index), nan_turns)

    turn = {
        "n_tokens": n_tokens,
        "ratio_mean": turn_ratio_mean,
        "ratio_geomean": turn_ratio_geo,
        "log_ratio_sum": turn_log_sum,
        "ratio_max": -neg_max,
        "ratio_min": turn_min,
        "clip_frac": turn_means["clip_frac"],
        "turn_clipped": turn_clipped,
        "kl_k3": turn_means["kl_k3"],
    }
    for name in ("advantage", "entropy"):
        if name in turn_means:
            turn[name] = turn_means[name]
    sliced = {name: column[:, :k] for name, column in turn.items()}
    sliced.update(value=at_turn_start(val), **{"return": at_turn_start(ret)})
    if episode_reward is not None:
        sliced["reward"] = episode_reward.unsqueeze(1).expand_as(first)
    table = torch.stack(
        [sliced.get(name, nan_turns) for name in TURN_COLUMNS] + [turn_exists[:, :k].to(dtype)]
    )
    return UpdateMetrics(names=names, values=scalar_values, turn_table=table)


def _stats(prefix: str) -> list[str]:
    return [f"{prefix}_{stat}" for stat in ("mean", "std", "min", "max")]


SCALAR_ORDER = [
    "ratio_mean", "ratio_min", "ratio_max", "ratio_p01", "ratio_p99", "log_ratio_std", "clip_frac",
    "clip_frac_low", "clip_frac_high", "kl_old_k1", "kl_old_k2", "kl_old_k3", "seq_ratio_mean",
    "turn_ratio_mean", "turn_ratio_max", "turn_ratio_min", "turn_geo_ratio_mean", "turn_log_ratio_sum_max",
    "clip_frac_turn", "kl_ref_k1", "kl_ref_k2", "kl_ref_k3", "entropy", *_stats("adv"), "clip_frac_active",
    *_stats("value"), *_stats("return"), *_stats("reward"), "group_reward_std", "zero_std_group_frac",
    "nonfinite_count", "response_len_mean", "response_len_max", "turns_mean", "n_tokens", "turn_rows_truncated",
]  # fmt: skip
"""The step-level scalars ``update_metrics`` returns, in this order (those whose inputs were given)."""
