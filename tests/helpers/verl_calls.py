"""Calls shaped as verl's actor makes them to a registered policy loss (SYNTHETIC tensors, no verl needed)."""

from __future__ import annotations

import torch

TURN_PATTERN = [1, 1, 1, 0, 0, 1, 1, 0, 1, 1]  # LLM tokens 1, tool/observation tokens 0 (verl's agent loop)


def micro_batch(seed: int, length: int, rows: int = 2) -> dict[str, torch.Tensor]:
    """Synthetic tensors shaped as verl's actor hands them to the loss: all (rows, length)."""
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(rows, length, generator=g) * 3
    mask = torch.tensor((TURN_PATTERN * 2)[:length], dtype=torch.float32).repeat(rows, 1)
    advantage = torch.randn(rows, 1, generator=g).expand(rows, length)
    return {
        "old_log_prob": old,
        "log_prob": old + 0.8 * torch.randn(rows, length, generator=g),
        "advantages": advantage.contiguous(),
        "response_mask": mask,
    }


def call_as_verl_actor(loss, batch, config):
    """Keyword call, as ``dp_actor.update_policy`` makes it."""
    return loss(**batch, loss_agg_mode="token-mean", config=config, rollout_is_weights=None)


def optimizer_step() -> None:
    """One optimizer step, as verl's engine takes after a mini-batch's micro-batches."""
    parameter = torch.nn.Parameter(torch.zeros(1))
    parameter.grad = torch.zeros(1)
    torch.optim.SGD([parameter], lr=0.1).step()


def real_actor_config(**fields):
    """verl's own ``ActorConfig`` (verl installed) for a small FSDP actor: 4-sample mini-batches of 2-sample
    micro-batches, 2 rollouts per prompt; ``fields`` override or add to these."""
    from verl.workers.config import ActorConfig

    small = {"strategy": "fsdp", "ppo_mini_batch_size": 4, "ppo_micro_batch_size_per_gpu": 2, "rollout_n": 2}
    return ActorConfig(**(small | fields))
