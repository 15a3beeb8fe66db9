"""The stability metrics' formulas: pure, batched, masked torch functions (docs/schema.md; one update's metrics
put together: ``update_metrics``).

Shapes: ``B`` sequences (episodes) of ``T`` tokens. ``mask`` is 1 on policy-generated tokens (the
tokens the loss trains), 0 on prompt, observation and padding tokens. ``turn_ids`` holds each token's
turn index (0, 1, …) inside its row and −1 off policy tokens; without it, turns are the contiguous
runs of policy tokens (``turn_ids_from_mask``). Per-turn tensors have shape ``(B, T)``: a row has at
most ``T`` turns, so column ``k`` holds turn ``k`` and unused columns have count 0.

Every reduction is masked, runs on the tensors' device with no per-token Python loop and no host
sync; the functions that train with (``token_log_ratio``, ``turn_ratio``, ``clip_fraction``,
``kl_k3``, ``masked_mean``) are differentiable and shared with the bundled trainer's losses.
Non-finite inputs are counted (``nonfinite_count``) and left out of every other statistic.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

QUANTILE_MAX_ELEMENTS = 1 << 24  # torch.quantile's input limit; larger inputs are strided down


# --------------------------------------------------------------------------- masked reductions
def masked_sum(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """``Σ x·mask`` (masked entries may hold NaN/Inf: they are never touched)."""
    masked = torch.where(mask.bool(), x, torch.zeros((), dtype=x.dtype, device=x.device))
    return masked.sum() if dim is None else masked.sum(dim)


def masked_mean(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """``Σ x·mask / Σ mask``; NaN where nothing is selected."""
    count = mask.sum() if dim is None else mask.sum(dim)
    total = masked_sum(x, mask, dim)
    return torch.where(count > 0, total / count.clamp_min(1), torch.full_like(total, float("nan")))


def masked_tails(x: Tensor, mask: Tensor, tail: float) -> Tensor:
    """Quantiles ``tail`` and ``1 − tail`` of the selected values, shape ``(2,)``; NaN where nothing is selected.

    The same values as ``torch.nanquantile`` (linear interpolation: rank ``q·(n − 1)`` over the ``n`` selected
    values), but only the ``⌈tail·(N − 1)⌉ + 2`` lowest and highest of the ``N`` entries are ranked (``topk``),
    not all of them sorted. Inputs above ``QUANTILE_MAX_ELEMENTS`` entries are strided down to that size first.
    """
    values, selected = x.flatten(), mask.flatten().bool()
    if values.numel() > QUANTILE_MAX_ELEMENTS:
        stride = -(-values.numel() // QUANTILE_MAX_ELEMENTS)
        values, selected = values[::stride], selected[::stride]
    k = min(values.numel(), math.ceil(tail * (values.numel() - 1)) + 2)
    lowest = torch.where(selected, values, float("inf")).topk(k, largest=False).values  # ascending
    highest = torch.where(selected, values, float("-inf")).topk(k).values  # descending
    n = selected.sum()
    tails = []
    for ranked, q in ((lowest, tail), (highest, 1 - tail)):
        rank = (q * (n - 1).to(values.dtype)).clamp_min(0)  # in the n selected values, ascending
        below, above = rank.long(), rank.ceil().long()
        if ranked is highest:  # ascending rank r is descending position n − 1 − r
            below, above = n - 1 - below, n - 1 - above
        lower, upper = (ranked.gather(0, i.clamp(0, k - 1).view(1)) for i in (below, above))
        tails.append(lower.lerp(upper, rank - rank.floor()))
    return torch.where(n > 0, torch.cat(tails), float("nan"))


def masked_means(x: Tensor, mask: Tensor) -> Tensor:
    """``Σ x[q]·mask / Σ mask`` for every ``x[q]`` of ``x (Q, …)`` in one matrix-vector product, shape ``(Q,)``;
    NaN where nothing is selected. ``x`` must be finite where ``mask`` is not set (e.g. zero-filled)."""
    weights = mask.reshape(-1).to(x.dtype)
    count = weights.sum()
    means = x.reshape(len(x), -1) @ weights / count.clamp_min(1)
    return torch.where(count > 0, means, float("nan"))


def masked_extremes(x: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """Smallest and largest selected value of every ``x[q]`` of ``x (Q, …)``, each of shape ``(Q,)``; NaN where
    nothing is selected."""
    dims = tuple(range(1, x.dim()))
    some = mask.any()
    low = torch.where(mask, x, float("inf")).amin(dims)
    high = torch.where(mask, x, float("-inf")).amax(dims)
    return torch.where(some, low, float("nan")), torch.where(some, high, float("nan"))


# --------------------------------------------------------------------------- turns
def turn_ids_from_mask(mask: Tensor) -> Tensor:
    """Turn index of each policy token: contiguous runs of ``mask == 1`` numbered 0, 1, … per row, −1 elsewhere."""
    policy = mask.bool()
    previous = F.pad(policy[:, :-1], (1, 0), value=False)
    starts = policy & ~previous
    ids = starts.long().cumsum(dim=1) - 1
    return torch.where(policy, ids, torch.full_like(ids, -1))


def turn_index(turn_ids: Tensor) -> Tensor:
    """Flat index ``b·T + k`` of each token's turn (turn ids below 0 map to the row's slot 0; mask them)."""
    batch, length = turn_ids.shape
    rows = torch.arange(batch, device=turn_ids.device).unsqueeze(1) * length
    return (rows + turn_ids.clamp(0, length - 1)).flatten()


def turn_sum(x: Tensor, turn_ids: Tensor, valid: Tensor) -> Tensor:
    """Per-turn ``Σ_{t∈k} x_t`` over valid tokens, shape ``(B, T)`` (differentiable; ``turn_sums`` of one)."""
    return turn_sums(x.unsqueeze(0), turn_index(turn_ids), valid)[0]


def turn_count(turn_ids: Tensor, valid: Tensor) -> Tensor:
    """Number of valid tokens in each turn, shape ``(B, T)``."""
    return turn_sum(valid.to(torch.float32), turn_ids, valid)


def turn_mean(x: Tensor, turn_ids: Tensor, valid: Tensor) -> Tensor:
    """Per-turn mean over valid tokens, shape ``(B, T)``; 0 for empty turn slots (differentiable)."""
    count = turn_count(turn_ids, valid).to(x.dtype)
    return turn_sum(x, turn_ids, valid) / count.clamp_min(1)


def turn_sums(x: Tensor, index: Tensor, valid: Tensor) -> Tensor:
    """Per-turn ``Σ_{t∈k} x[q, t]`` over valid tokens for every ``x[q]`` of ``x (Q, B, T)``: shape ``(Q, B, T)``.
    ``index``: ``turn_index(turn_ids)``. One 1-D ``index_add`` per ``q``: on the CPU, one along dimension 1
    of the whole stack is several times slower once the stack outgrows the cache."""
    source = torch.where(valid, x, 0.0).reshape(len(x), -1)
    return torch.stack([torch.zeros_like(values).index_add(0, index, values) for values in source]).view(
        x.shape
    )


def turn_mins(x: Tensor, index: Tensor, valid: Tensor) -> Tensor:
    """Per-turn ``min_{t∈k} x[q, t]`` over valid tokens for every ``x[q]`` of ``x (Q, B, T)`` (a maximum is
    ``−min(−x)``): shape ``(Q, B, T)``, inf for empty slots. One 1-D ``scatter_reduce`` per ``q``."""
    source = torch.where(valid, x, float("inf")).reshape(len(x), -1)
    lowest = [
        torch.full_like(values, float("inf")).scatter_reduce(0, index, values, "amin") for values in source
    ]
    return torch.stack(lowest).view(x.shape)


def broadcast_turns(per_turn: Tensor, turn_ids: Tensor) -> Tensor:
    """Give every token its turn's value (``per_turn`` is ``(B, T)``); tokens off any turn get 0."""
    gathered = per_turn.gather(1, turn_ids.clamp(0, per_turn.shape[1] - 1))
    return torch.where(turn_ids >= 0, gathered, torch.zeros_like(gathered))


