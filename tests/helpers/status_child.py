"""A training-like process that ends in the way MODE says, for the run-status tests.

python -m tests.helpers.status_child LOG_DIR MODE FLUSH_INTERVAL_S

MODE: ``raise`` (an uncaught exception, no ``close``), ``loop`` (logs until a signal stops it), ``graceful``
(installs its own SIGTERM handler that asks the loop to stop, then closes), ``fork`` (a forked child exits
normally while the parent's run is open). Each update is logged with its step; ``LOG_DIR/progress`` holds the
last step logged (written after each ``log_scalars``), ``LOG_DIR/ready`` appears once the loop runs.

SIGINT and SIGTERM reach the main thread only: the monitor's threads start with them blocked (a thread
inherits its creator's signal mask), so the main thread's own blocking around a step really holds them off.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

from sorl_monitor import Monitor, WriterConfig


def write_progress(log_dir: Path, step: int) -> None:
    """``LOG_DIR/progress`` := ``step``, replaced whole: a reader never sees it empty or half written."""
    (log_dir / "progress.tmp").write_text(str(step))
    os.replace(log_dir / "progress.tmp", log_dir / "progress")


def main() -> None:
    log_dir, mode, interval = Path(sys.argv[1]), sys.argv[2], float(sys.argv[3])
    stop = []
    if mode == "graceful":
        signal.signal(signal.SIGTERM, lambda *_: stop.append(True))
    signals = {signal.SIGINT, signal.SIGTERM}
    signal.pthread_sigmask(signal.SIG_BLOCK, signals)  # the monitor's writer threads inherit this mask
    mon = Monitor(log_dir, "run", writer=WriterConfig(flush_interval_s=interval))
    signal.pthread_sigmask(signal.SIG_UNBLOCK, signals)
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
    while not stop:
        # a signal waits until the step's row and its progress mark are both written (the mark is the
        # test's record of what was logged; a signal between the two would make them disagree)
        signal.pthread_sigmask(signal.SIG_BLOCK, signals)
        mon.log_scalars(step, {"loss": 1.0 / (step + 1)})
        write_progress(log_dir, step)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, signals)
        if step == 5:
            (log_dir / "ready").touch()
            if mode == "raise":
                raise RuntimeError("the trainer crashed")
        step += 1
        time.sleep(0.005)
    mon.log_scalars(step, {"loss": 0.0})  # the graceful shutdown's last row
    write_progress(log_dir, step)
    mon.close()


if __name__ == "__main__":
    main()
