"""Per-token tensors tapped from a trainer's loss, gathered over the micro-batches of one optimizer update.

Trainers compute the loss once per micro-batch; one ``steps`` row is one optimizer update. The taps
(TRL's ``_compute_loss``, verl's policy loss) keep each micro-batch's tensors detached, and the update's
row is logged from their concatenation: rows stacked, the token axis right-padded with ``mask = 0``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from sorl_monitor.write.monitor import Monitor


@dataclass
class TokenBatch:
    """One micro-batch as the loss saw it: ``(B, T)`` log-probs and mask, advantages ``(B,)`` or ``(B, T)``,
    episode ``rewards`` ``(B,)`` where the trainer has them (they fill the ``turns`` table's ``reward``).

    ``iteration`` (rollout batch), ``ppo_epoch`` (reuse pass), ``minibatch`` (update inside the pass) and
    ``policy_lag`` (updates since the behaviour policy sampled) are the ``steps`` keys of its update.
    """

    logp: Tensor
    old_logp: Tensor
    mask: Tensor
    advantages: Tensor | None = None
    entropy: Tensor | None = None
    ref_logp: Tensor | None = None
    rewards: Tensor | None = None
    iteration: int | None = None
    ppo_epoch: int = 0
    minibatch: int = 0
    policy_lag: int = 0
    metrics: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def detached(cls, **tensors: Any) -> TokenBatch:
        """A batch of the given tensors detached from autograd (keeps no graph alive until the update is logged)."""
        return cls(**{k: v.detach() if isinstance(v, Tensor) else v for k, v in tensors.items()})


def _pad_tokens(x: Tensor, length: int) -> Tensor:
    return F.pad(x, (0, length - x.shape[1])) if x.shape[1] < length else x


def _stack(parts: Sequence[Tensor | None], length: int) -> Tensor | None:
    """Rows of every part, ``(B,)`` kept 1-D when all are; ``(B, T)`` padded to ``length``; None if any is None."""
    if any(p is None for p in parts):
        return None
    tensors = [p for p in parts if p is not None]
    if all(p.dim() == 1 for p in tensors):
        return torch.cat(tensors)
    per_token = [
        p.unsqueeze(1).expand(-1, length) if p.dim() == 1 else _pad_tokens(p, length) for p in tensors
    ]
    return torch.cat([p.to(per_token[0].dtype) for p in per_token])


def concat_batches(batches: Sequence[TokenBatch]) -> TokenBatch:
    """One batch from the micro-batches of an update (keys of the first; ``metrics`` averaged by name)."""
    first = batches[0]
    length = max(b.logp.shape[1] for b in batches)
    metrics: dict[str, list[float]] = {}
    for batch in batches:
        for name, value in batch.metrics.items():
            metrics.setdefault(name, []).append(value)
    return TokenBatch(
        logp=torch.cat([_pad_tokens(b.logp, length) for b in batches]),
        old_logp=torch.cat([_pad_tokens(b.old_logp.to(b.logp.dtype), length) for b in batches]),
        mask=torch.cat([_pad_tokens(b.mask.to(torch.float32), length) for b in batches]),
        advantages=_stack([b.advantages for b in batches], length),
        entropy=_stack([b.entropy for b in batches], length),
        ref_logp=_stack([b.ref_logp for b in batches], length),
        rewards=_stack([b.rewards for b in batches], length),
        iteration=first.iteration,
        ppo_epoch=first.ppo_epoch,
        minibatch=first.minibatch,
        policy_lag=first.policy_lag,
        metrics={name: sum(values) / len(values) for name, values in metrics.items()},
    )


def log_batch(
    monitor: Monitor,
    batch: TokenBatch,
    *,
    step: int | None,
    grad_norm: float | None = None,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, float]:
    """``monitor.log_update`` of one update's batch (turns = contiguous runs of ``mask == 1``)."""
    return monitor.log_update(
        logp=batch.logp,
        old_logp=batch.old_logp,
        mask=batch.mask,
        advantages=batch.advantages,
        entropy=batch.entropy,
        ref_logp=batch.ref_logp,
        rewards=batch.rewards,
        grad_norm=grad_norm,
        step=step,
        iteration=batch.iteration,
        ppo_epoch=batch.ppo_epoch,
        minibatch=batch.minibatch,
        policy_lag=batch.policy_lag,
        extra=extra,
    )
