"""``sorl train``: one-line errors for bad knobs, and a tiny real run end to end."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from sorl_monitor.cli import train as train_cli
from sorl_monitor.cli.main import app

runner = CliRunner()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--algo", "ppo2"], "unknown algorithm"),
        (["--ctn", "maybe"], "ctn must be"),
        (["--set", "lr=-1"], "lr must be"),
        (["--set", "epochs=0"], "epochs must be"),
        (["--set", "ctn_anchor=reference"], "ctn_anchor must be"),
        (["--set", "lr=fast"], "cannot read 'fast' as float"),
        (["--set", "nope=1"], "unknown setting nope"),
        (["--set", "detectors.kl_rise_critical=x"], "kl_rise_critical"),
        (["--config", "missing.toml"], "config file not found"),
    ],
)
def test_bad_knobs_fail_in_one_line_before_training(args, message, tmp_path):
    result = runner.invoke(app, ["train", "--log-dir", str(tmp_path), *args])
    assert result.exit_code == 2
    assert message in result.output and "Traceback" not in result.output
    assert not any(tmp_path.iterdir())  # nothing started


@pytest.mark.slow
def test_a_tiny_training_run_prints_its_verdict(tmp_path):
    config = tmp_path / "tiny.toml"
    config.write_text(
        'episodes = 16\ngroup_size = 4\nepochs = 1\nminibatches = 2\nwarmstart_steps = 3\nwarmstart_cache = "'
        + str(tmp_path / "cache")
        + '"\n[task]\nmax_hops = 1\nmax_turns = 2\n'
    )
    args = ["train", "--config", str(config), "--algo", "so_ppo", "--ctn", "auto", "--steps", "2",
            "--log-dir", str(tmp_path / "runs"), "--run-name", "tiny", "--quiet"]  # fmt: skip
    result = runner.invoke(app, args)
    assert result.exit_code in (0, 3), result.output
    assert "tiny: finished" in result.output and "sorl postmortem" in result.output
    assert (tmp_path / "runs" / "tiny" / "run.json").is_file()
    assert list((tmp_path / "cache").glob("warmstart-*.pt"))  # the warm start was cached
    again = runner.invoke(app, args)
    assert again.exit_code == 2 and "already exists" in again.output


SMALL_RUN = {"episodes": 16, "group_size": 4, "epochs": 1, "minibatches": 2, "warmstart_steps": 5,
             "warmstart_stuck_nll": None}  # fmt: skip
"""The demo's runs at their smallest: its wiring is under test, not its outcome (a full-size warm start
cost about 30 CPU-seconds in each of its three processes)."""


@pytest.mark.slow
def test_the_demo_trains_its_runs_and_prints_one_post_mortem_table(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))  # the warm-start cache goes under ~/.cache
    small = {name: ({**fields, **SMALL_RUN}, what) for name, (fields, what) in train_cli.DEMO_RUNS.items()}
    monkeypatch.setattr(train_cli, "DEMO_RUNS", small)
    result = runner.invoke(app, ["demo", "--steps", "1", "--log-dir", str(tmp_path / "demo")])
    assert result.exit_code == 0, result.output
    for name in ("token-ppo", "so-ppo-auto-ctn", "ppo-auto-ctn"):
        assert (tmp_path / "demo" / name / "run.json").is_file()
        assert name in result.output
    assert "Post-mortems" in result.output and "stale-rollouts" not in result.output
    assert "sorl dashboard" in result.output
    assert list((tmp_path / ".cache" / "sorl-monitor").glob("warmstart-*.pt"))
