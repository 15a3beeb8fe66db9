"""Several trainings at once, one process each, with progress reported to the parent."""

from __future__ import annotations

import pytest

from sorl_monitor.trainer.parallel import train_many
from tests.helpers.tiny_train import tiny


@pytest.mark.slow
def test_two_runs_train_in_parallel_and_report_progress(tmp_path):
    events = []
    configs = {"a": tiny("ppo", tmp_path), "b": tiny("so_ppo", tmp_path)}
    configs["b"].ctn = "auto"
    results = train_many(configs, lambda *event: events.append(event), jobs=2)
    assert set(results) == {"a", "b"}
    for name, result in results.items():
        assert result["status"] == "finished", result
        assert (tmp_path / result["run_id"] / "run.json").is_file()
        phases = [e[1] for e in events if e[0] == name]
        assert phases[0] == "warmup" and phases[-1] == "done" and "train" in phases
        done = [e[2] for e in events if e[0] == name and e[1] == "train"]
        assert done == [1, 2]


def test_a_failing_run_is_reported_not_raised(tmp_path):
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("a file where the log folder should be")
    cfg = tiny("ppo", blocked)
    events = []
    results = train_many({"bad": cfg}, lambda *event: events.append(event), jobs=1)
    assert "error" in results["bad"]
    assert events[-1][1] == "error"