# --------------------------------------------------------------------------- ratios, clipping, KL
def token_log_ratio(logp: Tensor, old_logp: Tensor) -> Tensor:
    """``log r_t = log π_θ(y_t) − log π_old(y_t)``."""
    return logp - old_logp


def turn_ratio(
    log_ratio: Tensor, turn_ids: Tensor, valid: Tensor | None = None, mode: str = "mean"
) -> Tensor:
    """Turn-level IS ratio broadcast to the turn's tokens (differentiable).

    ``mode="mean"``: the arithmetic form ``w̄_k = mean_{t∈k} r_t`` (the default here, and what the monitor logs);
    ``mode="geomean"``: the geometric form ``w̄_k = exp(mean_{t∈k} log r_t)`` (the trainer's default turn ratio).
    Both forms: docs/schema.md, "The turn ratio".
    """
    if valid is None:
        valid = turn_ids >= 0
    if mode == "mean":
        per_turn = turn_mean(log_ratio.exp(), turn_ids, valid)
    elif mode == "geomean":
        per_turn = turn_mean(log_ratio, turn_ids, valid).exp()
    else:
        raise ValueError(f"turn ratio mode must be 'mean' or 'geomean', not {mode!r}")
    return broadcast_turns(per_turn, turn_ids)


def clipped_low(ratio: Tensor, eps_low: float) -> Tensor:
    """``r < 1 − ε_low`` (the bound that binds when the advantage is negative)."""
    return ratio < 1.0 - eps_low


