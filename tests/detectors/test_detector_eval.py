"""benchmarks/detector_eval.py: scoring on SYNTHETIC runs, baselines' rules, and an end-to-end run on real
runs of the tiny PPO loop (tests/detectors/tiny_pg.py, not the bundled trainer)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from sorl_monitor.query import open_runs
from tests.detectors.synthetic import pattern_rows, stable_rows, write_rows
from tests.detectors.tiny_pg import train

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "detector_eval.py"
spec = importlib.util.spec_from_file_location("detector_eval", SCRIPT)
detector_eval = importlib.util.module_from_spec(spec)
sys.modules["detector_eval"] = detector_eval
spec.loader.exec_module(detector_eval)


def test_score_counts_detections_late_alarms_misses_and_false_alarms():
    labels = {"a": 100, "b": 100, "c": 100, "d": None, "e": None}
    alarms = {"a": 90, "b": 120, "d": 5}
    result = detector_eval.score("m", labels, alarms)
    assert (result.detected, result.late, result.missed, result.false_alarms) == (1, 1, 1, 1)
    assert result.recall == pytest.approx(1 / 3) and result.false_alarm_rate == pytest.approx(1 / 2)
    assert result.lead_times == [10] and result.median_lead == 10 and result.min_lead == 10


def collapsing(rows: list[dict], at: int) -> list[dict]:
    for row in rows[at:]:
        row["reward_mean"] = 0.02
    return rows


@pytest.fixture
def sweep(tmp_path) -> Path:
    """SYNTHETIC sweep: two collapsing runs with a precursor, one without, two stable runs."""
    write_rows(tmp_path, "clip-then-fall", collapsing(pattern_rows("clip_frac_level", 420), 300))
    write_rows(tmp_path, "kl-then-fall", collapsing(pattern_rows("kl_spike", 420), 320))
    write_rows(tmp_path, "sudden-fall", collapsing(stable_rows(420, seed=3), 300))
    write_rows(tmp_path, "stable-1", stable_rows(420, seed=1))
    rows = stable_rows(420, seed=2)
    rows[200]["grad_norm"] = 30.0
    write_rows(tmp_path, "stable-with-grad-spike", rows)
    return tmp_path


def test_evaluation_of_a_synthetic_sweep(sweep):
    with open_runs(sweep) as runs:
        evaluation = detector_eval.evaluate(runs)
    combined = next(s for s in evaluation.scores if s.method == "combined")
    assert (combined.collapsing, combined.stable) == (3, 2)
    assert combined.detected == 2 and combined.missed == 1
    assert combined.false_alarms == 1  # the grad spike of stable-with-grad-spike is critical
    clip = next(s for s in evaluation.scores if s.method == "clip_frac_level")
    assert (
        clip.detected == 1
        and clip.lead_times[0]
        == evaluation.labels["clip-then-fall"] - evaluation.alarms["clip_frac_level"]["clip-then-fall"]
    )


def test_olmo_style_baseline_fires_on_a_six_sigma_grad_spike_synthetic(sweep):
    with open_runs(sweep) as runs:
        alarms = detector_eval.first_alarms(runs, detector_eval.DetectorConfig())
    assert alarms["baseline_grad_spike"].get("stable-with-grad-spike") == 200
    assert "stable-1" not in alarms["baseline_grad_spike"]


def test_foundry_style_baseline_needs_five_consecutive_outliers_synthetic(tmp_path):
    rows = stable_rows(400)
    for row in rows[300:304]:
        row["reward_mean"] = 0.01  # four outliers: no alarm
    for row in rows[350:]:
        row["reward_mean"] = 0.01  # a sustained fall: alarm on its fifth update
    write_rows(tmp_path, "r", rows)
    with open_runs(tmp_path) as runs:
        alarms = detector_eval.first_alarms(runs, detector_eval.DetectorConfig())
    assert alarms["baseline_loss_spike"]["r"] == 354


def test_cli_prints_tables_and_writes_json(sweep, tmp_path, capsys):
    out = tmp_path / "eval.json"
    assert detector_eval.main([str(sweep), "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "| combined |" in printed and "confusion (baseline_grad_spike)" in printed
    payload = json.loads(out.read_text())
    assert {s["method"] for s in payload["scores"]} >= {"combined", "baseline_loss_spike"}


def test_cli_bad_input_is_one_line_and_exit_2(tmp_path, capsys):
    assert detector_eval.main([str(tmp_path / "missing")]) == 2
    assert detector_eval.main([str(tmp_path), "--set", "nope=1"]) == 2
    assert capsys.readouterr().err.count("error:") == 2


@pytest.mark.slow
def test_end_to_end_on_real_tiny_ppo_runs(tmp_path):
    """REAL (not synthetic) training: a stable and a learning-rate-ramped run of the tiny PPO loop."""
    train(tmp_path, "stable", lr=0.01, epochs=2, iterations=60)
    train(tmp_path, "ramped", lr=0.01, lr_end=1.0, epochs=4, iterations=100)
    with open_runs(tmp_path) as runs:
        evaluation = detector_eval.evaluate(runs)
    assert set(evaluation.labels) == {"stable", "ramped"}
    combined = next(s for s in evaluation.scores if s.method == "combined")
    assert combined.collapsing + combined.stable == 2
    assert combined.detected + combined.late + combined.missed == combined.collapsing
