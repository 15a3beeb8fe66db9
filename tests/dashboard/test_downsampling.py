"""Min/max-bucket downsampling keeps spikes; the turn heatmap's bucketing keeps the most extreme cell."""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pytest

from sorl_monitor.figures.series import downsample, minmax_indices
from sorl_monitor.figures.turns import turn_ratio_grid


def test_single_step_spike_in_a_long_synthetic_series_survives_downsampling():
    rng = np.random.default_rng(0)
    steps = np.arange(1_000_000)
    values = 1.0 + 0.01 * rng.standard_normal(len(steps))
    spike_at, dip_at = 637_213, 91_457
    values[spike_at], values[dip_at] = 50.0, -20.0

    x, y = downsample(steps, values, max_points=2000)

    assert len(x) <= 2000
    assert spike_at in x and y[list(x).index(spike_at)] == 50.0
    assert dip_at in x and y[list(x).index(dip_at)] == -20.0


def test_every_bucket_keeps_its_minimum_and_maximum_synthetic():
    values = np.random.default_rng(1).standard_normal(10_007)
    max_points = 100
    kept = set(minmax_indices(values, max_points).tolist())

    size = math.ceil(len(values) / ((max_points - 2) // 2))
    for start in range(0, len(values), size):
        bucket = values[start : start + size]
        assert start + int(np.argmin(bucket)) in kept
        assert start + int(np.argmax(bucket)) in kept


def test_downsampled_points_are_in_step_order_and_at_most_max_points():
    values = np.random.default_rng(2).standard_normal(50_000)
    kept = minmax_indices(values, 301)
    assert len(kept) <= 301
    assert np.all(np.diff(kept) > 0)


def test_a_series_shorter_than_max_points_is_drawn_whole():
    values = np.array([3.0, 1.0, 2.0])
    assert minmax_indices(values, 10).tolist() == [0, 1, 2]


def test_nan_points_are_never_chosen_synthetic():
    values = np.full(1000, np.nan)
    values[::7] = np.arange(len(values[::7]), dtype=float)
    kept = minmax_indices(values, 20)
    assert len(kept) > 0
    assert not np.isnan(values[kept]).any()


def test_the_first_and_the_last_point_are_always_drawn_so_a_live_curve_reaches_its_latest_step():
    values = np.sin(np.arange(100_003) / 7.0)
    values[0] = np.nan
    kept = minmax_indices(values, 200)
    assert kept[0] == 1 and kept[-1] == len(values) - 1


def test_max_points_below_four_is_refused():
    with pytest.raises(ValueError, match="max_points"):
        minmax_indices(np.arange(10.0), 3)


def test_turn_heatmap_bucketing_keeps_the_cell_furthest_from_one_synthetic():
    steps = np.repeat(np.arange(1000), 2)
    turns = np.tile([0, 1], 1000)
    ratios = np.full(2000, 1.01)
    ratios[2 * 517 + 1] = 0.1  # turn 1 at step 517: a one-step collapse of the turn ratio
    cells = pa.table({"step": steps, "turn_idx": turns, "ratio_mean": ratios})

    x, y, grid = turn_ratio_grid(cells, max_columns=50)

    assert len(x) <= 50
    assert y.tolist() == [0, 1]
    assert grid.shape == (2, len(x))
    assert grid[1].min() == 0.1
    bucket = int(np.searchsorted(x, 517, side="right")) - 1
    assert grid[1, bucket] == 0.1
