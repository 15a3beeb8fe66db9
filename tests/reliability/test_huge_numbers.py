"""Huge and non-finite numbers: stored as they are (or as the nearest double), never costing other rows."""

from __future__ import annotations

import math

import pytest
import torch

from sorl_monitor import Monitor, MonitorWarning, WriterConfig
from sorl_monitor.read.query import open_runs


def test_integers_beyond_int64_are_stored_as_doubles(tmp_path):
    with Monitor(tmp_path, "big", writer=WriterConfig(flush_interval_s=60)) as mon:
        mon.log_scalars(0, {"tokens_seen": 2**80, "loss": 2**70})
        mon.log_scalars(1, {"tokens_seen": 5, "loss": 1e308})
        assert mon.flush() and mon.writer_stats().rows_dropped == 0
    with open_runs(tmp_path) as runs:
        rows = runs.sql("SELECT step, tokens_seen, loss FROM steps ORDER BY step").to_pylist()
    assert rows == [
        {"step": 0, "tokens_seen": float(2**80), "loss": float(2**70)},
        {"step": 1, "tokens_seen": 5.0, "loss": 1e308},
    ]


def test_a_step_beyond_int64_is_refused_with_a_warning_and_later_steps_go_on(tmp_path):
    with Monitor(tmp_path, "step", writer=WriterConfig(flush_interval_s=60)) as mon:
        mon.log_scalars(0, {"loss": 1.0})
        with pytest.warns(MonitorWarning, match="does not fit"):
            mon.log_scalars(2**70, {"loss": 2.0})
        mon.log_scalars(None, {"loss": 3.0})
        with pytest.warns(MonitorWarning, match="ppo_epoch .* does not fit"):
            mon.log_update(
                logp=torch.zeros(1, 2), old_logp=torch.zeros(1, 2), mask=torch.ones(1, 2), ppo_epoch=2**40
            )
    with open_runs(tmp_path) as runs:
        rows = runs.sql("SELECT step, monitor_errors FROM steps ORDER BY step").to_pylist()
    assert rows == [{"step": 0, "monitor_errors": 0.0}, {"step": 1, "monitor_errors": 1.0}]


def test_nan_and_infinities_are_stored_and_read_back(tmp_path):
    with Monitor(tmp_path, "nonfinite", writer=WriterConfig(flush_interval_s=60)) as mon:
        mon.log_scalars(0, {"loss": math.nan, "grad_norm": math.inf, "adv_min": -math.inf})
    with open_runs(tmp_path) as runs:
        row = runs.sql("SELECT isnan(loss) AS nan, grad_norm, adv_min FROM steps").to_pylist()[0]
    assert row == {"nan": True, "grad_norm": math.inf, "adv_min": -math.inf}


def test_nan_metrics_are_found_by_isnan_and_comparisons_over_parquet(tmp_path):
    with Monitor(tmp_path, "nanq", writer=WriterConfig(flush_interval_s=60)) as mon:
        for step, loss in enumerate([0.5, math.nan, 0.25]):
            mon.log_scalars(step, {"loss": loss})
    with open_runs(tmp_path) as runs:
        flagged = runs.sql("SELECT step FROM steps WHERE isnan(loss)").column(0).to_pylist()
        above = runs.sql("SELECT count(*) FROM steps WHERE loss > 0.3").column(0)[0].as_py()
        largest = runs.sql("SELECT max(loss) FROM steps").column(0)[0].as_py()
    assert flagged == [1]
    assert above == 2  # 0.5 and NaN (DuckDB orders NaN above every number)
    assert math.isnan(largest)
