"""A training-like process that ends in the way MODE says, for the run-status tests.

python -m tests.reliability.status_child LOG_DIR MODE FLUSH_INTERVAL_S

MODE: ``raise`` (an uncaught exception, no ``close``), ``loop`` (logs until a signal stops it), ``graceful``
(installs its own SIGTERM handler that asks the loop to stop, then closes), ``fork`` (a forked child exits
normally while the parent's run is open). Each update is logged with its step; ``LOG_DIR/progress`` holds the
last step logged (written after each ``log_scalars``), ``LOG_DIR/ready`` appears once the loop runs.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

from sorl_monitor import Monitor


def main() -> None:
    log_dir, mode, interval = Path(sys.argv[1]), sys.argv[2], float(sys.argv[3])
    stop = []
    if mode == "graceful":
        signal.signal(signal.SIGTERM, lambda *_: stop.append(True))
    mon = Monitor(log_dir, "run", flush_interval_s=interval)
    if mode == "fork":
        mon.log_scalars(0, {"loss": 1.0})
        pid = os.fork()
        if pid == 0:
            mon.log_scalars(1, {"loss": 2.0})  # the child's copy is closed: nothing is written
            sys.exit(0)  # a normal exit: atexit handlers run in the child
        os.waitpid(pid, 0)
        print(Path(log_dir, "run", "run.json").read_text(), flush=True)  # as the child left it
        mon.log_scalars(1, {"loss": 3.0})
        mon.close()
        return
    step = 0
    signals = {signal.SIGINT, signal.SIGTERM}
    while not stop:
        # a signal waits until the step's row and its progress mark are both written (the mark is the
        # test's record of what was logged; a signal between the two would make them disagree)
        signal.pthread_sigmask(signal.SIG_BLOCK, signals)
        mon.log_scalars(step, {"loss": 1.0 / (step + 1)})
        (log_dir / "progress").write_text(str(step))
        signal.pthread_sigmask(signal.SIG_UNBLOCK, signals)
        if step == 5:
            (log_dir / "ready").touch()
            if mode == "raise":
                raise RuntimeError("the trainer crashed")
        step += 1
        time.sleep(0.005)
    mon.log_scalars(step, {"loss": 0.0})  # the graceful shutdown's last row
    (log_dir / "progress").write_text(str(step))
    mon.close()


if __name__ == "__main__":
    main()
