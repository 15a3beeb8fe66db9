"""``Monitor.log_modules``: module norms measured outside ``log_update`` (by a trainer callback)."""

from __future__ import annotations

import math

import pytest

from sorl_monitor import Monitor, MonitorWarning, WriterConfig
from sorl_monitor.read.query import open_runs


def test_log_modules_writes_one_row_per_module_at_the_given_step(tmp_path):
    with Monitor(tmp_path, "mods", writer=WriterConfig(flush_interval_s=0.05)) as mon:
        mon.log_scalars(4, {"loss": 1.0})
        mon.log_modules(4, {"model.layers.0": 3.0, "lm_head": 0.5}, {"model.layers.0": 10.0})
    with open_runs(tmp_path / "mods") as runs:
        rows = runs.sql("SELECT step, module, grad_norm, param_norm FROM modules ORDER BY module").to_pylist()
    assert [(r["step"], r["module"], r["grad_norm"]) for r in rows] == [
        (4, "lm_head", 0.5),
        (4, "model.layers.0", 3.0),
    ]
    assert math.isnan(rows[0]["param_norm"]) and rows[1]["param_norm"] == 10.0


def test_log_modules_defaults_to_the_last_step_and_never_raises(tmp_path):
    with Monitor(tmp_path, "mods", writer=WriterConfig(flush_interval_s=0.05)) as mon:
        mon.log_scalars(9, {"loss": 1.0})
        mon.log_modules(None, {"head": 1.0})
        with pytest.warns(MonitorWarning, match="log_modules failed"):
            mon.log_modules(None, {"head": "not a number"})
        assert mon.recent_steps().num_rows == 1
    with open_runs(tmp_path / "mods") as runs:
        assert runs.sql("SELECT step FROM modules").column(0).to_pylist() == [9]
