"""Settings that cannot work are refused when the monitor is built, before anything is written."""

from __future__ import annotations

import math

import pytest

from sorl_monitor import Monitor
from sorl_monitor.write.writer import ParquetStreamWriter


@pytest.mark.parametrize(
    ("setting", "value"),
    [
        ("flush_interval_s", 0),  # before the fix: accepted, the writer thread busy-looped
        ("flush_interval_s", -1.0),
        ("flush_interval_s", math.nan),
        ("flush_interval_s", math.inf),
        ("flush_rows", 0),
        ("max_pending_rows", 0),
        ("max_turn_rows", -1),
        ("window", 0),
        ("clip_eps", 0.0),
        ("clip_eps_high", -0.2),
    ],
)
def test_a_setting_that_cannot_work_is_refused_and_nothing_is_written(tmp_path, setting, value):
    with pytest.raises(ValueError, match=setting):
        Monitor(tmp_path, "run", **{setting: value})
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("setting", "value"), [("flush_interval_s", 0.0), ("flush_rows", 1.5), ("compact_parts", 1)]
)
def test_the_writer_refuses_them_too(tmp_path, setting, value):
    with pytest.raises(ValueError, match=setting):
        ParquetStreamWriter(tmp_path, **{setting: value})
