"""The guard's numpy screen computes the trip detectors' values as their SQL does, on REAL runs (the bundled
sample runs and corpus runs), and the guard decides the same with and without it."""

from __future__ import annotations

import math
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sorl_monitor.diagnose.detectors import ArrowDetector, DetectorConfig, get_detectors
from sorl_monitor.remedy import ctn_guard_screen as guard_screen
from sorl_monitor.remedy.ctn_guard import DEFAULT_TRIP_ON, CtnGuard
from sorl_monitor.remedy.ctn_guard_screen import FOLDS, SQL_CHECKED, GuardScreen, sql_fingerprint

ROOT = Path(__file__).resolve().parents[2]
RUNS = [
    ROOT / "sample_logs" / "token-ppo",  # token-level PPO, collapses
    ROOT / "sample_logs" / "so-ppo-auto-ctn",  # turn clip fraction, CTN guard in the loop
    ROOT / "experiments" / "corpus" / "ppo-r4x4-st0-lr1e-3-s1",  # reused rollouts: full blocks from step 0
    ROOT / "experiments" / "corpus" / "grpo-cold-t0.5-lr2e-3-s0",
]
WINDOW = 512


def steps_of(run: Path) -> pa.Table:
    parts = sorted((run / "steps").glob("rank=*/part-*.parquet"))
    if not parts:
        pytest.skip(f"{run} is not here")
    return pa.concat_tables([pq.read_table(p) for p in parts], promote_options="permissive").sort_by("step")


def windows(steps: pa.Table, every: int) -> list[tuple[pa.Table, int | None]]:
    """The guard's windows (the last ``WINDOW`` rows, ``after_step`` the row before the newest): each of the first
    64 rows (blocks still growing), then every ``every`` rows."""
    ends = [*range(1, min(steps.num_rows, 64)), *range(64, steps.num_rows + 1, every)]
    found = []
    for end in ends:
        window = steps.slice(max(0, end - WINDOW), min(end, WINDOW))
        found.append((window, window.column("step")[-2].as_py() if window.num_rows > 1 else None))
    return found


@pytest.mark.parametrize("run", RUNS, ids=lambda p: p.name)
def test_screen_values_are_the_sql_values_on_real_runs(run):
    config = DetectorConfig()
    names = tuple(FOLDS)
    screen = GuardScreen(config, names)
    # every value the SQL computes comes back as a firing when the warning levels are below any value
    sql = ArrowDetector(config.replace(**{f"{n}_warning": -1e300 for n in names}), get_detectors(names))
    compared = 0
    try:
        for window, after in windows(steps_of(run), every=41):
            expected = {
                (r["detector"], r["step"]): r["value"] for r in sql(window, after_step=after).to_pylist()
            }
            found = screen.values(window, after)
            assert found is not None
            got = {
                (n, s): v for n, rows in found.items() for s, v in rows if v is not None and not math.isnan(v)
            }
            assert got.keys() == expected.keys(), (window.column("step")[-1], got.keys() ^ expected.keys())
            for key, value in expected.items():
                assert got[key] == pytest.approx(value, rel=1e-12, abs=0), key
            compared += len(expected)
    finally:
        sql.close()
    assert compared > 200


@pytest.mark.slow
def test_guard_decides_the_same_with_and_without_the_screen_on_a_real_run():
    steps = steps_of(RUNS[0])
    # a short quiet spell, so CTN goes on and off in the run's first 400 updates
    plain, screened = CtnGuard(quiet_updates=16, screen=False), CtnGuard(quiet_updates=16)
    decisions = {id(plain): [], id(screened): []}
    for end in range(1, min(steps.num_rows, 400) + 1):
        window = steps.slice(max(0, end - WINDOW), min(end, WINDOW))
        for guard in (plain, screened):
            decisions[id(guard)].append(guard.update(window))
    assert decisions[id(plain)] == decisions[id(screened)]
    assert sum(d is not None for d in decisions[id(plain)]) >= 2


def test_screen_was_checked_against_the_detectors_sql_as_it_is():
    assert sql_fingerprint(tuple(FOLDS)) == SQL_CHECKED, (
        "the SQL of the guard's trip detectors changed: check that guard_screen still computes their values "
        "(this file's real-run test), then set guard_screen.SQL_CHECKED to sql_fingerprint(FOLDS)"
    )
    assert set(DEFAULT_TRIP_ON) <= set(FOLDS)


def test_screen_leaves_every_call_to_the_sql_when_the_sql_changed(monkeypatch):
    monkeypatch.setattr(guard_screen, "SQL_CHECKED", "something else")
    screen = GuardScreen(DetectorConfig(), tuple(FOLDS))
    assert not screen.active
    assert not screen.quiet(pa.table({"step": [0, 1], "clip_frac": [0.0, 0.0]}), 0)


def test_screen_leaves_a_window_of_several_ranks_to_the_sql_synthetic():
    window = pa.table({"step": [0, 0, 1, 1], "rank": [0, 1, 0, 1], "clip_frac": [0.01] * 4})
    screen = GuardScreen(DetectorConfig(), tuple(FOLDS))
    assert screen.values(window, 0) is None
    assert not screen.quiet(window, 0)


def test_screen_is_quiet_on_a_synthetic_flat_window_and_not_on_a_jump():
    screen = GuardScreen(DetectorConfig(), tuple(FOLDS))
    flat = pa.table({"step": list(range(100)), "clip_frac": [0.01] * 100})
    assert screen.quiet(flat, 98)
    jump = pa.table({"step": list(range(100)), "clip_frac": [0.01] * 99 + [0.5]})
    assert not screen.quiet(jump, 98)
