"""A value of the wrong type costs its own row at most, never the other rows of the same flush."""

from __future__ import annotations

import pytest

from sorl_monitor import Monitor, MonitorWarning, WriterConfig
from sorl_monitor.read.query import open_runs


def test_a_column_that_is_text_in_one_row_and_a_number_in_another_keeps_both_rows(tmp_path):
    with Monitor(tmp_path, "mixed", writer=WriterConfig(flush_interval_s=60)) as mon:
        mon.log_scalars(0, {"loss": 1.0, "note": 1.5})
        mon.log_scalars(1, {"loss": 2.0, "note": "text"})
        assert mon.flush()
        assert mon.writer_stats().rows_dropped == 0
    with open_runs(tmp_path) as runs:
        rows = runs.sql("SELECT step, loss, note FROM steps ORDER BY step").to_pylist()
    assert [(r["step"], r["loss"]) for r in rows] == [(0, 1.0), (1, 2.0)]
    assert rows[1]["note"] == "text"


def test_an_unconvertible_value_in_a_known_column_drops_only_its_row(tmp_path):
    with Monitor(tmp_path, "bad", writer=WriterConfig(flush_interval_s=60)) as mon:
        mon.log_scalars(0, {"loss": 1.0})
        mon.log_scalars(1, {"loss": "not a number"})
        mon.log_scalars(2, {"loss": 3.0})
        assert mon.flush()
        assert mon.writer_stats().rows_dropped == 1
        with pytest.warns(MonitorWarning, match="not a number"):
            mon.log_scalars(3, {"loss": 4.0})
    with open_runs(tmp_path) as runs:
        steps = runs.sql("SELECT step FROM steps ORDER BY step").column(0).to_pylist()
    assert steps == [0, 2, 3]
