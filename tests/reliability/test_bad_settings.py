"""Settings that cannot work are refused when the monitor is built, before anything is written."""

from __future__ import annotations

import math

import pytest

from sorl_monitor import MetricsConfig, Monitor, WriterConfig
from sorl_monitor.write.writer import ParquetStreamWriter

SETTINGS = {
    WriterConfig: [
        ("flush_interval_s", 0),  # guards against a writer thread that busy-loops
        ("flush_interval_s", -1.0),
        ("flush_interval_s", math.nan),
        ("flush_interval_s", math.inf),
        ("flush_rows", 0),
        ("max_pending_rows", 0),
    ],
    MetricsConfig: [("max_turn_rows", -1), ("clip_eps", 0.0), ("clip_eps_high", -0.2)],
}
"""Settings that cannot work, by the config object that holds them."""


@pytest.mark.parametrize(
    ("config", "setting", "value"), [(config, *case) for config, cases in SETTINGS.items() for case in cases]
)
def test_a_config_setting_that_cannot_work_is_refused_before_a_monitor_writes_anything(
    config, setting, value
):
    with pytest.raises(ValueError, match=setting):
        config(**{setting: value})


def test_a_window_that_cannot_work_is_refused_and_nothing_is_written(tmp_path):
    with pytest.raises(ValueError, match="window"):
        Monitor(tmp_path, "run", window=0)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("setting", "value"), [("flush_interval_s", 0.0), ("flush_rows", 1.5), ("compact_parts", 1)]
)
def test_the_writer_refuses_them_too(tmp_path, setting, value):
    with pytest.raises(ValueError, match=setting):
        ParquetStreamWriter(tmp_path, **{setting: value})
