"""Format detection by content, ``--format`` forcing, unknown logs, several runs in one folder, no writes."""

from __future__ import annotations

import json
import os

import pytest
from typer.testing import CliRunner

from sorl_monitor.cli.main import app
from sorl_monitor.logs import FORMATS, LogFormatError, detect_format, read_log
from sorl_monitor.read.query import QueryError, open_runs
from tests.helpers.log_writers import TRL_STEPS, csv_file, jsonl_file, tensorboard_run, verl_file
from tests.helpers.runs import write_run

runner = CliRunner()


def test_formats_are_told_apart_by_content_not_by_file_name(tmp_path):
    assert detect_format(jsonl_file(tmp_path / "metrics.txt")) == "jsonl"
    assert detect_format(csv_file(tmp_path / "metrics.log")) == "csv"
    assert detect_format(verl_file(tmp_path / "exp.jsonl")) == "verl"
    history = [{"step": s, **m} for s, m in TRL_STEPS.items()]
    (tmp_path / "history.data").write_text(json.dumps(history, allow_nan=True))
    assert detect_format(tmp_path / "history.data") == "hf"
    (tmp_path / "state.json").write_text(json.dumps({"global_step": 6, "log_history": history}, indent=2))
    assert detect_format(tmp_path / "state.json") == "hf"
    (tmp_path / "hist.csv").write_text("_step,_runtime,_timestamp,loss\n0,1.0,1700000000,0.5\n")
    assert detect_format(tmp_path / "hist.csv") == "wandb"
    assert detect_format(tensorboard_run(tmp_path / "tb")) == "tensorboard"
    event_file = next((tmp_path / "tb").iterdir())
    renamed = tmp_path / "renamed.bin"
    renamed.write_bytes(event_file.read_bytes())
    assert detect_format(renamed) == "tensorboard"  # the TFRecord header, not the name
    assert detect_format(write_run(tmp_path / "logs", "run-a", updates=1)) == "sorl"
    (tmp_path / "notes.txt").write_text("hello\n")
    assert detect_format(tmp_path / "notes.txt") is None


def test_format_forces_how_a_file_is_read(tmp_path):
    path = verl_file(tmp_path / "exp.jsonl")
    with pytest.raises(LogFormatError, match="no step column"):
        read_log(path, "csv")
    (run,) = read_log(path, "jsonl")  # read as flat JSON lines: nested data becomes data.<key> columns
    assert run.format == "jsonl" and "data_actor_pg_loss" in run.steps.column_names


def test_format_in_a_folder_keeps_only_logs_of_that_format(tmp_path):
    csv_file(tmp_path / "a.csv")
    jsonl_file(tmp_path / "b.jsonl")
    assert [r.run_id for r in read_log(tmp_path)] == ["a", "b"]
    assert [r.run_id for r in read_log(tmp_path, "csv")] == ["a"]


def test_an_unknown_format_name_is_refused(tmp_path):
    with pytest.raises(QueryError, match="known formats: sorl, hf"):
        open_runs(csv_file(tmp_path / "a.csv"), "parquet")


@pytest.mark.parametrize("command", [["postmortem"], ["summary"], ["runs"], ["query", "SELECT 1"], ["watch"]])
def test_an_unreadable_file_is_one_error_line_naming_the_formats_and_exit_2(tmp_path, command):
    path = tmp_path / "weights.bin"
    path.write_bytes(bytes(range(256)) * 16)
    args = [command[0], str(path), *command[1:]]
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    assert result.output.strip().count("\n") == 0 and "Traceback" not in result.output
    assert all(name in result.output for name in FORMATS)


def test_a_log_that_does_not_parse_as_its_forced_format_is_one_error_line(tmp_path):
    result = runner.invoke(app, ["postmortem", str(verl_file(tmp_path / "exp.jsonl")), "--format", "csv"])
    assert result.exit_code == 2 and "no step column" in result.output
    assert result.output.strip().count("\n") == 0


def test_a_folder_of_several_logs_and_parquet_runs_is_one_run_set(tmp_path):
    write_run(tmp_path, "parquet-run", updates=3)
    tensorboard_run(tmp_path / "tb" / "ppo")
    tensorboard_run(tmp_path / "tb" / "grpo" / "train")
    for seed in (1, 2):
        history = [{"step": s, **m} for s, m in TRL_STEPS.items()]
        (tmp_path / f"rho_seed{seed}.step_logs.json").write_text(json.dumps(history))
    with open_runs(tmp_path) as runs:
        rows = runs.sql("SELECT run_id, status FROM runs ORDER BY run_id").to_pylist()
        counts = runs.sql("SELECT run_id, count(*) AS n FROM steps GROUP BY 1 ORDER BY 1").to_pylist()
        assert set(runs.columns("steps")) >= {"reward_mean", "clip_frac_turn", "ratio_max"}  # the full schema
    assert rows == [
        {"run_id": "parquet-run", "status": "finished"},
        {"run_id": "rho_seed1.step_logs", "status": "imported"},
        {"run_id": "rho_seed2.step_logs", "status": "imported"},
        {"run_id": "tb-grpo-train", "status": "imported"},
        {"run_id": "tb-ppo", "status": "imported"},
    ]
    assert [c["n"] for c in counts] == [3, 6, 6, 6, 6]


def tree_state(folder):
    return sorted((str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in folder.rglob("*"))


def test_reading_foreign_logs_never_writes_next_to_them(tmp_path, monkeypatch):
    logs = tmp_path / "logs"
    tensorboard_run(logs / "tb")
    jsonl_file(logs / "m.jsonl")
    csv_file(logs / "m.csv")
    verl_file(logs / "exp.jsonl")
    (logs / "step_logs.json").write_text(json.dumps([{"step": s, **m} for s, m in TRL_STEPS.items()]))
    before = tree_state(logs)
    monkeypatch.chdir(tmp_path)
    for args in (["runs", "logs"], ["summary", "logs/m.csv"], ["postmortem", "logs/exp.jsonl", "--json"],
                 ["query", "logs", "SELECT count(*) FROM steps"], ["report", "logs", "--html", "out.html"]):  # fmt: skip
        result = runner.invoke(app, args)
        assert result.exit_code in (0, 3), (args, result.output)
    assert tree_state(logs) == before
    assert sorted(os.listdir(tmp_path)) == ["logs", "out.html"]


def test_refresh_follows_a_growing_jsonl_log(tmp_path):
    path = tmp_path / "live.jsonl"
    path.write_text('{"step": 1, "reward": 0.5}\n{"step": 2, "rew')  # the last line is still being written
    with open_runs(path) as runs:
        assert runs.sql("SELECT max(step) FROM steps").column(0)[0].as_py() == 1
        with open(path, "a") as handle:
            handle.write('ard": 0.6}\n{"step": 3, "reward": 0.7}\n')
        assert runs.refresh()
        assert runs.sql("SELECT list(reward_mean ORDER BY step) FROM steps").column(0)[0].as_py() == [
            0.5,
            0.6,
            0.7,
        ]
