"""The fleet's run list (``sorl_monitor.read.run_list``) on SYNTHETIC verdict tables: order, filters, search,
run folders newer than the table, and reading the table again only when it changed."""

from __future__ import annotations

import json
import os
from pathlib import Path

from sorl_monitor.read.run_list import UNJUDGED, VerdictList, filter_runs, status_counts
from sorl_monitor.read.verdict_table import VERDICTS_FILE, verdict_table, write_verdicts


def synthetic_fleet(root: Path, statuses: dict[str, str]) -> None:
    """Run folders (a ``run.json`` each) and a verdict table giving each run the status named (synthetic)."""
    for run_id in statuses:
        (root / run_id).mkdir(parents=True)
        (root / run_id / "run.json").write_text(json.dumps({"run_id": run_id}))
    rows = [
        {"run_id": run_id, "path": str(root / run_id), "status": status, "algorithm": "grpo",
         "root_cause": "kl_drift" if status != "healthy" else None}
        for run_id, status in statuses.items()
    ]  # fmt: skip
    write_verdicts(verdict_table(rows), root / VERDICTS_FILE)


def test_synthetic_table_lists_the_most_urgent_runs_first(tmp_path):
    synthetic_fleet(tmp_path, {"a": "healthy", "b": "collapsed", "c": "collapsing", "d": "error"})
    runs = VerdictList(tmp_path)
    assert runs.refresh()
    assert [run.run_id for run in runs.runs] == ["d", "c", "b", "a"]
    assert status_counts(runs.runs) == {"error": 1, "collapsing": 1, "collapsed": 1, "healthy": 1}


def test_synthetic_table_filters_by_status_and_searches_ids_algorithms_and_root_causes(tmp_path):
    synthetic_fleet(tmp_path, {"ppo-1": "healthy", "ppo-2": "collapsed", "grpo-1": "collapsed"})
    runs = VerdictList(tmp_path)
    runs.refresh()
    assert [r.run_id for r in filter_runs(runs.runs, {"collapsed"})] == ["grpo-1", "ppo-2"]
    assert [r.run_id for r in filter_runs(runs.runs, None, "PPO")] == ["ppo-2", "ppo-1"]
    assert [r.run_id for r in filter_runs(runs.runs, {"healthy"}, "kl_drift")] == []
    assert [r.run_id for r in filter_runs(runs.runs, None, "kl_drift")] == ["grpo-1", "ppo-2"]


def test_a_run_folder_newer_than_the_synthetic_table_is_listed_last_as_not_in_the_table(tmp_path):
    synthetic_fleet(tmp_path, {"a": "healthy"})
    (tmp_path / "new-run").mkdir()
    (tmp_path / "new-run" / "run.json").write_text("{}")
    (tmp_path / "not-a-run").mkdir()
    runs = VerdictList(tmp_path)
    runs.refresh()
    assert [(run.run_id, run.status) for run in runs.runs] == [("a", "healthy"), ("new-run", UNJUDGED)]


def test_the_synthetic_table_is_read_again_only_when_it_changed(tmp_path):
    synthetic_fleet(tmp_path, {"a": "healthy"})
    runs = VerdictList(tmp_path)
    assert runs.refresh()
    assert not runs.refresh()
    rows = [{"run_id": "a", "path": str(tmp_path / "a"), "status": "collapsing"}]
    write_verdicts(verdict_table(rows), tmp_path / VERDICTS_FILE)
    os.utime(tmp_path / VERDICTS_FILE, (1, 1))  # a new mtime even on a coarse clock
    assert runs.refresh()
    assert [run.status for run in runs.runs] == ["collapsing"]
