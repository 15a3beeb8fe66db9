"""A training-like process that streams updates (with multi-turn rows) through ``Monitor`` until killed.

python -m tests.helpers.crash_child LOG_DIR RUN FLUSH_INTERVAL_S PROGRESS_FILE [FLUSH_ROWS]

After each ``log_update`` it stores ``(step, time)`` in PROGRESS_FILE through a shared memory map, so
the parent knows what was logged when it SIGKILLs this process (a map outlives the process's death).
"""

from __future__ import annotations

import mmap
import struct
import sys
import time

import torch

from sorl_monitor import Monitor, WriterConfig

PROGRESS = struct.Struct("<qd")  # last step logged, its wall time
EPISODES, TOKENS = 64, 64
TURN = [1] * 6 + [0] * 2  # 8 turns of 6 policy tokens, each followed by 2 observation tokens


def main() -> None:
    log_dir, run_name, flush_interval, progress_path = (
        sys.argv[1],
        sys.argv[2],
        float(sys.argv[3]),
        sys.argv[4],
    )
    with open(progress_path, "r+b") as handle:
        progress = mmap.mmap(handle.fileno(), PROGRESS.size)
    flush_rows = int(sys.argv[5]) if len(sys.argv) > 5 else 200_000
    mon = Monitor(
        log_dir, run_name, writer=WriterConfig(flush_interval_s=flush_interval, flush_rows=flush_rows)
    )
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Linear(16, 1))
    mon.watch(model)
    mask = torch.tensor(TURN * (TOKENS // len(TURN))).repeat(EPISODES, 1)
    step = 0
    while True:
        model(torch.randn(32, 16)).pow(2).mean().backward()
        logp = -torch.rand(EPISODES, TOKENS)
        mon.log_update(
            logp=logp,
            old_logp=logp + 0.1 * torch.randn(EPISODES, TOKENS),
            mask=mask,
            advantages=torch.randn(EPISODES),
            rewards=torch.rand(EPISODES),
            step=step,
        )
        model.zero_grad()
        progress[:] = PROGRESS.pack(step, time.time())
        step += 1


if __name__ == "__main__":
    main()
