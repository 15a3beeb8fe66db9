"""A rank of a 2-process ``torch.distributed`` (gloo, CPU) job that logs through ``Monitor``.

Rank ``r`` logs updates whose log-ratio noise is ``0.05 · 10^r`` (synthetic): rank 1 is the outlier.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist

from sorl_monitor import Monitor, WriterConfig

UPDATES = 5
NOISE = (0.05, 0.5)


def run_rank(rank: int, world_size: int, log_dir: str, rendezvous: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=world_size)
    try:
        mon = Monitor(
            log_dir, algorithm="ppo", writer=WriterConfig(flush_interval_s=0.05)
        )  # run id: rank 0's, broadcast
        Path(log_dir, f"run_id.rank{rank}").write_text(mon.run_id)
        model = torch.nn.Linear(4, 2)
        mon.watch(model)
        g = torch.Generator().manual_seed(rank)
        for step in range(UPDATES):
            model(torch.randn(8, 4, generator=g)).pow(2).mean().backward()
            for param in model.parameters():
                dist.all_reduce(param.grad)  # the data-parallel gradient sync
            logp = -torch.rand(4, 16, generator=g)
            noise = NOISE[rank] * torch.randn(4, 16, generator=g)
            mon.log_update(logp=logp, old_logp=logp + noise, mask=torch.ones(4, 16), step=step)
            model.zero_grad()
        mon.close()
        dist.barrier()
    finally:
        dist.destroy_process_group()
