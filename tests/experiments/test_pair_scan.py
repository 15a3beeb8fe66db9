"""experiments/pair_scan.py: a pair fires only where both signals cross in the same block, a level pair is
admissible with at most 2 stable runs firing, and the leave-one-setting-out gate refits the levels without the
held-out setting, on SYNTHETIC series."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("pair_scan", ROOT / "experiments" / "pair_scan.py")
pair_scan = importlib.util.module_from_spec(spec)
sys.modules["pair_scan"] = pair_scan
spec.loader.exec_module(pair_scan)


def test_synthetic_a_pair_fires_only_where_both_cross_in_the_same_block():
    # two segments of 3 blocks; in the first, a and b cross in different blocks; in the second, together
    a = np.array([5.0, 0.0, 0.0, 0.0, 5.0, 0.0])
    b = np.array([0.0, 5.0, 0.0, 0.0, 5.0, 0.0])
    fires = pair_scan.pair_fires(a, b, np.array([1.0, 9.0]), np.array([1.0]), np.array([0, 3]))
    assert fires.shape == (2, 2, 1)
    assert fires[0, :, 0].tolist() == [False, True]
    assert not fires[1].any()  # a's level 9 is never crossed


def test_synthetic_best_levels_keep_at_most_two_stable_runs_firing():
    # 4 stable segments, 2 collapsing (one a miss); level pair (0, 0): 3 stable fire; (1, 0): 2 stable fire
    fires = np.zeros((2, 6, 1), bool)
    fires[0, :3, 0] = True
    fires[0, 4:, 0] = True
    fires[1, :2, 0] = True
    fires[1, 4, 0] = True
    stable = np.array([True] * 4 + [False] * 2)
    missed = np.array([False] * 4 + [True, False])
    assert pair_scan.best_levels(fires, stable, missed, np.ones(6, bool)) == (1, 0)
    assert pair_scan.best_levels(fires[:1], stable, missed, np.ones(6, bool)) is None


def test_synthetic_gate_refits_without_the_held_out_setting_and_counts_only_new_false_alarms():
    segments = ["a-x-s0", "a-x-s1", "b-y-s0", "c-z-s0", "d-w-s0"]  # 3 stable, then 2 collapsing
    fires = np.zeros((1, 5, 1), bool)
    fires[0, [0, 1, 3, 4], 0] = True  # both stable runs of setting a-x fire, and both collapses
    added, new_false = pair_scan.loso_gate(fires, segments, 3, {"c-z-s0", "d-w-s0"}, quiet_false={"a-x-s1"})
    assert sorted(added) == ["c-z-s0", "d-w-s0"]
    assert new_false == ["a-x-s0"]  # a-x-s1 is already a false alarm of the detectors
