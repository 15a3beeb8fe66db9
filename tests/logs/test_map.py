"""``--map COLUMN=NAME`` and ``[map]`` in the config: a logged name no table knows read as a steps column
(synthetic rows)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from sorl_monitor.cli.main import app
from sorl_monitor.logs import LogOptions, read_log
from sorl_monitor.logs.options import parse_map
from sorl_monitor.read.query import open_runs

runner = CliRunner()


@pytest.fixture
def log(tmp_path):
    path = tmp_path / "loop.jsonl"
    rows = [{"step": s, "my_reward": 0.1 * s, "my_entropy": 1.0, "note": "x"} for s in range(1, 21)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_parse_map_takes_aliases_and_columns():
    assert parse_map(["reward=train_reward", "entropy = token_entropy"]) == {
        "reward_mean": "train_reward",
        "entropy": "token_entropy",
    }
    for bad in ["reward", "=x", "reward=", "rewardz=x"]:
        with pytest.raises(ValueError):
            parse_map([bad])


def test_mapped_names_fill_columns_and_stay(log):
    (run,) = read_log(log, options=LogOptions.build(["reward=my_reward", "entropy=my_entropy"]))
    row = run.steps.to_pylist()[1]
    assert row["reward_mean"] == pytest.approx(0.2) and row["my_reward"] == pytest.approx(0.2)
    assert row["entropy"] == 1.0


def test_the_cli_maps_from_options_and_from_the_config(log, tmp_path):
    result = runner.invoke(app, ["postmortem", str(log), "--json", "--map", "reward=my_reward"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["inputs"]["reward"] == ["reward_mean"]
    config = tmp_path / "sorl.toml"
    config.write_text('[map]\nreward = "my_reward"\n\n[detectors]\n')
    result = runner.invoke(app, ["postmortem", str(log), "--json", "--config", str(config)])
    assert json.loads(result.stdout)["inputs"]["reward"] == ["reward_mean"]
    config.write_text('[map]\nreward = "my_reward"\n')  # no [detectors] table: the top level is read
    result = runner.invoke(app, ["postmortem", str(log), "--json", "--config", str(config)])
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--map", "reward=nope"], "no log read here has a metric named 'nope'"),
        (["--map", "rewardz=my_reward"], "is not a steps column"),
        (["--map", "reward=note"], "not numbers"),
    ],
)
def test_bad_maps_are_one_line_errors(log, args, message):
    result = runner.invoke(app, ["runs", str(log), *args])
    assert result.exit_code == 2
    assert message in result.output and "Traceback" not in result.output


def test_ingest_reads_row_kinds_and_mapped_logs_whole(tmp_path, log):
    kinds = tmp_path / "kinds.jsonl"
    rows = [
        {"type": "eval", "grpo_step": 0, "reward": 0.9},
        {"type": "rollout", "grpo_step": 1, "reward": 0.1},
        {"type": "train", "grpo_step": 1, "optimizer_step": 1, "token_entropy": 0.5},
        {"type": "rollout", "grpo_step": 2, "reward": 0.2},
        {"type": "train", "grpo_step": 2, "optimizer_step": 2, "token_entropy": 0.4},
    ]
    kinds.write_text("".join(json.dumps(r) + "\n" for r in rows))
    runs_dir = tmp_path / "runs"
    result = runner.invoke(app, ["ingest", str(kinds), "--log-dir", str(runs_dir)])
    assert result.exit_code == 0, result.output
    result = runner.invoke(app, ["ingest", str(log), "--log-dir", str(runs_dir), "--map", "reward=my_reward"])
    assert result.exit_code == 0, result.output
    with open_runs(runs_dir) as runs:
        got = runs.sql(
            "SELECT run_id, step, entropy, reward_mean FROM steps ORDER BY run_id, step"
        ).to_pylist()
    assert [(r["step"], r["entropy"]) for r in got if r["run_id"] == "kinds"] == [(1, 0.5), (2, 0.4)]
    assert [r["reward_mean"] for r in got if r["run_id"] == "loop"][:2] == pytest.approx([0.1, 0.2])


def test_dashboard_settings_carry_the_map_and_logging_steps(monkeypatch):
    from sorl_monitor.dashboard.launch_settings import LOG_MAP_ENV, LOGGING_STEPS_ENV, settings

    monkeypatch.setenv(LOG_MAP_ENV, "reward=my_reward\nentropy=my_entropy\n")
    monkeypatch.setenv(LOGGING_STEPS_ENV, "20")
    got = settings()
    assert (got.log_map, got.logging_steps) == (("reward=my_reward", "entropy=my_entropy"), 20)
