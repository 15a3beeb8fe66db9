"""``sorl ingest`` keeps every row (issue 27, item 3): a followed file rotated or rewritten past its old size,
a step's metrics on lines written apart, a ``trainer_state.json`` caught half written, steps out of order.
The metric values are synthetic; the files are written as the trainers write them (verl's file logger:
one ``json.dumps`` line per call; transformers: the whole ``trainer_state.json`` rewritten)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sorl_monitor import Monitor
from sorl_monitor.cli.main import app
from sorl_monitor.integrations.verl import ingest_verl_jsonl
from sorl_monitor.read.query import QueryError, open_runs
from tests.helpers.paths import ROOT

runner = CliRunner()


def verl_line(step: int, **data: float) -> str:
    return json.dumps({"step": step, "data": data or {"actor/pg_loss": 0.1 * step}}) + "\n"


def append(path: Path, text: str) -> None:
    with open(path, "a") as handle:
        handle.write(text)


def steps_in(run_dir: Path) -> dict[int, dict]:
    """Each step of the run with its columns merged over the step's rows (as the readers merge them)."""
    try:
        with open_runs(run_dir, "sorl") as runs:
            rows = runs.sql(
                "SELECT step, max(pg_loss) AS pg_loss, max(reward_mean) AS reward FROM steps GROUP BY step"
            ).to_pylist()
    except QueryError:
        return {}
    return {row.pop("step"): row for row in rows}


def wait_for(condition, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


FOLLOWERS: list[Follower] = []


@pytest.fixture(autouse=True)
def _stop_followers():
    """A test that fails mid-way leaves no follower thread running."""
    yield
    while FOLLOWERS:
        FOLLOWERS.pop().finish()


class Follower:
    """``ingest_verl_jsonl(follow=True)`` in a thread, into ``<tmp>/runs/run``."""

    def __init__(self, log: Path, runs: Path) -> None:
        self.run_dir = runs / "run"
        self.monitor = Monitor(runs, "run")
        self.stop = threading.Event()
        self.report = None
        self.thread = threading.Thread(target=self._follow, args=(log,))
        self.thread.start()
        FOLLOWERS.append(self)

    def _follow(self, log: Path) -> None:
        self.report = ingest_verl_jsonl(log, self.monitor, follow=True, poll_s=0.05, stop=self.stop)

    def finish(self):
        if self in FOLLOWERS:
            FOLLOWERS.remove(self)
        self.stop.set()
        self.thread.join(30)
        self.monitor.close()
        return self.report


def test_a_rotated_file_is_read_to_its_end_then_the_new_one_from_its_start(tmp_path):
    log = tmp_path / "train.jsonl"
    log.write_text("".join(verl_line(step) for step in range(10)))
    follower = Follower(log, tmp_path / "runs")
    wait_for(lambda: len(steps_in(follower.run_dir)) == 10)
    append(log, verl_line(10))  # written just before the rotation
    os.rename(log, tmp_path / "train.jsonl.1")
    log.write_text("".join(verl_line(step) for step in range(11, 20)))
    wait_for(lambda: len(steps_in(follower.run_dir)) == 20)  # guards against re-reading the rotated-away file
    report = follower.finish()
    assert sorted(steps_in(follower.run_dir)) == list(range(20))
    assert report.bad_lines == []


def test_a_steps_metrics_on_lines_written_apart_are_all_kept(tmp_path):
    log = tmp_path / "train.jsonl"
    log.write_text("")
    follower = Follower(log, tmp_path / "runs")
    for step in range(5):
        append(log, verl_line(step, **{"actor/pg_loss": 0.5}))
        time.sleep(0.3)  # the follower reads the first line (and reaches the file's end) before the second
        append(log, verl_line(step, **{"critic/score/mean": float(step)}))
    wait_for(lambda: sum(row["reward"] is not None for row in steps_in(follower.run_dir).values()) == 5)
    follower.finish()
    merged = steps_in(follower.run_dir)
    assert merged == {
        step: {"pg_loss": 0.5, "reward": float(step)} for step in range(5)
    }  # guards against losing rows logged while the follower waits


def test_a_file_rewritten_past_its_old_size_between_polls_is_read_again(tmp_path):
    log = tmp_path / "train.jsonl"
    log.write_text("".join(verl_line(step) for step in range(5)))
    follower = Follower(log, tmp_path / "runs")
    wait_for(lambda: len(steps_in(follower.run_dir)) == 5)
    with open(log, "w") as handle:  # verl restarted: its logger opens the file with "w" and logs again
        handle.write("".join(verl_line(step, **{"actor/pg_loss": 9.0}) for step in range(15)))
    wait_for(lambda: len(steps_in(follower.run_dir)) == 15)
    report = follower.finish()
    assert report.bad_lines == []  # guards against reading a truncated file from its old position
    merged = steps_in(follower.run_dir)
    assert [merged[step]["pg_loss"] for step in range(5, 15)] == [
        9.0
    ] * 10  # guards against losing the re-logged steps
    assert report.already_ingested == 5  # the restart's steps 0-4, already in the run


def trainer_state(steps: int) -> str:
    history = [
        {"step": s, "loss": 0.5, "reward": 0.1 * s, "learning_rate": 1e-5} for s in range(1, steps + 1)
    ]
    return json.dumps({"global_step": steps, "log_history": history}, indent=2)


def test_a_followed_trainer_state_caught_half_written_is_read_at_its_next_change(tmp_path):
    state = tmp_path / "out" / "trainer_state.json"
    state.parent.mkdir()
    state.write_text(trainer_state(20))
    command = [sys.executable, "-m", "sorl_monitor.cli.main", "ingest", str(state), "--log-dir",
               str(tmp_path / "runs"), "--follow", "--poll", "0.1", "--idle-timeout", "5"]  # fmt: skip
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                               env={**os.environ, "PYTHONPATH": str(ROOT)})  # fmt: skip
    run_dir = tmp_path / "runs" / "out"
    wait_for(lambda: len(steps_in(run_dir)) == 20, timeout_s=60)
    whole = trainer_state(200)
    state.write_text(whole[: len(whole) // 2])  # transformers writes the file in place: caught mid-write
    time.sleep(0.6)
    state.write_text(whole)
    out, err = process.communicate(timeout=120)
    assert process.returncode == 0, err  # guards against failing on a half-written last line
    assert len(steps_in(run_dir)) == 200


@pytest.mark.parametrize("fmt", ["jsonl", "verl"])
def test_steps_out_of_order_and_a_steps_lines_apart_are_merged_not_dropped(tmp_path, fmt):
    if fmt == "verl":
        lines = [verl_line(3), verl_line(1), verl_line(2), verl_line(1, **{"critic/score/mean": 0.7})]
    else:
        records = [{"step": 3, "pg_loss": 0.3}, {"step": 1, "pg_loss": 0.1}, {"step": 2, "pg_loss": 0.2},
                   {"step": 1, "reward_mean": 0.7}]  # fmt: skip
        lines = [json.dumps(record) + "\n" for record in records]
    log = tmp_path / f"log.{fmt}.jsonl"
    log.write_text("".join(lines))
    result = runner.invoke(app, ["ingest", str(log), "--format", fmt, "--log-dir", str(tmp_path / "runs"),
                                 "--run", "run"])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "already" not in result.output  # guards against skipping steps a second ingest adds
    merged = steps_in(tmp_path / "runs" / "run")
    assert sorted(merged) == [1, 2, 3]
    assert merged[1]["reward"] == 0.7 and merged[1]["pg_loss"] == pytest.approx(0.1)
