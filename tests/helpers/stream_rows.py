"""A process that streams rows through the real ``Monitor`` until it is killed (used by the crash tests).

python -m tests.helpers.stream_rows LOG_DIR RUN_NAME [FLUSH_INTERVAL_S]
"""

from __future__ import annotations

import sys
import time

import torch

from sorl_monitor import Monitor, WriterConfig


def main() -> None:
    log_dir, run_name = sys.argv[1], sys.argv[2]
    flush_interval = float(sys.argv[3]) if len(sys.argv) > 3 else 0.1
    mon = Monitor(log_dir, run_name, writer=WriterConfig(flush_interval_s=flush_interval))
    mask = torch.ones(8, 16)
    step = 0
    while True:
        logp = -torch.rand(8, 16)
        mon.log_update(logp=logp, old_logp=logp + 0.1 * torch.randn(8, 16), mask=mask, step=step)
        step += 1
        time.sleep(0.002)


if __name__ == "__main__":
    main()
