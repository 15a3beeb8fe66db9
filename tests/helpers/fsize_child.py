"""Train with ``Monitor`` under a file-size limit (RLIMIT_FSIZE): every write past it fails with EFBIG.

python -m tests.helpers.fsize_child LOG_DIR LIMIT_BYTES UPDATES   → prints a JSON summary

The real failure a full or quota-limited disk gives a writer, without needing root to mount anything.
"""

from __future__ import annotations

import json
import resource
import signal
import sys
import time

import torch

from sorl_monitor import Monitor, WriterConfig


def main() -> None:
    log_dir, limit, updates = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit then fails with EFBIG
    mon = Monitor(log_dir, "fsize", writer=WriterConfig(flush_interval_s=0.05))
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    mask = torch.tensor([1, 1, 1, 1, 0, 0] * 8).repeat(128, 1)  # 8 turns × 128 episodes: big turn parts
    slowest = 0.0
    for step in range(updates):
        logp = -torch.rand(128, 48)
        started = time.perf_counter()
        mon.log_update(logp=logp, old_logp=logp + 0.1 * torch.randn(128, 48), mask=mask, step=step)
        if step > 0:  # the first call also pays one-time set-up
            slowest = max(slowest, time.perf_counter() - started)
        time.sleep(0.01)
    mon.flush()
    stats = mon.writer_stats()
    mon.close()
    print(json.dumps({"updates": updates, "slowest_log_update_s": slowest, **vars(stats)}))


if __name__ == "__main__":
    main()
