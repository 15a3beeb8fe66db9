"""Rows a reader left out without a word made collapsing runs look healthy (issue 27, item 2): names mapped
from the first line only in ``sorl ingest``, a damaged stretch of a TensorBoard file, a TensorBoard folder
with event files at its root and in run folders, a W&B history whose reward rows have no step."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from sorl_monitor.cli.main import app
from sorl_monitor.diagnose.postmortem import postmortem
from sorl_monitor.logs import LogWarning, find_logs
from sorl_monitor.read.query import open_runs
from tests.helpers.log_writers import tensorboard_run

runner = CliRunner()


def synthetic_trl_log(path, steps: int = 400, drop_at: int = 250):
    """A synthetic TRL-named log whose reward falls from 0.8 to 0.05 at ``drop_at``; its first line holds
    only ``loss`` (which names no trainer)."""
    rows = [{"step": 0, "loss": 0.7}] + [
        {"step": s, "reward": 0.8 if s < drop_at else 0.05, "clip_ratio/region_mean": 0.01, "entropy": 1.0}
        for s in range(1, steps)
    ]
    path.write_text("\n".join(json.dumps(row) for row in rows) + "\n")
    return path


def test_ingest_maps_names_from_every_line_as_the_in_place_read_does(tmp_path):
    log = synthetic_trl_log(tmp_path / "trl.jsonl")
    result = runner.invoke(app, ["ingest", str(log), "--log-dir", str(tmp_path / "runs")])
    assert result.exit_code == 0, result.output
    with open_runs(log) as in_place, open_runs(tmp_path / "runs") as ingested:
        verdicts = [postmortem(runs, "trl") for runs in (in_place, ingested)]
        columns = [
            {c for c, n in runs.sql("SELECT count(COLUMNS(*)) FROM steps").to_pylist()[0].items() if n}
            for runs in (in_place, ingested)
        ]
    assert {"reward_mean", "clip_frac_active"} <= columns[1]
    assert (
        not {"reward", "clip_ratio_region_mean"} & columns[1]
    )  # guards against an unmapped reward judged healthy
    assert {c for c in columns[0] if not c.startswith("monitor_")} <= columns[1]
    assert [v.status for v in verdicts] == ["collapsed", "collapsed"]
    assert verdicts[0].collapse_step == verdicts[1].collapse_step


@pytest.fixture
def event_file(tmp_path):
    """A real ``SummaryWriter`` file, 400 steps of a synthetic ``loss``."""
    folder = tensorboard_run(tmp_path / "tb", {step: {"loss": 1.0 / (1 + step)} for step in range(400)})
    (file,) = folder.glob("*tfevents*")
    return file


def test_damaged_bytes_mid_file_are_reported_and_the_steps_after_them_read(event_file):
    data = bytearray(event_file.read_bytes())
    middle = len(data) // 2
    data[middle : middle + 20] = b"\xaa" * 20
    event_file.write_bytes(bytes(data))
    with pytest.warns(
        LogWarning, match=rf"{event_file.name}: \d+ damaged bytes at byte \d+ skipped, read on"
    ) as seen:
        with open_runs(event_file) as runs:
            steps = runs.sql("SELECT count(*) AS n, max(step) AS last FROM steps").to_pylist()[0]
    assert "points between step" in str(seen[0].message)
    assert steps["last"] == 399  # guards against a log read silently in part
    assert steps["n"] >= 395  # at most the damaged records' points are lost (a histogram's, perhaps: none)


def test_damage_with_no_readable_record_after_it_says_everything_after_is_lost(event_file):
    data = bytearray(event_file.read_bytes())
    middle = len(data) // 2
    data[middle:] = b"\xaa" * (len(data) - middle)
    event_file.write_bytes(bytes(data))
    with pytest.warns(LogWarning, match=r"damaged record at byte \d+; the \d+ bytes from there do not read"):
        with open_runs(event_file) as runs:
            last = runs.sql("SELECT max(step) AS last FROM steps").to_pylist()[0]["last"]
    assert 100 < last < 399


def test_a_record_still_being_written_is_no_damage(event_file, recwarn):
    data = event_file.read_bytes()
    event_file.write_bytes(data[:-7])  # the last record cut short, as a live writer leaves it
    with open_runs(event_file) as runs:
        assert runs.sql("SELECT max(step) AS last FROM steps").to_pylist()[0]["last"] >= 398
    assert not [w for w in recwarn if issubclass(w.category, LogWarning)]


def test_a_tensorboard_folder_with_root_event_files_and_run_folders_yields_every_run(tmp_path):
    root = tmp_path / "tb"
    tensorboard_run(root, {step: {"loss": 0.5} for step in range(3)})
    tensorboard_run(root / "eval", {step: {"loss": 0.4} for step in range(5)})
    tensorboard_run(root / "train", {step: {"loss": 0.3} for step in range(7)})
    assert [source.name for source in find_logs(root)] == [
        "tb",
        "eval",
        "train",
    ]  # guards against finding only the first log of a folder
    with open_runs(root) as runs:
        counts = runs.sql(
            "SELECT run_id, count(*) AS n FROM steps GROUP BY run_id ORDER BY run_id"
        ).to_pylist()
    assert {row["run_id"]: row["n"] for row in counts} == {"tb": 3, "eval": 5, "train": 7}


def test_a_run_with_no_reward_is_not_judged_and_the_dropped_rows_are_named(tmp_path):
    """Synthetic W&B ``run.history()`` dump: loss rows carry ``train/global_step``, reward rows only ``_step``."""
    rows = []
    for step in range(60):
        rows.append({"_step": 2 * step, "_runtime": step, "train/global_step": step, "train/loss": 0.5})
        rows.append({"_step": 2 * step + 1, "_runtime": step, "reward": 0.8 if step < 30 else 0.0})
    history = tmp_path / "history.json"
    history.write_text(json.dumps(rows))
    with pytest.warns(LogWarning, match=r"history.json: 60 rows without a train/global_step are left out \("):
        result = runner.invoke(app, ["postmortem", str(history)])
    assert result.exit_code == 6, result.output  # not judged; before: "healthy", exit 0
    assert "not judged" in result.output
    assert "no row has a reward (reward_mean)" in result.output
    assert "healthy" not in result.output
