"""run.json's status comes from the process that owns the run: ``failed`` on an uncaught exception,
``interrupted`` on SIGINT, ``terminated`` on SIGTERM (everything logged flushed, the signal's effect kept),
and a forked child never touches its parent's run. Before: ``finished`` for all of them (a forked child
marked its parent's live run finished), and SIGTERM lost every row since the last flush."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from sorl_monitor import Monitor, WriterConfig
from sorl_monitor.read.query import open_runs
from tests.helpers.paths import ROOT

LONG_INTERVAL_S = 30.0  # nothing reaches disk by the clock during a test: only a flush at the end does


def start(tmp_path, mode: str) -> subprocess.Popen:
    command = [
        sys.executable,
        "-m",
        "tests.helpers.status_child",
        str(tmp_path),
        mode,
        str(LONG_INTERVAL_S),
    ]
    return subprocess.Popen(command, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip


def wait_ready(tmp_path, child: subprocess.Popen) -> None:
    deadline = time.monotonic() + 60
    while not (tmp_path / "ready").exists():
        assert child.poll() is None and time.monotonic() < deadline, child.communicate()
        time.sleep(0.01)
    time.sleep(0.3)


def status_and_steps(tmp_path) -> tuple[str, list[int]]:
    with open_runs(tmp_path / "run") as runs:
        status = runs.sql("SELECT status FROM runs").column(0)[0].as_py()
        steps = runs.sql("SELECT step FROM steps ORDER BY step").column(0).to_pylist()
    return status, steps


def test_an_uncaught_exception_marks_the_run_failed(tmp_path):
    child = start(tmp_path, "raise")
    _, err = child.communicate(timeout=60)
    assert child.returncode == 1 and "the trainer crashed" in err
    assert status_and_steps(tmp_path) == ("failed", list(range(6)))


@pytest.mark.parametrize(
    ("sent", "status", "returncode"),
    [
        (signal.SIGINT, "interrupted", 1),  # python -m's exit status for an uncaught KeyboardInterrupt
        (signal.SIGTERM, "terminated", -signal.SIGTERM),  # killed by the signal, as without the monitor
    ],
)
def test_a_signal_flushes_every_row_and_ends_the_process_as_it_would_have(
    tmp_path, sent, status, returncode, record_measurement
):
    child = start(tmp_path, "loop")
    wait_ready(tmp_path, child)
    child.send_signal(sent)
    child.communicate(timeout=60)
    logged = int((tmp_path / "progress").read_text())
    assert child.returncode == returncode  # the signal still ends the process
    final_status, steps = status_and_steps(tmp_path)
    record_measurement(signal=sent.name, flush_interval_s=LONG_INTERVAL_S, updates_logged=logged + 1,
                       updates_persisted=len(steps), status=final_status)  # fmt: skip
    # every row logged before the signal is on disk (before SIGTERM: 0 rows, "running"); the row being logged
    # when it landed may be too: a signal caught by another thread runs its handler in the main thread at the
    # next bytecode, which can be inside the following log call, after its row was queued
    assert final_status == status
    assert steps in (list(range(logged + 1)), list(range(logged + 2)))


def test_sigterm_chains_to_the_trainers_own_handler_and_the_run_goes_on(tmp_path):
    child = start(tmp_path, "graceful")
    wait_ready(tmp_path, child)
    child.send_signal(signal.SIGTERM)
    child.communicate(timeout=60)
    logged = int((tmp_path / "progress").read_text())
    assert child.returncode == 0  # its handler asked the loop to stop; it closed normally
    assert status_and_steps(tmp_path) == ("terminated", list(range(logged + 1)))


def test_a_forked_child_never_touches_its_parents_run(tmp_path):
    child = start(tmp_path, "fork")
    out, err = child.communicate(timeout=60)
    assert child.returncode == 0, err
    assert json.loads(out)["status"] == "running"  # guards against a forked child marking its parent's run
    with open_runs(tmp_path / "run") as runs:
        rows = runs.sql("SELECT step, loss, status FROM steps, runs ORDER BY step").to_pylist()
    assert rows == [
        {"step": 0, "loss": 1.0, "status": "finished"},
        {"step": 1, "loss": 3.0, "status": "finished"},
    ]


def test_ctrl_c_inside_a_with_block_marks_the_run_interrupted(tmp_path):
    with (
        pytest.raises(KeyboardInterrupt),
        Monitor(tmp_path, "run", writer=WriterConfig(flush_interval_s=60)) as mon,
    ):
        mon.log_scalars(0, {"loss": 1.0})
        raise KeyboardInterrupt
    assert status_and_steps(tmp_path) == ("interrupted", [0])
