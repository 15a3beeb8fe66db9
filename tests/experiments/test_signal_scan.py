"""experiments/signal_scan.py: the transforms of a block series, the 2-of-the-stable-runs level and what a
candidate catches in the credited window, and reading the misses off detector_eval.txt, on SYNTHETIC series."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("signal_scan", ROOT / "experiments" / "signal_scan.py")
signal_scan = importlib.util.module_from_spec(spec)
sys.modules["signal_scan"] = signal_scan
spec.loader.exec_module(signal_scan)
Labelled = sys.modules["detector_eval"].Labelled

STEPS = np.arange(16) * 8 + 7  # 16 blocks of 8 updates, each at its last update


def test_synthetic_flat_series_then_a_jump_gives_the_transforms_their_formulas():
    x = np.full(16, 2.0)
    x[10] = 6.0
    out = signal_scan.transforms(x, STEPS, floor=0.01)
    assert np.isnan(out["fold"][:2]).all() and np.isnan(out["z"][:2]).all()  # judged from update 16 on
    assert out["raw"][0] == 2.0  # the raw level from the first block
    assert out["fold"][10] == pytest.approx(3.0)
    assert out["early"][10] == pytest.approx(3.0)
    assert out["z"][10] == pytest.approx((6.0 - 2.0) / 0.2)  # std 0, floored at 10 % of the mean
    assert out["drop"][11] == pytest.approx(1 - 2.0 / 6.0)  # below the history's high
    assert out["fold"][9] == pytest.approx(1.0) and out["z"][9] == pytest.approx(0.0)


def test_synthetic_ramp_has_its_slope_per_window_in_history_units():
    x = 1.0 + 0.1 * np.arange(16)
    out = signal_scan.transforms(x, STEPS, floor=0.01)
    history = x[:15]  # fewer blocks than the 256-update history holds: all of them
    scale = max(history.std(), 0.1 * history.mean())
    assert out["slope"][15] == pytest.approx(0.1 * 8 / scale)  # 64 updates: 8 blocks


def test_synthetic_fold_from_start_judges_the_first_blocks_against_the_floor():
    x = np.array([0.1, 0.1, 0.1, 0.1])
    assert np.isnan(signal_scan.transforms(x, STEPS[:4], 0.02)["fold"][0])
    assert signal_scan.transforms(x, STEPS[:4], 0.02, fold_from_start=True)["fold"][0] == pytest.approx(5.0)


def test_synthetic_level_is_what_only_two_stable_runs_exceed_and_only_the_window_counts():
    steps = {name: STEPS for name in ["s1", "s2", "s3", "s4", "s5", "early", "late", "inside", "before"]}
    values = {f"s{k}": np.full(16, float(k)) for k in range(1, 6)}  # stable maxima 1..5: level 3
    values["inside"] = np.where(STEPS == 63, 3.5, 0.0)  # above the level at update 63, fall at 64
    values["late"] = np.where(STEPS == 71, 3.5, 0.0)  # above it only after the fall started
    values["before"] = np.where(STEPS == 23, 3.5, 0.0)  # above it before the last recovery
    values["early"] = np.where(STEPS == 7, 3.0, 0.0)  # at the level, not above it
    collapsing = [
        Labelled("inside", "x", 64, False, False),
        Labelled("late", "x", 64, False, False),
        Labelled("before", "x", 64, False, False, streak_from=40),
        Labelled("early", "x", 64, False, False),
    ]
    stable = [f"s{k}" for k in range(1, 6)]
    result = signal_scan.score_candidate("c", values, steps, stable, collapsing, {"inside", "late"})
    assert result.level == 3.0
    assert (result.caught, result.missed_caught, result.first_steps) == (1, 1, [63])
    assert (result.near_caught, result.near_missed_caught) == (1, 1)


def test_synthetic_candidate_no_stable_run_logs_is_skipped():
    values = {"s": np.full(4, np.nan)}
    assert signal_scan.score_candidate("c", values, {"s": STEPS[:4]}, ["s", "s", "s"], [], set()) is None


def test_misses_are_read_off_the_update_section(tmp_path):
    text = (
        "### update: per optimizer update\n| … |\nmissed: a-r4x4-lr1e-3-s0 (collapse 16, alarm 287\n"
        "  kl_rise), b.c-s1\n  (collapse 64, alarm None)\nfalse alarms: z-s1 (alarm 15 clip_rise)\n"
        "### batch: …\nmissed: other-s0 (collapse 5, alarm None)\n"
    )
    (tmp_path / "eval.txt").write_text(text)
    assert signal_scan.misses_per_update(tmp_path / "eval.txt") == {"a-r4x4-lr1e-3-s0", "b.c-s1"}
