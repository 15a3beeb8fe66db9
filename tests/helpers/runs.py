"""Runs written by the real ``Monitor`` from small real update loops (random batches, no training)."""

from __future__ import annotations

from pathlib import Path

import torch

from sorl_monitor import Monitor, WriterConfig


def write_run(
    log_dir: Path, run_name: str, updates: int = 6, *, seed: int = 0, algorithm: str = "ppo", **extra
) -> Path:
    """Log ``updates`` updates of a random batch (4 episodes × 12 tokens, 2–3 turns) through ``Monitor``."""
    g = torch.Generator().manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(3, 5), torch.nn.Linear(5, 2))
    with Monitor(
        log_dir,
        run_name,
        {"seed": seed},
        algorithm=algorithm,
        seed=seed,
        writer=WriterConfig(flush_interval_s=0.05),
    ) as mon:
        mon.watch(model)
        mask = torch.tensor([[0, 1, 1, 0, 1, 1, 1, 0, 1, 0, 0, 0]] * 4)
        for _ in range(updates):
            model(torch.randn(7, 3, generator=g)).pow(2).sum().backward()
            logp = -torch.rand(4, 12, generator=g)
            mon.log_update(
                logp=logp,
                old_logp=logp + 0.3 * torch.randn(4, 12, generator=g),
                mask=mask,
                advantages=torch.randn(4, generator=g),
                values=torch.randn(4, 12, generator=g),
                rewards=torch.rand(4, generator=g),
                extra=extra,
            )
    return Path(log_dir) / run_name


def run_with_parts(log_dir: Path, name: str = "run", updates: int = 6) -> Path:
    """A run whose every update is flushed to its own part (steps and turns), from random batches."""
    g = torch.Generator().manual_seed(0)
    with Monitor(log_dir, name, writer=WriterConfig(flush_interval_s=3600, compact=False)) as mon:
        for _ in range(updates):
            logp = -torch.rand(4, 12, generator=g)
            mask = torch.tensor([[1, 1, 1, 0, 0, 1, 1, 1, 0, 1, 1, 1]] * 4)
            mon.log_update(logp=logp, old_logp=logp + 0.2 * torch.randn(4, 12, generator=g), mask=mask)
            assert mon.flush()
    return log_dir / name