def clipped_high(ratio: Tensor, eps_high: float) -> Tensor:
    """``r > 1 + ε_high`` (the bound that binds when the advantage is positive)."""
    return ratio > 1.0 + eps_high


def clip_fraction(
    ratio: Tensor, mask: Tensor, eps_low: float, eps_high: float | None = None
) -> dict[str, Tensor]:
    """Share of selected entries outside the trust region ``[1 − ε_low, 1 + ε_high]``.

    Returns ``total`` (= ``low`` + ``high``), ``low`` (``r < 1 − ε_low``) and ``high`` (``r > 1 + ε_high``),
    as CleanRL's ``clipfracs``: whether or not the advantage's sign makes the clip bind.
    """
    eps_high = eps_low if eps_high is None else eps_high
    low = masked_mean(clipped_low(ratio, eps_low).to(ratio.dtype), mask)
    high = masked_mean(clipped_high(ratio, eps_high).to(ratio.dtype), mask)
    return {"total": low + high, "low": low, "high": high}


def clip_active(ratio: Tensor, advantages: Tensor, eps_low: float, eps_high: float | None = None) -> Tensor:
    """Where PPO's clip binds and zeroes the gradient: ``(r < 1−ε_low ∧ A < 0) ∨ (r > 1+ε_high ∧ A > 0)``."""
    eps_high = eps_low if eps_high is None else eps_high
    return (clipped_low(ratio, eps_low) & (advantages < 0)) | (
        clipped_high(ratio, eps_high) & (advantages > 0)
    )


def to_host(values: dict[str, Tensor]) -> dict[str, float]:
    """Scalar tensors as floats in one stacked copy to the host (one sync, not one per value); float64 where the
    device has it (not MPS)."""
    if not values:
        return {}
    first = next(iter(values.values()))
    dtype = torch.float32 if first.device.type == "mps" else torch.float64
    stacked = torch.stack([value.detach().to(dtype).reshape(()) for value in values.values()])
    return dict(zip(values, stacked.tolist(), strict=True))


def kl_k1(log_ratio: Tensor) -> Tensor:
    """Schulman's k1 ``−x`` with ``x = log π_θ − log π_old``: unbiased for KL(π_old‖π_θ) on π_old samples."""
    return -log_ratio


