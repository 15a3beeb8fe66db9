"""Updates of a small real model logged through ``Monitor`` for one rank (the data is synthetic: random
log-probabilities, rank-dependent noise), the same wherever the log dir is."""

from __future__ import annotations

import torch

from sorl_monitor import Monitor, WriterConfig

NOISE = (0.05, 0.5)


def log_updates(
    log_dir: str, run_name: str, *, rank: int, world_size: int, updates: int, flush_interval_s: float = 0.05
) -> Monitor:
    """Log ``updates`` updates as ``rank`` of ``world_size`` and close; returns the closed monitor."""
    torch.manual_seed(rank)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 2))
    g = torch.Generator().manual_seed(rank)
    mon = Monitor(
        log_dir, run_name, {"lr": 1e-3}, algorithm="ppo", seed=0, rank=rank, world_size=world_size,
        writer=WriterConfig(flush_interval_s=flush_interval_s),
    )  # fmt: skip
    mon.watch(model)
    mask = torch.tensor([[0, 1, 1, 0, 1, 1, 1, 0, 1, 0, 0, 0]] * 4)
    for step in range(updates):
        model(torch.randn(6, 4, generator=g)).pow(2).sum().backward()
        logp = -torch.rand(4, 12, generator=g)
        mon.log_update(
            logp=logp,
            old_logp=logp + NOISE[rank % 2] * torch.randn(4, 12, generator=g),
            mask=mask,
            advantages=torch.randn(4, generator=g),
            rewards=torch.rand(4, generator=g),
            step=step,
        )
        model.zero_grad()
    mon.close()
    return mon
