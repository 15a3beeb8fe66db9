"""Two writers on one run and rank: the second is refused loudly (a warning naming the run, its rows
counted as dropped) and the first one's rows all read. Before, each overwrote the other's parts silently
(400 rows logged → 230 readable, corrupt parts; two processes: 300 + 300 → 78 + 290)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import warnings

import pytest

from sorl_monitor import Monitor, MonitorWarning, WriterConfig
from sorl_monitor.read.query import CorruptPartWarning, open_runs
from tests.helpers.paths import ROOT

ROWS = 300
WRITER = """
import json, pathlib, sys, time
from sorl_monitor import Monitor, WriterConfig
log_dir, me, other = sys.argv[1], sys.argv[2], sys.argv[3]
mon = Monitor(log_dir, "shared", {"writer": me}, writer=WriterConfig(flush_interval_s=0.05))
pathlib.Path(log_dir, me + ".ready").touch()
while not pathlib.Path(log_dir, other + ".ready").exists():
    time.sleep(0.01)
for step in range(int(sys.argv[4])):
    mon.log_scalars(step, {"writer": float(me == "b"), "loss": 1.0 / (step + 1)})
    time.sleep(0.003)
mon.close()
print(json.dumps({"dropped": mon.writer_stats().rows_dropped}))
"""


def readable(run) -> dict[float, int]:
    with warnings.catch_warnings():
        warnings.simplefilter("error", CorruptPartWarning)
        with open_runs(run) as runs:
            rows = runs.sql("SELECT writer, count(*) AS n FROM steps GROUP BY 1").to_pylist()
    return {row["writer"]: row["n"] for row in rows}


def test_a_second_monitor_in_one_process_is_refused_and_the_first_loses_nothing(tmp_path):
    first = Monitor(tmp_path, "shared", writer=WriterConfig(flush_interval_s=0.01))
    with pytest.warns(MonitorWarning, match="run 'shared' rank 0 is being written by pid"):
        second = Monitor(tmp_path, "shared", writer=WriterConfig(flush_interval_s=0.01))
    for step in range(200):
        first.log_scalars(step, {"writer": 0.0})
        second.log_scalars(step, {"writer": 1.0})
        time.sleep(0.001)
    first.close()
    second.close()
    assert first.writer_stats().rows_dropped == 0
    assert second.writer_stats().rows_dropped == 200
    assert readable(tmp_path / "shared") == {0.0: 200}
    third = Monitor(
        tmp_path, "shared", writer=WriterConfig(flush_interval_s=0.01)
    )  # the lock is free again once closed
    third.log_scalars(200, {"writer": 2.0})
    third.close()
    assert readable(tmp_path / "shared") == {0.0: 200, 2.0: 1}


def test_a_second_process_on_the_same_run_and_rank_is_refused_and_the_first_loses_nothing(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    a = subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path), "a", "b", str(ROWS)], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    deadline = time.monotonic() + 60
    while not (tmp_path / "a.ready").exists():  # a holds the run before b starts
        assert a.poll() is None and time.monotonic() < deadline, a.stderr.read()
        time.sleep(0.01)
    b = subprocess.run([sys.executable, "-c", WRITER, str(tmp_path), "b", "a", str(ROWS)], env=env,
                       capture_output=True, text=True, timeout=120)  # fmt: skip
    out_a, err_a = a.communicate(timeout=120)
    assert a.returncode == 0 and b.returncode == 0, err_a + b.stderr
    assert json.loads(out_a) == {"dropped": 0}
    assert json.loads(b.stdout) == {"dropped": ROWS}
    assert "run 'shared' rank 0 is being written by pid" in b.stderr
    assert readable(tmp_path / "shared") == {0.0: ROWS}
    info = json.loads((tmp_path / "shared" / "run.json").read_text())
    assert (info["config"], info["status"]) == ({"writer": "a"}, "finished")