def kl_k2(log_ratio: Tensor) -> Tensor:
    """Schulman's k2 ``x²/2``: low-variance, biased estimate of KL(π_old‖π_θ)."""
    return 0.5 * log_ratio**2


def kl_k3(log_ratio: Tensor) -> Tensor:
    """Schulman's k3 ``r − 1 − log r = exp(x) − 1 − x`` (≥ 0): unbiased for KL(π_old‖π_θ) on π_old samples.

    Against a reference policy pass ``x = log π_ref − log π_θ``: then it estimates KL(π_θ‖π_ref), as GRPO does.
    """
    return log_ratio.exp() - 1.0 - log_ratio


def entropy_from_logits(logits: Tensor) -> Tensor:
    """Per-token entropy ``H_t = −Σ_v p_v log p_v`` of the softmax over the last dimension, shape ``(B, T)``."""
    log_probs = torch.log_softmax(logits.float(), dim=-1)
    return -(log_probs.exp() * log_probs).sum(-1)


# --------------------------------------------------------------------------- groups, gradients
def group_reward_stats(rewards: Tensor, group_ids: Tensor) -> dict[str, Tensor]:
    """GRPO group statistics of per-episode rewards ``(B,)`` with any integer ``group_ids (B,)``.

    ``std_mean``: mean over groups of the population std of the group's rewards; ``zero_std_frac``:
    share of groups of ≥ 2 episodes whose rewards are all equal (no learning signal: the Echo Trap).
    Groups are made dense by sorting, so no host sync is needed.
    """
    order = torch.argsort(group_ids)
    sorted_ids = group_ids[order]
    new_group = torch.ones_like(sorted_ids, dtype=torch.bool)
    new_group[1:] = sorted_ids[1:] != sorted_ids[:-1]
    dense = torch.empty_like(sorted_ids)
    dense[order] = new_group.long().cumsum(0) - 1
    n = rewards.shape[0]
    size = torch.zeros(n, dtype=rewards.dtype, device=rewards.device).index_add(
        0, dense, torch.ones_like(rewards)
    )
    total = torch.zeros_like(size).index_add(0, dense, rewards)
    mean = total / size.clamp_min(1)
    sq = torch.zeros_like(size).index_add(0, dense, (rewards - mean[dense]) ** 2)
    std = (sq / size.clamp_min(1)).sqrt()
    present = size > 0
    multi = size >= 2
    return {
        "std_mean": masked_mean(std, present),
        "zero_std_frac": masked_mean((std <= 1e-8).to(rewards.dtype), multi),
    }


def group_index(param_groups: Sequence[Sequence[Tensor]], device: torch.device) -> Tensor:
    """Group number of each parameter, flattened in order: ``[0, 0, 1, …]`` on ``device`` (build it once:
    on CUDA a tensor from a Python list is a host→device copy that waits for the queued work)."""
    return torch.tensor(
        [i for i, group in enumerate(param_groups) for _ in group], dtype=torch.long, device=device
    )


def module_norms(
    param_groups: Sequence[Sequence[Tensor]], index: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """Per-group L2 norms ``(grad_norms (M,), param_norms (M,))`` with one batched norm call for both kinds.

    A group's norm is ``sqrt(Σ_p ||p||²)`` over its parameters; parameters without a gradient add 0.
    Each parameter's norm is accumulated and returned in float32 whatever its dtype (a bf16 norm keeps 3
    significant digits). ``index``: ``group_index(param_groups, device)``, built once by the caller.
    """
    params = [p for group in param_groups for p in group]
    device = params[0].device
    if index is None:
        index = group_index(param_groups, device)
    with torch.no_grad():
        empty = torch.zeros(0, device=device)  # a parameter without a gradient: its norm is 0
        grads = [empty if p.grad is None else p.grad for p in params]
        squares = torch.stack(torch._foreach_norm(grads + params, 2, dtype=torch.float32)) ** 2  # one call
        zeros = torch.zeros(2, len(param_groups), device=device)
        grad_norm, param_norm = zeros.index_add_(1, index, squares.view(2, -1)).sqrt()
    return grad_norm, param_norm
