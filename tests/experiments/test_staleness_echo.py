"""experiments/staleness_echo.py: the dip arithmetic, on SYNTHETIC reward series."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "experiments" / "staleness_echo.py"
spec = importlib.util.spec_from_file_location("staleness_echo", SCRIPT)
staleness_echo = importlib.util.module_from_spec(spec)
spec.loader.exec_module(staleness_echo)


def test_a_dip_every_fifth_iteration_shows_there_and_nowhere_else():
    rewards = [0.5 - (0.2 if k % 5 == 0 else 0.0) for k in range(30)]  # SYNTHETIC: echo of period 5
    assert staleness_echo.dips(rewards, [5, 10]) == pytest.approx([-0.2, -0.2])
    assert staleness_echo.dips(rewards, [7]) == pytest.approx([0.05])  # a neighbour of 5 sees one dip
    assert staleness_echo.dips(rewards, [0, 1, 28, 29]) == []  # no four neighbours: not counted
