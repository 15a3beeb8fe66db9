"""experiments/collapse_sweep.py: a finished run is read back only when it was trained with the settings the
sweep would train now (a changed default means it is trained again), and the hold ratio's arithmetic."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from sorl_monitor.trainer.config import TrainConfig

SCRIPT = Path(__file__).resolve().parents[2] / "experiments" / "collapse_sweep.py"
spec = importlib.util.spec_from_file_location("collapse_sweep", SCRIPT)
collapse_sweep = importlib.util.module_from_spec(spec)
sys.modules["collapse_sweep"] = collapse_sweep
spec.loader.exec_module(collapse_sweep)


def stored_run(folder: Path, config: dict, status: str = "finished") -> Path:
    folder.mkdir(parents=True)
    (folder / "run.json").write_text(json.dumps({"status": status, "config": config}))
    return folder


def test_a_finished_run_with_the_same_settings_is_read_back(tmp_path):
    cfg = TrainConfig(seed=3, iterations=5).to_dict()
    run = stored_run(tmp_path / "r", {**cfg, "log_dir": "elsewhere", "threads": 4})
    assert collapse_sweep.reusable(run, cfg)


@pytest.mark.parametrize("change", [{"lr": 1e-3}, {"epochs": 4}, {"ctn_coef": 1.0}, {"seed": 4}])
def test_a_run_made_under_other_settings_or_defaults_is_trained_again(tmp_path, change):
    cfg = TrainConfig(seed=3, iterations=5).to_dict()
    run = stored_run(tmp_path / "r", {**cfg, **change})
    assert not collapse_sweep.reusable(run, cfg)


def test_a_knob_added_after_the_run_is_not_compared(tmp_path):
    cfg = TrainConfig(seed=3, iterations=5).to_dict()
    older = {key: value for key, value in cfg.items() if key != "ctn_kl_cap"}
    assert collapse_sweep.reusable(stored_run(tmp_path / "r", older), cfg)


def test_an_auto_run_from_before_ctn_guard_every_is_retrained_only_if_it_would_differ(tmp_path):
    cases = [("ppo", "auto", 4, False), ("ppo", "auto", None, True), ("ppo", "auto", 32, True),
             ("so_ppo", None, 4, True), ("ppo", None, 4, True)]  # fmt: skip
    for algo, ctn, every, reused in cases:
        cfg = TrainConfig(algo=algo, ctn=ctn, ctn_guard_every=every, seed=3, iterations=5).to_dict()
        old = {key: value for key, value in cfg.items() if key != "ctn_guard_every"}
        assert collapse_sweep.reusable(stored_run(tmp_path / f"{algo}-{ctn}-{every}", old), cfg) is reused


def test_an_auto_run_from_before_ctn_auto_start_is_reused_only_for_off(tmp_path):
    cases = [("ppo", "auto", "off", True), ("ppo", "auto", "on", False), ("so_ppo", None, "on", True),
             ("ppo", "off", "on", True)]  # fmt: skip
    for algo, ctn, start, reused in cases:
        cfg = TrainConfig(algo=algo, ctn=ctn, ctn_auto_start=start, seed=3, iterations=5).to_dict()
        old = {key: value for key, value in cfg.items() if key != "ctn_auto_start"}
        assert collapse_sweep.reusable(stored_run(tmp_path / f"{algo}-{ctn}-{start}", old), cfg) is reused


def test_a_run_from_before_ctn_raise_unclipped_is_reused_only_without_it(tmp_path):
    for value, reused in ((False, True), (True, False)):
        cfg = TrainConfig(algo="ppo", ctn="auto", ctn_raise_unclipped=value, seed=3, iterations=5).to_dict()
        old = {key: v for key, v in cfg.items() if key != "ctn_raise_unclipped"}
        assert collapse_sweep.reusable(stored_run(tmp_path / f"r{value}", old), cfg) is reused


def test_a_run_from_before_the_stuck_warm_start_rule_is_reused_unless_its_warm_start_changes(tmp_path):
    """Seeds 28 and 45 were stuck at 300 warm-start steps; other seeds of 0–47 trained alike, other warm starts unknown."""
    cases = [({"seed": 3}, True), ({"seed": 45}, False), ({"seed": 28}, False), ({"seed": 48}, False),
             ({"seed": 3, "warmstart_error_rate": 0.2}, False), ({"seed": 45, "warmstart_stuck_nll": None}, True)]  # fmt: skip
    for i, (change, reused) in enumerate(cases):
        cfg = TrainConfig(iterations=5, **change).to_dict()
        old = {key: v for key, v in cfg.items() if key not in ("warmstart_stuck_nll", "warmstart_target_nll")}
        assert collapse_sweep.reusable(stored_run(tmp_path / f"r{i}", old), cfg) is reused, change


def test_unfinished_or_unreadable_runs_are_trained_again(tmp_path):
    cfg = TrainConfig().to_dict()
    assert not collapse_sweep.reusable(stored_run(tmp_path / "a", cfg, status="running"), cfg)
    assert not collapse_sweep.reusable(tmp_path / "missing", cfg)
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "run.json").write_text("{not json")
    assert not collapse_sweep.reusable(tmp_path / "b", cfg)


def test_hold_is_the_lowest_moving_average_over_its_running_peak_after_ten_iterations():
    rewards = [0.5] * 12 + [0.1] * 5 + [0.5] * 10  # the 5-iteration average reaches 0.1 at iteration 16
    hold, peak = collapse_sweep.hold_ratio(rewards)
    assert peak == pytest.approx(0.5)
    assert hold == pytest.approx(0.2)
    rising = [0.1] * 10 + [0.5] * 10  # from iteration 10 on the average only rises: its peak is itself
    assert collapse_sweep.hold_ratio(rising) == pytest.approx((1.0, 0.5))


def test_hold_counts_full_five_iteration_windows_only():
    """One lucky first batch is not a 5-iteration average: it must not set the peak."""
    rewards = [0.9] + [0.5] * 20  # the first full window (iterations 0-4) averages 0.58
    hold, peak = collapse_sweep.hold_ratio(rewards)
    assert peak == pytest.approx(0.58)
    assert hold == pytest.approx(0.5 / 0.58)  # a 1-iteration "average" made it 0.5 / 0.9 = 0.56
