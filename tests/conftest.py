"""Shared fixtures: runs written by the real ``Monitor`` from small real update loops."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
import torch

from sorl_monitor import Monitor

# A shell without job control starts `make test &` with SIGINT ignored, and an ignored signal stays
# ignored across exec, so the Ctrl-C tests' child processes would never see theirs. A handler set here
# is reset to the default in each child instead.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def write_run(
    log_dir: Path, run_name: str, updates: int = 6, *, seed: int = 0, algorithm: str = "ppo", **extra
) -> Path:
    """Log ``updates`` updates of a random batch (4 episodes × 12 tokens, 2–3 turns) through ``Monitor``."""
    g = torch.Generator().manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(3, 5), torch.nn.Linear(5, 2))
    with Monitor(
        log_dir, run_name, {"seed": seed}, algorithm=algorithm, seed=seed, flush_interval_s=0.05
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


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    return write_run(tmp_path / "logs", "run-a")
