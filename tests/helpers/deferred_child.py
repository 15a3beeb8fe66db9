"""A training-like process whose last updates' host copies are still in flight when SIGTERM comes.

python -m tests.helpers.deferred_child LOG_DIR UPDATES

Every copy is held (``tests.helpers.deferred_copy.hold``: on the CPU, a stand-in for CUDA events not yet reached),
so none of the UPDATES synthetic updates has a row assembled; then ``LOG_DIR/ready`` appears and the process
sleeps until a signal ends it.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
import torch

from sorl_monitor import Monitor, WriterConfig
from tests.helpers.deferred_copy import hold, small_model, synthetic_update


def main() -> None:
    log_dir, updates = Path(sys.argv[1]), int(sys.argv[2])
    held = hold(pytest.MonkeyPatch())
    mon = Monitor(log_dir, "run", writer=WriterConfig(flush_interval_s=3600))
    model = small_model()
    mon.watch(model)
    generator = torch.Generator().manual_seed(0)
    for step in range(updates):
        mon.log_update(step=step, **synthetic_update(generator, model))
    assert not any(event.landed for event in held.events)
    (log_dir / "ready").touch()
    while True:
        time.sleep(0.05)


if __name__ == "__main__":
    main()
